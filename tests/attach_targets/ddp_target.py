"""Two-rank DDP (gloo, CPU) training loop where rank 1 sleeps in its loop: the straggler.

    python -m torch.distributed.run --standalone --nproc-per-node 2 ddp_target.py PROGRESS_FILE
"""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
with open(f"{sys.argv[1]}.{rank}", "a", buffering=1) as out:
    step = 0
    while True:
        step += 1
        x, y = torch.randn(32, 64), torch.randn(32, 1)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if rank == 1:
            time.sleep(0.2)            # the slow rank: extra work every step
        out.write(f"{step} {time.time()}\n")
