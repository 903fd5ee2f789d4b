"""Fix texts in the vocabulary of the framework that drives the training loop (docs/steps.md).

The probe records the framework it saw on the stack at the first training step
(``RankEvidence.framework``: transformers' Trainer, Lightning's Trainer, accelerate). A user of those
never constructs the DataLoader or DDP themselves: the knob they turn is an argument of the
framework's own object. :func:`framework_of` says which one; :func:`knob` gives (fix sentence,
snippet) for a knob in that vocabulary, or None when the plain-PyTorch text applies.
"""
from __future__ import annotations


def framework_of(ev) -> str | None:
    """transformers, lightning, accelerate or None (any rank that recorded one)."""
    for r in ev.ranks:
        fw = getattr(r, "framework", None)
        if fw is not None and fw.name:
            return fw.name
    return None


def framework_entry(ev) -> dict | None:
    """The user's line that called into the framework (trainer.train(), trainer.fit(...))."""
    for r in ev.ranks:
        fw = getattr(r, "framework", None)
        if fw is not None and fw.entry:
            return fw.entry
    return None


NAMES = {"transformers": "the Hugging Face Trainer", "lightning": "Lightning's Trainer",
         "accelerate": "accelerate"}


def knob(framework: str | None, what: str, **v) -> tuple[str, str] | None:
    """(fix, snippet) for ``what`` in ``framework``'s vocabulary; None for plain PyTorch."""
    if framework == "transformers":
        if what == "num_workers":
            return (f"The Trainer builds the DataLoader: set TrainingArguments(dataloader_num_workers={v['n']}"
                    + (", dataloader_pin_memory=True" if v.get("cuda") else "")
                    + (", dataloader_persistent_workers=True" if v['n'] > 0 else "") + ").",
                    f"args = TrainingArguments(..., dataloader_num_workers={v['n']}"
                    + (", dataloader_persistent_workers=True" if v['n'] > 0 else "") + ")")
        if what == "persistent_workers":
            return ("Set TrainingArguments(dataloader_persistent_workers=True).",
                    "args = TrainingArguments(..., dataloader_persistent_workers=True)")
        if what == "pin_memory":
            return ("Set TrainingArguments(dataloader_pin_memory=True) (the default).",
                    "args = TrainingArguments(..., dataloader_pin_memory=True)")
        if what == "find_unused_parameters":
            return ("The Trainer wraps the model in DDP: set TrainingArguments(ddp_find_unused_parameters=False) "
                    "(or leave it unset: the Trainer then decides from gradient checkpointing).",
                    "args = TrainingArguments(..., ddp_find_unused_parameters=False)")
        if what == "compile":
            return ("The Trainer compiles the model when asked: set TrainingArguments(torch_compile=True) on a "
                    "long run once the data pipeline keeps up; compare step times after the first (compiling) "
                    "steps.",
                    "args = TrainingArguments(..., torch_compile=True)   # torch_compile_mode=\"max-autotune\" for long runs")
        if what == "eval_batch_size":
            return (f"The Trainer builds the evaluation DataLoader: set TrainingArguments("
                    f"per_device_eval_batch_size={v['n']}) (or the largest that fits: `diag memory`).",
                    f"args = TrainingArguments(..., per_device_eval_batch_size={v['n']})")
        if what == "detect_anomaly":
            return ("Remove torch.autograd.set_detect_anomaly(True) / detect_anomaly() from the script "
                    "(TrainingArguments has no such switch: it is the script's own call).",
                    "torch.autograd.set_detect_anomaly(False)")
    if framework == "lightning":
        if what == "num_workers":
            return (f"Lightning iterates the DataLoader your LightningModule / LightningDataModule returns: "
                    f"build it with num_workers={v['n']}"
                    + (", persistent_workers=True" if v['n'] > 0 else "") + " in train_dataloader().",
                    "def train_dataloader(self):\n"
                    f"    return DataLoader(self.train_set, batch_size={v.get('batch_size') or '...'}, "
                    f"num_workers={v['n']}" + (", persistent_workers=True" if v['n'] > 0 else "") + ")")
        if what == "persistent_workers":
            return ("Return the DataLoader with persistent_workers=True from train_dataloader().",
                    "return DataLoader(..., num_workers=N, persistent_workers=True)")
        if what == "pin_memory":
            return ("Return the DataLoader with pin_memory=True from train_dataloader().",
                    "return DataLoader(..., pin_memory=True)")
        if what == "find_unused_parameters":
            return ("Use Trainer(strategy=\"ddp\") (find_unused_parameters=False is Lightning's default) "
                    "instead of strategy=\"ddp_find_unused_parameters_true\" or "
                    "DDPStrategy(find_unused_parameters=True).",
                    "trainer = L.Trainer(strategy=\"ddp\", ...)")
        if what == "eval_batch_size":
            return (f"Lightning iterates the DataLoader your val_dataloader() / test_dataloader() returns: build "
                    f"it with batch_size={v['n']} (or the largest that fits: `diag memory`).",
                    "def val_dataloader(self):\n"
                    f"    return DataLoader(self.val_set, batch_size={v['n']}, shuffle=False)")
        if what == "detect_anomaly":
            return ("Construct the Trainer with detect_anomaly=False (the default); turn it on only "
                    "while chasing a NaN.",
                    "trainer = L.Trainer(..., detect_anomaly=False)")
    if framework == "accelerate":
        if what == "find_unused_parameters":
            return ("accelerate wraps the model in DDP: pass DistributedDataParallelKwargs("
                    "find_unused_parameters=False) to Accelerator(kwargs_handlers=[...]).",
                    "from accelerate.utils import DistributedDataParallelKwargs\n"
                    "accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs("
                    "find_unused_parameters=False)])")
    return None
