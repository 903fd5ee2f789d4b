"""A Hogwild loop in the idiom of pytorch/examples' mnist_hogwild: the model's parameters live in
shared memory, `torch.multiprocessing` children each train it with their own optimizer and
DataLoader; the parent only starts them and waits.

Variants: --start-method fork (the Linux default on Python < 3.14) or spawn.

GROUND TRUTH (the script prints its own counts on stderr as `CORPUS_TRUTH {...}`):
  processes        --procs (2) children train; the parent runs no training step
  steps            = --steps (6) per child, --procs x --steps in all (12)
  samples/step     = 16 (each child's DataLoader batch_size)
  findings         no error: the run trained (in child processes). A correct diag either follows the
                   children (their steps are seen: 12 steps) or says, as info, that training ran in
                   2 child processes; never run.no-steps as an error, and exit 0.
"""
import argparse

import torch
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from _truth import report


def train(rank, model, steps, done):
    torch.manual_seed(1 + rank)
    data = TensorDataset(torch.randn(16 * steps, 32), torch.randint(0, 4, (16 * steps,)))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)
    model.train()
    n = 0
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        n += 1
    done.put(n)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--start-method", choices=["fork", "spawn"], default="fork")
    args = p.parse_args()
    ctx = mp.get_context(args.start_method)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    model.share_memory()   # gradients are allocated lazily, per process
    done = ctx.SimpleQueue()
    processes = []
    for rank in range(args.procs):
        proc = ctx.Process(target=train, args=(rank, model, args.steps, done))
        proc.start()
        processes.append(proc)
    for proc in processes:
        proc.join()
    per_child = [done.get() for _ in processes]
    report(steps=sum(per_child), steps_per_child=per_child, samples_per_step=16, processes=args.procs,
           parent_steps=0)
