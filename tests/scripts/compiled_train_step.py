"""A training script in the torch.compile style of recent projects: the forward and backward in one
compiled function, the optimizer step compiled on its own (PyTorch's "compiling the optimizer" recipe),
and a compiled evaluation. With DIAG_TEST_DYNAMO_OUT set, it writes torch._dynamo's graph counters
there (tests/test_compiled_code.py compares them with and without the probe)."""
import json
import os

import torch
import torch._dynamo.utils as dynamo_utils
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
opt = torch.optim.Adam(model.parameters(), lr=torch.tensor(1e-3))
loader = DataLoader(TensorDataset(torch.randn(512, 32), torch.randint(0, 10, (512,))), batch_size=32)


@torch.compile(backend="eager")
def forward_backward(x, y):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss


@torch.compile(backend="eager")
def optimizer_step():
    opt.step()


@torch.no_grad()
@torch.compile(backend="eager")
def predict(x):
    return model(x).argmax(-1)


for epoch in range(2):
    model.train()
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        loss = forward_backward(x, y)
        optimizer_step()
    model.eval()
    correct = sum(int((predict(x) == y).sum()) for x, y in loader)
print(f"loss {loss.item():.3f} accuracy {correct / 512:.3f}")
out = os.environ.get("DIAG_TEST_DYNAMO_OUT")
if out:
    with open(out, "w") as f:
        json.dump({"unique_graphs": dynamo_utils.counters["stats"]["unique_graphs"],
                   "graph_breaks": dict(dynamo_utils.counters["graph_break"])}, f)
