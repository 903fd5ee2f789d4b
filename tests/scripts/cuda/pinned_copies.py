"""The twin of pageable_copies.py with pinned batches: the same copies, from pinned memory, with
non_blocking=True. dataloader.pin-memory must pass, and the device timeline must have timed the
copies as pinned (their GB/s beside the pageable twin's in figures.json)."""
import torch
from torch import nn

from cuda_common import DEV, loader, mlp

model = mlp(width=2048, depth=3).to(DEV)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for x, y in loader(batch=2048, workers=2, pin=True, n=2048 * 60):
    x, y = x.to(DEV, non_blocking=True), y.to(DEV, non_blocking=True)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
