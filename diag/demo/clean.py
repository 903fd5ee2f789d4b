"""The clean twin of diag's demo: the same model and data, trained the way the tuning guide says.
`diag check` should find nothing at warning level or above in it (on a CPU).

    python -m diag.demo.clean --epochs 2
"""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(nn.Module):
    def __init__(self, dim: int, hidden: int, classes: int = 2):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


def make_data(n: int, dim: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    return TensorDataset(x, (x[:, :8].sum(1) > 0).long())   # decoded once, up front


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--items", type=int, default=640)
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    torch.manual_seed(0)
    model = Classifier(256, 512).to(device)
    train = DataLoader(make_data(args.items, 256, 0), batch_size=args.batch_size, shuffle=True,
                       pin_memory=cuda)
    val = DataLoader(make_data(args.items // 4, 256, 1), batch_size=args.batch_size * 4, pin_memory=cuda)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    amp_dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else None

    for epoch in range(args.epochs):
        model.train()
        for x, y in train:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad()
            with torch.autocast(device, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        model.eval()
        correct = torch.zeros((), device=device)
        with torch.inference_mode():
            for x, y in val:
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                correct += (model(x).argmax(1) == y).sum()
        print(f"epoch {epoch}: loss {loss.item():.3f}, val accuracy {correct.item() / len(val.dataset):.2%}")


if __name__ == "__main__":
    main()
