"""A character model trained for a few steps and then sampled from, as the GPT of a video lecture
does: after the training loop, generate() calls the model once per new token — forgetting
model.eval() and torch.no_grad() (dropout still active, every forward building a graph).

GROUND TRUTH (the script prints its own counts on stderr as `CORPUS_TRUTH {...}`):
  steps            = --steps (20), batch 16 sequences of 16 tokens
  generation       --new-tokens (60) forwards after the last step, in train mode with grad on
  findings         exactly one warning: inference.after-training at the generate() forward's line
                   ("planted: generation in train mode with grad"), 60 forwards; --fixed (eval mode
                   under torch.no_grad) is clean
"""
import argparse

import torch
from torch import nn
from torch.nn import functional as F

from _truth import report

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=20)
p.add_argument("--new-tokens", type=int, default=60)
p.add_argument("--fixed", action="store_true")
args = p.parse_args()

torch.manual_seed(0)
V, T, D = 32, 16, 64
data = torch.randint(0, V, (5000,))


class CharModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(V, D)
        self.rnn = nn.GRU(D, D, batch_first=True)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(D, V)

    def forward(self, idx):
        h, _ = self.rnn(self.emb(idx))
        return self.head(self.drop(h))


model = CharModel()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(args.steps):
    ix = torch.randint(0, len(data) - T - 1, (16,))
    x = torch.stack([data[i:i + T] for i in ix])
    y = torch.stack([data[i + 1:i + T + 1] for i in ix])
    loss = F.cross_entropy(model(x).view(-1, V), y.view(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def generate(idx, n):
    for _ in range(n):
        logits = model(idx[:, -T:])  # planted: generation in train mode with grad
        nxt = torch.multinomial(F.softmax(logits[:, -1], dim=-1), 1)
        idx = torch.cat([idx, nxt], dim=1)
    return idx


start = torch.zeros(1, 1, dtype=torch.long)
if args.fixed:
    model.eval()
    with torch.no_grad():
        out = generate(start, args.new_tokens)
else:
    out = generate(start, args.new_tokens)
print("".join(chr(97 + int(t) % 26) for t in out[0].tolist()), flush=True)
report(steps=args.steps, samples_per_step=16, generated=args.new_tokens)
