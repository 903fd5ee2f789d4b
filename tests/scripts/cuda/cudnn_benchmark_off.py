"""A conv net with fixed input shapes and cudnn.benchmark left off: cudnn.benchmark must fire."""
import torch
from torch import nn

DEV = "cuda"
torch.backends.cudnn.benchmark = False
model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
                      nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 10)).to(DEV)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
x = torch.randn(64, 3, 128, 128, device=DEV)
y = torch.randint(0, 10, (64,), device=DEV)
for step in range(40):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
