"""Fix texts in the vocabulary of the framework that drives the training loop (docs/steps.md).

The probe records the framework it saw on the stack at the first training step
(``RankEvidence.framework``: transformers' Trainer, Lightning's Trainer, accelerate). A user of those
never constructs the DataLoader or DDP themselves: the knob they turn is an argument of the
framework's own object. The words live in one table, :mod:`diag.knobs` (through
``diag.checks.api.knob_words``); :func:`knob` is the checks' short way to it.
"""
from __future__ import annotations

from diag.checks.api import FRAMEWORK_NAMES, knob_words, run_framework


def framework_of(ev) -> str | None:
    """transformers, lightning, accelerate or None (any rank that recorded one)."""
    return run_framework(ev)


def framework_entry(ev) -> dict | None:
    """The user's line that called into the framework (trainer.train(), trainer.fit(...))."""
    for r in ev.ranks:
        fw = getattr(r, "framework", None)
        if fw is not None and fw.entry:
            return fw.entry
    return None


NAMES = {k: v for k, v in FRAMEWORK_NAMES.items() if k != "torch"}
NAMES["accelerate"] = "accelerate"

# the framework's own code path that runs the training loop (where a sync or a gap inside it happens)
LOOPS = {"transformers": "transformers' Trainer.train() loop (Trainer._inner_training_loop in transformers/trainer.py)",
         "lightning": "Lightning's fit loop (lightning/pytorch/loops/: the automatic optimization closure, "
                      "logging and the progress bar)",
         "accelerate": "accelerate's code called from that line"}


def words(ev, knob_id: str, **values) -> tuple[str, str | None, bool]:
    """(fix, snippet, lever) for ``knob_id`` in the words of the framework ``ev`` used."""
    return knob_words(knob_id, framework_of(ev), **values)


def spoken(ev, knob_id: str, **values) -> tuple[str, str | None]:
    fix, snippet, _ = words(ev, knob_id, **values)
    return fix, snippet


def knob(framework: str | None, what: str, **v) -> tuple[str, str] | None:
    """(fix, snippet) for ``what`` in ``framework``'s vocabulary; None for plain PyTorch (the check
    keeps its own, more detailed text)."""
    if framework not in ("transformers", "lightning", "accelerate"):
        return None
    v = {k: ("..." if x is None else x) for k, x in v.items()}
    ids = {"persistent_workers": "dataloader.persistent-workers", "pin_memory": "dataloader.pin-memory",
           "find_unused_parameters": "ddp.find-unused", "compile": "compile", "eval_batch_size": "eval.batch",
           "detect_anomaly": "debug.anomaly"}
    kid = ids.get(what)
    if kid is None:
        return None
    if framework == "accelerate" and what not in ("find_unused_parameters", "compile"):
        return None          # accelerate users build these themselves: the plain-PyTorch text applies
    fix, snippet, _ = knob_words(kid, framework, **v)
    return fix, snippet or ""
