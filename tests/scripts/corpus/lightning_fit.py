"""A tiny `lightning.Trainer` run in Lightning's documented idiom: a LightningModule with
training_step / validation_step / configure_optimizers, DataLoaders handed to trainer.fit().

Variants (script arguments):
  (none)            single process on the CPU, --steps 8, batch 16, validation every 4 training batches
                    (limit_val_batches 3) plus Lightning's default sanity check (2 val batches first)
  --plant           the planted twin: Trainer(detect_anomaly=True) (anomaly detection on for the run)
  --forward-ms 20   the network's forward also takes 20 ms (a sleep standing in for a heavier model),
                    so the closure's forward outweighs Lightning's own per-step work: a double count
                    of it shows on every step whatever the machine's load (the corpus tests use it
                    for the single-process runs)
  under torchrun    `diag check --nproc-per-node 2 --script lightning_fit.py -- --ddp`:
                    Trainer(strategy="ddp", devices=2) on gloo, each rank its DistributedSampler half

GROUND TRUTH (the script prints its own counts on stderr as `CORPUS_TRUTH {...}`):
  steps            = --steps (8): one optimizer step per training batch (automatic optimization;
                     Lightning calls optimizer.step(closure), the closure runs training_step's
                     forward and the backward INSIDE optimizer.step: those are forward/backward time,
                     only the rest is optimizer time)
  samples/step     = 16 (the DataLoader's batch_size; per rank under DDP)
  phases           = data + forward + backward + optimizer + other = step total, every step
  evaluation       sanity check 2 val batches + 2 validation runs (after training batches 4 and 8)
                   x 3 batches = 8 eval forwards under no_grad (Lightning's evaluation loop); they are
                   an evaluation phase, never part of a training step
  loaders          train_loader (batch 16, 0 workers) is the training loader; val_loader (batch 32,
                   0 workers, more samples) an evaluation loader
  findings         clean: no warning, no error. Lightning's own per-step work (hooks, closure,
                   logging) is framework overhead, not "batches built in the training loop".
                   --plant: exactly one warning, debug.anomaly-detection, whose fix speaks Lightning
                   (Trainer(detect_anomaly=False)) and points at this script's Trainer(...) line.
"""
import argparse
import os
import time

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from _truth import report

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--ddp", action="store_true")
p.add_argument("--plant", action="store_true")
p.add_argument("--forward-ms", type=float, default=0.0)
args = p.parse_args()


class Heavier(nn.Module):
    """Stands in for the rest of a bigger model: its forward takes --forward-ms."""

    def forward(self, x):
        if args.forward_ms:
            time.sleep(args.forward_ms / 1000)
        return x


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), Heavier(), nn.Linear(64, 4))
        self.train_batches = 0
        self.val_batches = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.train_batches += 1
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        self.val_batches += 1
        self.log("val_loss", loss)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
train = TensorDataset(torch.randn(512, 32), torch.randint(0, 4, (512,)))
val = TensorDataset(torch.randn(1024, 32), torch.randint(0, 4, (1024,)))
train_loader = DataLoader(train, batch_size=16, shuffle=True)
val_loader = DataLoader(val, batch_size=32)

model = Classifier()
trainer = L.Trainer(
    accelerator="cpu",
    devices=2 if args.ddp else 1,
    strategy="ddp" if args.ddp else "auto",
    max_steps=args.steps,
    val_check_interval=4,
    limit_val_batches=3,
    logger=False,
    enable_checkpointing=False,
    enable_progress_bar=False,
    enable_model_summary=False,
    detect_anomaly=args.plant,
)
trainer.fit(model, train_loader, val_loader)
report(steps=trainer.global_step, samples_per_step=16, training_step_calls=model.train_batches,
       eval_forwards=model.val_batches, world_size=int(os.environ.get("WORLD_SIZE", "1")))
