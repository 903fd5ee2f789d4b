"""A tiny Hugging Face `transformers.Trainer` run: a 2-layer GPT-2 built from a config (no hub
download), trained on random token ids, in the Trainer's documented idiom (TrainingArguments +
Trainer(model, args, train_dataset, eval_dataset) + trainer.train()).

Variants (script arguments):
  (none)              --steps 6 --batch 4 --seq 32: no evaluation
  --eval              evaluation every 3 steps on a 32-sample eval set (per_device_eval_batch_size 8)
  --accum 2           gradient accumulation over 2 micro-batches per optimizer step
  under torchrun      `diag check --nproc-per-node 2 --script hf_trainer.py`: DDP on gloo, 2 ranks

GROUND TRUTH (what a correct `diag check` reports; the script prints its own counts on stderr as
`CORPUS_TRUTH {...}`):
  steps            = --steps (6): Trainer's global_step, one per optimizer step; gradient accumulation
                     does not add steps (6 steps of 2 micro-batches with --accum 2)
  samples/step     = --batch x --accum (4, or 8 with --accum 2), per rank under torchrun
  tokens/step      = samples/step x --seq (128, or 256)
  micro-batches    = --accum forwards + backwards per step
  phases           = data + forward + backward + optimizer + other = step total, every step
  evaluation       --eval: 2 evaluations (after steps 3 and 6) x 4 batches = 8 eval forwards, all
                     under torch.no_grad (the Trainer's prediction_step); they belong to an
                     evaluation phase, never to a training step
  training loader  the Trainer's train DataLoader (batch_size 4, num_workers 0); with --eval the eval
                     DataLoader (batch_size 8) is an evaluation loader
  findings         single process: no warning, no error (clean).
                   torchrun: exactly one warning, ddp.find-unused-parameters: the Trainer wraps the
                   model in DDP with find_unused_parameters=True by default (GPT-2 uses every
                   parameter); the fix is TrainingArguments(ddp_find_unused_parameters=False), located
                   at the user's `Trainer(...)`/`trainer.train()` line, not in transformers/trainer.py.
"""
import argparse
import os
import shutil
import tempfile

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments)

from _truth import report

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=32)
p.add_argument("--accum", type=int, default=1)
p.add_argument("--eval", action="store_true")
args = p.parse_args()

VOCAB = 128


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, args.seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Count(TrainerCallback):
    evaluations = 0

    def on_evaluate(self, a, state, control, **kw):
        Count.evaluations += 1


torch.manual_seed(0)
config = GPT2Config(vocab_size=VOCAB, n_positions=args.seq, n_embd=32, n_layer=2, n_head=2)
model = GPT2LMHeadModel(config)

out = tempfile.mkdtemp(prefix="corpus-hf-")
training_args = TrainingArguments(
    output_dir=out,
    max_steps=args.steps,
    per_device_train_batch_size=args.batch,
    per_device_eval_batch_size=8,
    gradient_accumulation_steps=args.accum,
    learning_rate=1e-3,
    eval_strategy="steps" if args.eval else "no",
    eval_steps=3,
    logging_strategy="no",
    save_strategy="no",
    report_to="none",
    use_cpu=True,
    disable_tqdm=True,
    seed=0,
)
trainer = Trainer(
    model=model,
    args=training_args,
    train_dataset=RandomTokens(args.steps * args.batch * args.accum * 2, 1),
    eval_dataset=RandomTokens(32, 2) if args.eval else None,
    callbacks=[Count()],
)
try:
    trainer.train()
finally:
    shutil.rmtree(out, ignore_errors=True)
report(steps=trainer.state.global_step, samples_per_step=args.batch * args.accum,
       tokens_per_step=args.batch * args.accum * args.seq, micro_batches=args.accum,
       evaluations=Count.evaluations, eval_forwards=Count.evaluations * 4,
       world_size=int(os.environ.get("WORLD_SIZE", "1")))
