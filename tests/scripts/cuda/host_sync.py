"""A host sync in the loop every step (.item() of the loss and a .cpu() of the logits):
sync.host-device must fire and locate them."""
import torch
from torch import nn

from cuda_common import DEV, mlp

model = mlp(width=2048, depth=3).to(DEV)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(512, 1024, device=DEV)
y = torch.randint(0, 1000, (512,), device=DEV)
total = 0.0
for step in range(60):
    out = model(x)
    loss = nn.functional.cross_entropy(out, y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    total += loss.item()
    acc = (out.argmax(1).cpu() == y.cpu()).float().mean()
