"""diag's demo: a small classifier trained with planted performance problems.

Each problem is marked PLANTED; `diag demo` should report every one of them: the DataLoader starves
the model (dataloader.workers), anomaly detection is left on (debug.anomaly-detection), gradients are
zeroed instead of freed (optim.zero-grad), fp16 autocast runs without a GradScaler
(amp.fp16-without-scaler) and evaluation builds autograd graphs (eval.no-grad). The same script runs
on a GPU when there is one (then unpinned copies and per-step synchronisations show up too).

    python -m diag.demo.planted --epochs 2
"""
import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    """Each item costs `delay` seconds of "decoding", as JPEG decoding or tokenising would."""

    def __init__(self, n: int, dim: int, delay: float):
        self.n, self.dim, self.delay = n, dim, delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.delay)
        g = torch.Generator().manual_seed(i)
        x = torch.randn(self.dim, generator=g)
        return x, int(x[:8].sum() > 0)


class Classifier(nn.Module):
    def __init__(self, dim: int, hidden: int, classes: int = 2):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, classes))

    def forward(self, x):
        return self.net(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--items", type=int, default=640)
    ap.add_argument("--delay", type=float, default=0.002, help="seconds of decoding per item")
    args = ap.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = Classifier(256, 512).to(device)
    train = DataLoader(SlowDataset(args.items, 256, args.delay), batch_size=args.batch_size,
                       shuffle=True, num_workers=0)          # PLANTED: the main process decodes every batch
    val = DataLoader(SlowDataset(args.items // 4, 256, 0.0), batch_size=args.batch_size)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    torch.autograd.set_detect_anomaly(True)                 # PLANTED: a debugging aid left on

    for epoch in range(args.epochs):
        model.train()
        for x, y in train:
            x, y = x.to(device), y.to(device)
            opt.zero_grad(set_to_none=False)                # PLANTED: zeroes instead of freeing
            with torch.autocast(device, dtype=torch.float16):  # PLANTED: fp16 without a GradScaler
                loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        model.eval()
        correct = 0
        for x, y in val:                                    # PLANTED: evaluation without no_grad
            x, y = x.to(device), y.to(device)
            correct += (model(x).argmax(1) == y).sum().item()
        print(f"epoch {epoch}: loss {loss.item():.3f}, val accuracy {correct / len(val.dataset):.2%}")


if __name__ == "__main__":
    main()
