"""A character-level MLP in the style of karpathy's makemore (part 2, the Bengio et al. MLP): a block
of 3 characters embedded, one tanh hidden layer, trained on (context, next char) pairs built from a
list of names; a DataLoader whose worker count is the script's own --num-workers flag; the loss on the
dev split evaluated every --eval-every steps and once at the end under torch.no_grad().

GROUND TRUTH (the script prints its own counts on stderr as `CORPUS_TRUTH {...}`):
  steps            = --steps (40): one forward + backward + SGD step per batch of 32
  samples/step     = 32
  evaluation       passes after steps 20 and 40 and one at the end (3 passes), each over the dev
                   loader's 3 batches (up to 256 pairs each): eval_forwards = 9
  findings         clean: no warning, no error. dataloader.workers passes or (on a contended host)
                   an info that workers will not help; when it reports, it is located at the
                   --num-workers flag's add_argument line
"""
import argparse
import random

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from _truth import report

p = argparse.ArgumentParser()
p.add_argument("--num-workers", type=int, default=0)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--eval-every", type=int, default=20)
args = p.parse_args()

random.seed(0)
torch.manual_seed(0)
letters = "abcdefghijklmnopqrstuvwxyz"
words = ["".join(random.choice(letters) for _ in range(random.randint(3, 8))) for _ in range(600)]
stoi = {c: i + 1 for i, c in enumerate(letters)}
stoi["."] = 0
BLOCK = 3


def build(ws):
    X, Y = [], []
    for w in ws:
        ctx = [0] * BLOCK
        for ch in w + ".":
            X.append(ctx)
            Y.append(stoi[ch])
            ctx = ctx[1:] + [stoi[ch]]
    return torch.tensor(X), torch.tensor(Y)


Xtr, Ytr = build(words[:500])
Xdev, Ydev = build(words[500:])
Xdev, Ydev = Xdev[:1024], Ydev[:1024]
train_loader = DataLoader(TensorDataset(Xtr, Ytr), batch_size=32, shuffle=True, num_workers=args.num_workers)
dev_loader = DataLoader(TensorDataset(Xdev, Ydev), batch_size=256)


class MLP(nn.Module):
    def __init__(self, vocab=27, emb=10, hidden=200):
        super().__init__()
        self.C = nn.Embedding(vocab, emb)
        self.h = nn.Linear(BLOCK * emb, hidden)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x):
        return self.out(torch.tanh(self.h(self.C(x).view(x.shape[0], -1))))


model = MLP()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
evals = 0


@torch.no_grad()
def split_loss():
    global evals
    model.eval()
    losses = []
    for xb, yb in dev_loader:
        losses.append(F.cross_entropy(model(xb), yb).item())
        evals += 1
    model.train()
    return sum(losses) / len(losses)


step = 0
while step < args.steps:
    for xb, yb in train_loader:
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % args.eval_every == 0:
            split_loss()
        if step >= args.steps:
            break
print(f"final dev loss {split_loss():.4f}", flush=True)
report(steps=step, samples_per_step=32, eval_forwards=evals)
