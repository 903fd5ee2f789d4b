"""torch.save of the model and optimizer every 5th step (batches already on the GPU, no per-step sync):
the GPU idles while the host serialises. The device timeline must attribute that idle to
checkpointing (gpu.idle's idle_causes.checkpoint), not to Python between steps."""
import os
import tempfile

import torch
from torch import nn

from cuda_common import DEV, mlp

model = mlp(width=2048, depth=3).to(DEV)          # ~12.5 M parameters: ~50 MB per save, ~150 MB with SGD momentum
opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
x = torch.randn(2048, 1024, device=DEV)
y = torch.randint(0, 1000, (2048,), device=DEV)
path = os.path.join(tempfile.mkdtemp(prefix="diag-twin-"), "ckpt.pt")
for step in range(1, 41):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step % 5 == 0:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, path)
os.remove(path)
