"""A small GPT trained the way llm.c's train_gpt2.py does it: batches of B sequences of T tokens
cut from one token stream by a get_batch() helper (no DataLoader), gradient accumulation over
--accum micro-batches per optimizer step, and a validation loss every --val-every steps at the
*training* batch size (by design: B x T tokens per forward), under torch.no_grad(); a --compile flag
of its own (off by default).

GROUND TRUTH (the script prints its own counts on stderr as `CORPUS_TRUTH {...}`):
  steps            = --steps (8): each = --accum (2) forward+backward micro-batches + one AdamW step
  samples/step     = B x accum = 8 sequences (tokens/step = 8 x 32 = 256)
  evaluation       validation after steps 4 and 8, --val-steps (20) batches of B=4 each:
                   eval_forwards = 40, at the training batch size
  findings         clean: no warning, no error. eval.small-batch does not warn on this CPU run
                   (batch 4 x 32 tokens, every batch the same size: no per-batch fixed cost measured);
                   compile.unused names the script's own --compile flag when it reports
"""
import argparse
import math

import torch
from torch import nn
from torch.nn import functional as F

from _truth import report

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--accum", type=int, default=2)
p.add_argument("--val-every", type=int, default=4)
p.add_argument("--val-steps", type=int, default=20)
p.add_argument("--compile", action="store_true")
args = p.parse_args()

torch.manual_seed(0)
B, T, V, D = 4, 32, 64, 64
tokens = torch.randint(0, V, (20_000,))
train_tok, val_tok = tokens[:16_000], tokens[16_000:]


def get_batch(split, i):
    data = train_tok if split == "train" else val_tok
    off = (i * B * T) % (len(data) - B * T - 1)
    buf = data[off:off + B * T + 1]
    return buf[:-1].view(B, T), buf[1:].view(B, T)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        h = self.ln1(x)
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, D), nn.Embedding(T, D)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(D, V)

    def forward(self, idx, targets=None):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        logits = self.head(self.blocks(x))
        loss = F.cross_entropy(logits.view(-1, V), targets.view(-1)) if targets is not None else None
        return logits, loss


model = GPT()
if args.compile:
    model = torch.compile(model)
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
micro = val_forwards = 0
for step in range(1, args.steps + 1):
    opt.zero_grad(set_to_none=True)
    for _ in range(args.accum):
        x, y = get_batch("train", micro)
        micro += 1
        _, loss = model(x, y)
        (loss / args.accum).backward()
    opt.step()
    if step % args.val_every == 0:
        model.eval()
        with torch.no_grad():
            val = 0.0
            for i in range(args.val_steps):
                x, y = get_batch("val", i)
                val += model(x, y)[1].item()
                val_forwards += 1
        model.train()
        print(f"step {step} val loss {val / args.val_steps:.4f} ppl {math.exp(val / args.val_steps):.1f}", flush=True)
report(steps=args.steps, samples_per_step=B * args.accum, tokens_per_step=B * T * args.accum,
       eval_forwards=val_forwards)
