"""A two-layer GCN trained full-graph, as pytorch/examples' gcn does: the whole graph (features,
normalised adjacency) is one batch, every epoch is one forward over all nodes, one masked loss, one
backward and one Adam step; the accuracy on the test mask under torch.no_grad() at the end.

GROUND TRUTH (the script prints its own counts on stderr as `CORPUS_TRUTH {...}`):
  steps            = --epochs (30): one step per epoch (the full graph is the batch)
  evaluation       one forward at the end, under no_grad, in eval mode
  findings         clean: no warning, no error (no DataLoader: dataloader.* skip; compile.unused does
                   not report a break-even beyond the 30 steps this run takes)
"""
import argparse

import torch
from torch import nn
from torch.nn import functional as F

from _truth import report

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=30)
args = p.parse_args()

torch.manual_seed(0)
N, F_IN, H, C = 600, 64, 32, 5
feats = torch.randn(N, F_IN)
labels = torch.randint(0, C, (N,))
adj = (torch.rand(N, N) < 0.01).float()
adj = ((adj + adj.t()) > 0).float() + torch.eye(N)
deg = adj.sum(1)
adj = adj / deg.sqrt().unsqueeze(1) / deg.sqrt().unsqueeze(0)
train_mask = torch.arange(N) < 400
test_mask = ~train_mask


class GCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = nn.Linear(F_IN, H), nn.Linear(H, C)
        self.drop = nn.Dropout(0.5)

    def forward(self, x, a):
        x = F.relu(a @ self.l1(x))
        return a @ self.l2(self.drop(x))


model = GCN()
opt = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
for epoch in range(args.epochs):
    model.train()
    opt.zero_grad()
    out = model(feats, adj)
    loss = F.cross_entropy(out[train_mask], labels[train_mask])
    loss.backward()
    opt.step()
model.eval()
with torch.no_grad():
    acc = (model(feats, adj).argmax(1)[test_mask] == labels[test_mask]).float().mean().item()
print(f"test accuracy {acc:.3f}", flush=True)
report(steps=args.epochs, eval_forwards=1)
