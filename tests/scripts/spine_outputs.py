"""Model outputs diag must see through: a dataclass (Output(loss=..., logits=...), as Hugging Face
style models return, called with keyword inputs), and a tuple whose first tensor the loss never uses."""
import dataclasses
import sys
from typing import Optional

import torch
import torch.nn as nn


@dataclasses.dataclass
class Output:
    loss: Optional[torch.Tensor] = None
    logits: Optional[torch.Tensor] = None


class TokenModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.head = nn.Linear(32, 100)

    def forward(self, input_ids=None, labels=None):
        logits = self.head(self.emb(input_ids))
        loss = None
        if labels is not None:
            loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return Output(loss=loss, logits=logits)


class AuxFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.aux = nn.Linear(16, 4)
        self.main = nn.Linear(16, 2)

    def forward(self, x):
        return self.aux(x), self.main(x)      # the loss below uses only the second


def main():
    torch.manual_seed(0)
    aux = "--aux-first" in sys.argv
    model = AuxFirst() if aux else TokenModel()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        opt.zero_grad()
        if aux:
            _, logits = model(torch.randn(8, 16))
            loss = logits.pow(2).mean()
        else:
            ids = torch.randint(0, 100, (4, 24))
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()


if __name__ == "__main__":
    main()
