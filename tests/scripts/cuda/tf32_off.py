"""fp32 matmuls with TF32 off (torch's default for matmul) on an Ampere-or-newer GPU:
matmul.tf32 must fire."""
import torch
from torch import nn

from cuda_common import DEV, mlp

torch.backends.cuda.matmul.allow_tf32 = False
model = mlp(width=4096, depth=4).to(DEV)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(1024, 1024, device=DEV)
y = torch.randint(0, 1000, (1024,), device=DEV)
for step in range(40):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
