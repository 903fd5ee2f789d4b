"""The Hugging Face Trainer twin (issue 31): GPT-2 built from a config (6 layers x 512, no download),
200 steps on random tokens, fp32 or bf16 (TWIN_PRECISION=bf16). On the H200 the fp32 run was told to
wrap torch.autocast and predicted "up to 1.52x"; bf16 gained nothing (launch-bound). Expected now:
amp.unused/matmul.tf32 speak TrainingArguments (bf16=True, tf32=True) and do not promise a gain they
cannot predict; gpu.low-utilization and cudnn.benchmark (Conv1D is a linear layer) do not fire."""
import os
import shutil
import tempfile

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

BF16 = os.environ.get("TWIN_PRECISION") == "bf16"
SEQ, BATCH, STEPS = 512, 6, 200


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n):
        self.ids = torch.randint(0, 50257, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


model = GPT2LMHeadModel(GPT2Config(n_layer=6, n_embd=512, n_head=8, n_positions=SEQ))
out = tempfile.mkdtemp(prefix="twin-hf-")
args = TrainingArguments(output_dir=out, max_steps=STEPS, per_device_train_batch_size=BATCH, bf16=BF16,
                         logging_strategy="no", save_strategy="no", report_to="none", disable_tqdm=True, seed=0)
tr = Trainer(model=model, args=args, train_dataset=Tokens(STEPS * BATCH))
try:
    tr.train()
finally:
    shutil.rmtree(out, ignore_errors=True)
