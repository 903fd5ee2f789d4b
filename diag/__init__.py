"""diag: why is my PyTorch training slow, or out of memory, and what should I change.

The in-process API (``diag.watch``) is imported lazily so that ``import diag`` stays cheap and
never imports torch.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["watch", "__version__"]


def watch(**kwargs):
    """Install the probe in this process: ``with diag.watch() as run: train(model, loader)``.

    Returns a :class:`diag.watch.WatchedRun`; see its docstring.
    """
    from diag.inprocess import watch as _watch

    return _watch(**kwargs)
