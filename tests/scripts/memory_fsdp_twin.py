"""The sharded memory plan's measured twin (tests/test_memory_sharded.py, docs/memory.md).

    python memory_fsdp_twin.py [--steps N] [--batch B] [--out FILE]            one process, unsharded
    torchrun --nproc-per-node 2 memory_fsdp_twin.py --out FILE                  FSDP2 (fully_shard), gloo

One model, one AdamW: alone it trains the plain module (what ``diag memory`` replays); under torchrun
every block and the root are wrapped with ``torch.distributed.fsdp.fully_shard`` (FULL_SHARD) and each
rank writes, after its last step, the bytes it really holds: the local shards of the parameters
(``DTensor.to_local()``), of their gradients and of the optimizer state tensors, to
``FILE.rank<R>.json``. CPU, gloo.
"""
import argparse
import json
import os

import torch
import torch.distributed as dist
from torch import nn

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=2)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--width", type=int, default=256)
ap.add_argument("--blocks", type=int, default=4)
ap.add_argument("--out", default=None)
args = ap.parse_args()

world = int(os.environ.get("WORLD_SIZE", "1"))
torch.manual_seed(0)
torch.set_num_threads(1)


class Block(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.up = nn.Linear(h, 2 * h)
        self.down = nn.Linear(2 * h, h)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self, h, n):
        super().__init__()
        self.inp = nn.Linear(32, h)
        self.blocks = nn.ModuleList(Block(h) for _ in range(n))
        self.head = nn.Linear(h, 10)

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


model = Net(args.width, args.blocks)
if world > 1:
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    for b in model.blocks:
        fully_shard(b)
    fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(args.steps):
    x, y = torch.randn(args.batch, 32), torch.randint(0, 10, (args.batch,))
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    if step + 1 < args.steps:
        opt.zero_grad(set_to_none=True)


def local(t):
    t = t.to_local() if hasattr(t, "to_local") else t
    return t.numel() * t.element_size()


if args.out:
    rank = dist.get_rank() if world > 1 else 0
    held = {"rank": rank, "world": world,
            "parameters": sum(local(p) for p in model.parameters()),
            "gradients": sum(local(p.grad) for p in model.parameters() if p.grad is not None),
            "optimizer_state": sum(local(v) for s in opt.state.values() for v in s.values()
                                   if isinstance(v, torch.Tensor)),
            "param_elements": sum(p.numel() for p in model.parameters())}
    with open(f"{args.out}.rank{rank}.json", "w") as f:
        json.dump(held, f)
if world > 1:
    dist.barrier()
    dist.destroy_process_group()
print(f"done: {args.steps} steps on {world} rank(s)")
