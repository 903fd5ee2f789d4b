"""Fine-tuning with the model in eval mode (BatchNorm statistics frozen), then a real evaluation
loop without no_grad at the line marked BAD-EVAL. The training forwards are not evaluations."""
import torch
from torch import nn

from spine_common import batches

model = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model.eval()                                   # freeze BatchNorm statistics while fine-tuning
for x, y in batches(6):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
val = nn.Sequential(nn.Linear(32, 2)).eval()
for x, _ in batches(2):
    val(x)                                     # BAD-EVAL
print("done")
