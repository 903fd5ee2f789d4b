"""An evaluation pass every 10 steps without torch.no_grad(): eval.no-grad must fire."""
import torch
from torch import nn

from cuda_common import DEV, mlp

model = mlp(width=2048, depth=3).to(DEV)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(512, 1024, device=DEV)
y = torch.randint(0, 1000, (512,), device=DEV)
for step in range(40):
    model.train()
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step % 10 == 9:
        model.eval()
        for _ in range(5):
            val = model(torch.randn(1024, 1024, device=DEV))      # builds a graph nobody uses
