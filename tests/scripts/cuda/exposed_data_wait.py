"""Slow __getitem__, num_workers=0 and .item() every step: the GPU idles while the host loads each
batch. dataloader.workers must fire, with GPU-idle numbers (device clock)."""
import torch
from torch import nn

from cuda_common import DEV, loader, mlp

model = mlp(width=1024, depth=2).to(DEV)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for x, y in loader(batch=64, delay=0.0003, workers=0):
    x, y = x.to(DEV), y.to(DEV)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    print(f"loss {loss.item():.3f}")
