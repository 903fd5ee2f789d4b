"""A short clean run (issue 31): ~5 s of bf16, TF32-on, fused-optimizer training on GPU-resident data.
At the default --gpu-interval (1 s; the sampler takes 10 Hz for the first minute) it must give no
warning: on the H200 a clean 5-s GPT-2 run got gpu.low-utilization from 3 samples straddling start-up
and shutdown."""
import torch
from torch import nn

from cuda_common import DEV, mlp

torch.set_float32_matmul_precision("high")
model = mlp(width=4096, depth=4).to(DEV)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
x = torch.randn(4096, 1024, device=DEV)
y = torch.randint(0, 1000, (4096,), device=DEV)
for step in range(400):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
