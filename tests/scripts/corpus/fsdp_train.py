"""Sharded training on CPU/gloo under torchrun, in the style of PyTorch's FSDP tutorials: FSDP2
(`fully_shard` on each block, then on the root) or FSDP1 (`FullyShardedDataParallel` with an
`auto_wrap_policy` per block), an MLP of residual blocks, SGD, a fixed synthetic dataset split with
DistributedSampler.

Modes (all tiny, to run 2 or 4 ranks on 2 shared cores):
  healthy        --api fsdp2|fsdp1: 2 blocks of width 128, 16 samples of 1024 rows per rank and step;
                 compute-bound (8 collectives of ~130 KiB beside ~3 GFLOP per step).
  --slow-rank R  rank R's blocks take --slow-ms (150) longer in their forward (a slower device stand-in:
                 a sleep inside the block's forward); the other ranks wait for it in the next collective.
  --tiny-units   48 blocks of width 16, fully_shard / auto-wrap on every Linear, batch 8: ~100 small
                 all-gathers and reduce-scatters per step, each a few hundred bytes, and nothing to
                 compute between them.

GROUND TRUTH (the script prints its own counts on stderr as `CORPUS_TRUTH {...}`):
  steps         = --steps (12) per rank
  world_size    = torchrun's --nproc-per-node
  units         = the number of fully_shard calls (FSDP2) or FSDP instances (FSDP1) the script made
  gathers/step  = the all-gathers FSDP ran in the last step, as the script counted them itself
                  (a forward pre-hook on each unit), for comparison with what diag counts
  findings      healthy: no warning (distributed.straggler tolerated: ranks share 2 loaded cores)
                slow rank: distributed.straggler names rank R (forward); sharded.exposed-comm says
                  the other rank's wait is waiting for rank R (an info, no second warning)
                tiny units: sharded.exposed-comm warning, cause "too small units"
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from _truth import report
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Chunks(Dataset):
    """Samples of `rows` rows each (a sequence of token vectors), derived from one fixed base tensor."""

    def __init__(self, n, rows, width):
        g = torch.Generator().manual_seed(0)
        self.n = n
        self.x = torch.randn(rows, width, generator=g)
        self.y = torch.randn(rows, 1, generator=g)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        s = 1.0 + (i % 97) / 97
        return self.x * s, self.y * s


class Block(nn.Module):
    def __init__(self, width, slow_s=0.0):
        super().__init__()
        self.fc1 = nn.Linear(width, width)
        self.fc2 = nn.Linear(width, width)
        self.slow_s = slow_s

    def forward(self, x):
        if self.slow_s:
            time.sleep(self.slow_s)   # planted: this rank's blocks are slower
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, width, depth, slow_s=0.0):
        super().__init__()
        self.blocks = nn.ModuleList(Block(width, slow_s) for _ in range(depth))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def shard_fsdp2(model, tiny):
    from torch.distributed.fsdp import fully_shard

    units = 0
    if tiny:
        for m in model.modules():
            if isinstance(m, nn.Linear):
                fully_shard(m)
                units += 1
    else:
        for b in model.blocks:
            fully_shard(b)
            units += 1
    fully_shard(model)
    return model, units + 1


def shard_fsdp1(model, tiny):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    policy = ModuleWrapPolicy({nn.Linear} if tiny else {Block})
    wrapped = FSDP(model, auto_wrap_policy=policy, device_id=torch.device("cpu"))
    units = sum(1 for m in wrapped.modules() if isinstance(m, FSDP))
    return wrapped, units


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--api", choices=("fsdp2", "fsdp1"), default="fsdp2")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--slow-ms", type=float, default=150.0)
    p.add_argument("--tiny-units", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    # (width, blocks, samples per rank per step, rows per sample)
    width, depth, batch, rows = (16, 48, 8, 1) if args.tiny_units else (128, 2, 16, 1024)
    slow = args.slow_ms / 1e3 / depth if args.slow_rank == rank else 0.0
    model = Net(width, depth, slow)
    shard = shard_fsdp2 if args.api == "fsdp2" else shard_fsdp1
    model, units = shard(model, args.tiny_units)
    gathers = [0]

    def count(module, inputs):
        gathers[0] += 1

    if args.api == "fsdp2":
        from torch.distributed.fsdp import FSDPModule

        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.register_forward_pre_hook(count)
    data = Chunks(batch * world * args.steps, rows, width)
    loader = DataLoader(data, batch_size=batch, sampler=DistributedSampler(data, shuffle=False))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    steps = 0
    for x, y in loader:
        gathers[0] = 0
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        steps += 1
        if rank == 0 and steps % 4 == 0:
            print(f"step {steps} loss {loss.item():.6f}", flush=True)
    report(steps=steps, world_size=world, units=units, api=args.api,
           forward_units_last_step=gathers[0] if args.api == "fsdp2" else None)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
