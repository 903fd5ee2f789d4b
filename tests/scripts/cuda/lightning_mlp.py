"""The Lightning twin (issue 31): an MLP LightningModule, 300 steps on GPU-resident random data through
trainer.fit(), Trainer(precision="32-true") or "bf16-mixed" (TWIN_PRECISION=bf16). Expected: in fp32
amp.unused says Trainer(precision="bf16-mixed") and matmul.tf32 torch.set_float32_matmul_precision
(Lightning has no TF32 argument); in bf16 neither fires."""
import os

import lightning as L
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

BF16 = os.environ.get("TWIN_PRECISION") == "bf16"


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 4096), nn.ReLU(),
                                 nn.Linear(4096, 1000))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(300 * 512, 1024, generator=g), torch.randint(0, 1000, (300 * 512,), generator=g))
trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed" if BF16 else "32-true", max_steps=300,
                    logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Net(), DataLoader(data, batch_size=512, num_workers=2, pin_memory=True, persistent_workers=True))
