"""A real CUDA OOM mid-run: batches grow until one does not fit. memory.oom must fire and the
replay must say which batch fits."""
import torch
from torch import nn

from cuda_common import DEV, mlp

model = mlp(width=8192, depth=4).to(DEV)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step, batch in enumerate([256, 256, 256, 256, 1 << 21]):   # the last one needs far more than the device has
    x = torch.randn(batch, 1024, device=DEV)
    y = torch.randint(0, 1000, (batch,), device=DEV)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
