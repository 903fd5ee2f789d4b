"""fp32 matmul-bound training on a bf16-capable GPU, no autocast: amp.unused must fire."""
import torch
from torch import nn

from cuda_common import DEV, mlp

model = mlp(width=8192, depth=4).to(DEV)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(2048, 1024, device=DEV)
y = torch.randint(0, 1000, (2048,), device=DEV)
for step in range(60):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
