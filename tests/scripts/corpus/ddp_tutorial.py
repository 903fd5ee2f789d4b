"""The DDP tutorial's trainer (pytorch/examples distributed/ddp-tutorial-series multigpu_torchrun.py)
on CPU/gloo under torchrun: a Trainer class whose _run_epoch reads the batch size with
`b_sz = len(next(iter(self.train_data))[0])` (a DataLoader iterator started and dropped every epoch)
before iterating the DistributedSampler-fed loader; a toy regression dataset.

GROUND TRUTH (the script prints its own counts on stderr as `CORPUS_TRUTH {...}`):
  steps            = --epochs (3) x batches per rank (256 samples / 2 ranks / batch 32 = 4) = 12 per rank
  samples/step     = 32
  epochs           = 3 (not 6: the next(iter(...)) that reads the batch size starts no pass)
  phases           = data + forward + backward + optimizer + other + collective wait = step total
  findings         clean: no warning, no error (distributed.straggler tolerated: two ranks share 2
                   loaded cores)
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from _truth import report


class MyTrainDataset(Dataset):
    def __init__(self, size):
        g = torch.Generator().manual_seed(0)
        self.data = [(torch.rand(20, generator=g), torch.rand(1, generator=g)) for _ in range(size)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]


class Trainer:
    def __init__(self, model, train_data, optimizer):
        self.train_data = train_data
        self.optimizer = optimizer
        self.model = DDP(model)
        self.epochs_run = 0

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        loss = F.mse_loss(self.model(source), targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}", flush=True)
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            self._run_batch(source, targets)
        self.epochs_run += 1

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    dataset = MyTrainDataset(256)
    train_data = DataLoader(dataset, batch_size=args.batch_size, pin_memory=False, shuffle=False,
                            sampler=DistributedSampler(dataset))
    model = torch.nn.Linear(20, 1)
    trainer = Trainer(model, train_data, torch.optim.SGD(model.parameters(), lr=1e-3))
    trainer.train(args.epochs)
    report(steps=args.epochs * len(train_data), samples_per_step=args.batch_size, epochs=trainer.epochs_run,
           world_size=dist.get_world_size())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
