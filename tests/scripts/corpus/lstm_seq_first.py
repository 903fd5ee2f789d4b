"""A seq-first LSTM language model in the idiom of pytorch/examples' word_language_model
(nn.LSTM with batch_first=False: inputs are [seq, batch]); batches come from a DataLoader of
[batch, seq] windows and are transposed to [seq, batch] before the model, as seq-first code does.

GROUND TRUTH (the script prints its own counts on stderr as `CORPUS_TRUTH {...}`):
  steps            = --steps (6)
  samples/step     = 20 (the DataLoader's batch_size; the input tensor is [35, 20]: dim 0 is the
                     sequence, not the batch)
  tokens/step      = 20 x 35 = 700
  phases           = data + forward + backward + optimizer + other = step total
  findings         clean: no warning, no error
"""
import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from _truth import report

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
args = p.parse_args()

NTOKENS, BPTT, BATCH = 200, 35, 20


class RNNModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(NTOKENS, 32)
        self.rnn = nn.LSTM(32, 64, num_layers=1)          # batch_first=False: [seq, batch, feature]
        self.decoder = nn.Linear(64, NTOKENS)

    def forward(self, input):
        out, _ = self.rnn(self.encoder(input))
        return self.decoder(out)


torch.manual_seed(0)
stream = torch.randint(0, NTOKENS, (BATCH * args.steps, BPTT + 1))
loader = DataLoader(TensorDataset(stream[:, :-1], stream[:, 1:]), batch_size=BATCH, drop_last=True)
model = RNNModel()
optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
criterion = nn.CrossEntropyLoss()

steps = 0
model.train()
for data, targets in loader:
    data, targets = data.t().contiguous(), targets.t().contiguous()   # [seq, batch]
    optimizer.zero_grad()
    output = model(data)
    loss = criterion(output.view(-1, NTOKENS), targets.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
    optimizer.step()
    steps += 1

report(steps=steps, samples_per_step=BATCH, tokens_per_step=BATCH * BPTT)
