"""GPU-bound steps (big matmuls) and a main-thread DataLoader whose per-batch host work is shorter
than the GPU's step, with no per-step sync: the host fetches the next batch while the GPU still
runs the last step (pinned memory, non_blocking copies: nothing synchronises), so the wait is hidden. dataloader.workers must pass (on the device clock)."""
import torch
from torch import nn

from cuda_common import DEV, loader, mlp

model = mlp(width=8192, depth=6).to(DEV)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for x, y in loader(batch=4096, delay=0.000002, workers=0, pin=True):
    x, y = x.to(DEV, non_blocking=True), y.to(DEV, non_blocking=True)   # pinned: truly asynchronous
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
