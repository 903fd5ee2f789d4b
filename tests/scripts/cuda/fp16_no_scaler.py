"""fp16 autocast without a GradScaler: amp.fp16-without-scaler must fire."""
import torch
from torch import nn

from cuda_common import DEV, mlp

model = mlp(width=2048, depth=3).to(DEV)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(512, 1024, device=DEV)
y = torch.randint(0, 1000, (512,), device=DEV)
for step in range(40):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
