"""An evaluation pass every 10 steps over a slow main-thread loader with .item() per batch, between
GPU-bound training steps whose own data wait is hidden (pinned, non_blocking, workers). The GPU idles
in the pass's fetches: the device timeline must attribute that idle to evaluation (gpu.idle's
idle_causes.eval), and dataloader.workers must pass (the evaluation loader's waits are not the
training data wait)."""
import torch
from torch import nn

from cuda_common import DEV, loader, mlp

model = mlp(width=4096, depth=6).to(DEV)          # ~8 ms a step in fp32 on an H200: GPU-bound
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
val = loader(batch=256, delay=0.0001, workers=0, n=256 * 4)
for step, (x, y) in enumerate(loader(batch=1024, workers=6, pin=True, n=1024 * 60), 1):
    x, y = x.to(DEV, non_blocking=True), y.to(DEV, non_blocking=True)
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    if step % 10 == 0:
        model.eval()
        with torch.no_grad():
            correct = 0
            for vx, vy in val:
                vx, vy = vx.to(DEV), vy.to(DEV)
                correct += (model(vx).argmax(1) == vy).sum().item()
        model.train()
