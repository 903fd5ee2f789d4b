"""Trains 2 steps at batch 16, then the third forward raises the out-of-memory error a CUDA
device would (raised for real, with the message format of torch's CUDA caching allocator)."""
import torch
from torch import nn

from spine_common import batches, tiny_model

MSG = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of "
       "which 1.05 GiB is free. Including non-PyTorch memory, this process has 78.09 GiB memory in use. "
       "Of the allocated memory 75.20 GiB is allocated by PyTorch, and 2.30 GiB is reserved by PyTorch "
       "but unallocated.")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = tiny_model()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 3:
            raise torch.OutOfMemoryError(MSG)
        return self.body(x)


model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in batches(5):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
