"""A two-optimizer GAN loop in the idiom of pytorch/examples' dcgan (small MLPs instead of convs):
per batch, the discriminator is stepped (real + fake), then the generator.

GROUND TRUTH (the script prints its own counts on stderr as `CORPUS_TRUTH {...}`):
  steps            = --steps (8) iterations: one batch feeds both optimizers, so optimizerD.step() and
                     optimizerG.step() together are ONE step (an optimizer-step group)
  samples/step     = 32 (the DataLoader's batch_size; the noise batch is the same size)
  data             one DataLoader batch per step: the step's data wait is that one fetch
  phases           = data + forward + backward + optimizer + other = step total
  findings         clean: no warning, no error.
                   --plant: exactly one warning, optim.zero-grad (netD.zero_grad / optimizerD/G
                   zero_grad(set_to_none=False) keeps zeroed gradient tensors), at this file
"""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from _truth import report

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--plant", action="store_true")
args = p.parse_args()

torch.manual_seed(0)
NZ, DIM, BATCH = 16, 64, 32
data = TensorDataset(torch.randn(BATCH * args.steps, DIM))
loader = DataLoader(data, batch_size=BATCH, shuffle=True, drop_last=True)

netG = nn.Sequential(nn.Linear(NZ, 128), nn.ReLU(), nn.Linear(128, DIM), nn.Tanh())
netD = nn.Sequential(nn.Linear(DIM, 128), nn.LeakyReLU(0.2), nn.Linear(128, 1))
criterion = nn.BCEWithLogitsLoss()
optimizerD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizerG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
set_to_none = not args.plant

iterations = 0
for (real,) in loader:
    b = real.size(0)
    # (1) update D: maximize log(D(x)) + log(1 - D(G(z)))
    optimizerD.zero_grad(set_to_none=set_to_none)
    errD_real = criterion(netD(real), torch.ones(b, 1))
    errD_real.backward()
    noise = torch.randn(b, NZ)
    fake = netG(noise)
    errD_fake = criterion(netD(fake.detach()), torch.zeros(b, 1))
    errD_fake.backward()
    optimizerD.step()
    # (2) update G: maximize log(D(G(z)))
    optimizerG.zero_grad(set_to_none=set_to_none)
    errG = criterion(netD(fake), torch.ones(b, 1))
    errG.backward()
    optimizerG.step()
    iterations += 1

report(steps=iterations, samples_per_step=BATCH, optimizer_steps_per_iteration=2)
