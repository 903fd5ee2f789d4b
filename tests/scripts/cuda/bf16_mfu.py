"""A bf16 matmul-bound workload for cost.mfu against the catalogue peak (H200 dense bf16 ~989 TFLOP/s)."""
import torch
from torch import nn

DEV = "cuda"
D = 8192
model = nn.Sequential(*[nn.Linear(D, D, bias=False) for _ in range(8)]).to(DEV)
opt = torch.optim.SGD(model.parameters(), lr=1e-4)
x = torch.randn(8192, D, device=DEV)
for step in range(40):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
