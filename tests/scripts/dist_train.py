"""A tiny DDP training job for diag's distributed tests (CPU, gloo). Launch with torchrun.

    torchrun --nproc-per-node 2 dist_train.py [--steps N] [--item-ms MS]
             [--slow-rank R --slow-factor F] [--crash-rank R --crash-step S]
             [--accumulate K] [--hold-mb-rank R --hold-mb MB] [--workers W] [--pid-dir DIR]

Each rank reads its shard through a DataLoader whose dataset sleeps ``item-ms`` per item (the
slow rank sleeps ``slow-factor`` times longer: a planted straggler in the input pipeline).
"""
import argparse
import contextlib
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--item-ms", type=float, default=1.0)
ap.add_argument("--slow-rank", type=int, default=-1)
ap.add_argument("--slow-factor", type=float, default=5.0)
ap.add_argument("--crash-rank", type=int, default=-1)
ap.add_argument("--crash-step", type=int, default=3)
ap.add_argument("--accumulate", type=int, default=1)
ap.add_argument("--hold-mb-rank", type=int, default=-1)
ap.add_argument("--hold-mb", type=int, default=0)
ap.add_argument("--workers", type=int, default=0)
ap.add_argument("--pid-dir", default=None, help="write each rank's and DataLoader worker's pid here")
args = ap.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)


class Sleepy(Dataset):
    def __init__(self, n, delay_s):
        self.n = n
        self.delay_s = delay_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay_s)
        return torch.randn(32), torch.randn(1)


delay = args.item_ms / 1000.0 * (args.slow_factor if rank == args.slow_rank else 1.0)
ds = Sleepy(args.batch * args.steps * args.accumulate * dist.get_world_size(), delay)


def note_pid(*_):
    if args.pid_dir:
        open(os.path.join(args.pid_dir, f"pid-{os.getpid()}"), "w").close()


note_pid()
loader = DataLoader(ds, batch_size=args.batch, sampler=DistributedSampler(ds, shuffle=False),
                    num_workers=args.workers, worker_init_fn=note_pid)
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
held = None
if rank == args.hold_mb_rank and args.hold_mb:
    held = torch.ones(args.hold_mb * 262144)  # float32: 4 bytes each

for i, (x, y) in enumerate(loader):
    if rank == args.crash_rank and i + 1 == args.crash_step:
        raise ValueError(f"planted failure on rank {rank} at step {i + 1}")
    last = (i + 1) % args.accumulate == 0
    ctx = contextlib.nullcontext() if last else model.no_sync()
    with ctx:
        loss = torch.nn.functional.mse_loss(model(x), y) / args.accumulate
        loss.backward()
    if last:
        opt.step()
        opt.zero_grad()

dist.barrier()
dist.destroy_process_group()
if rank == 0:
    print(f"done: {args.steps} steps on {dist.get_world_size() if dist.is_initialized() else os.environ.get('WORLD_SIZE')} ranks")
