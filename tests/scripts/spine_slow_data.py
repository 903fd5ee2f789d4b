"""Data loaded by a slow Dataset with num_workers from argv[1] (default 0); 2 ms per item."""
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from spine_common import tiny_model


class Slow(Dataset):
    def __len__(self):
        return 320

    def __getitem__(self, i):
        time.sleep(0.002)
        x = torch.randn(32)
        return x, int(x[0] > 0)


model = tiny_model()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
workers = int(sys.argv[1]) if len(sys.argv) > 1 else 0
for x, y in DataLoader(Slow(), batch_size=16, num_workers=workers):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
