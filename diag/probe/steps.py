"""The probe's side of the step model's rules (docs/steps.md): what needs torch or the interpreter's
frames. The rules themselves (optimizer-step groups, closures, loader roles, evaluation passes and
steps) are the step machine's, :mod:`diag.probe.stepmachine`, which imports no torch; this module
holds:

- :func:`batch_samples`: how many samples a DataLoader batch holds;
- :func:`install_manual_update`: a loop without ``torch.optim`` (``p -= lr * p.grad`` under
  ``torch.no_grad()``): the ``no_grad`` block that follows the step's backward is its update, which
  the machine books as the optimizer phase and the step's end (``StepMachine.manual_update``);
- :func:`detect_framework`: at the first training activity, whether a known framework (transformers'
  Trainer, Lightning, accelerate) drives the loop, from the frames on the stack.
"""
from __future__ import annotations

import sys
import time

from diag.evidence import events as E
from diag.probe import tensors as _tensors
from diag.probe.frames import frame_location, user_frame
from diag.probe.hooks import DiagStop


def batch_samples(batch) -> int | None:
    """The number of samples in a batch a DataLoader delivered: collated batches stack samples at
    dim 0 of every tensor (a tensor, a tuple/list or dict of tensors, a dataclass); a plain list of
    non-tensors (strings, ids) is one sample per item."""
    try:
        first = batch[0] if type(batch) in (list, tuple) and batch else batch
        if type(first) is (_tensors._TENSOR or _tensors._tensor_cls()):   # the common case, per batch
            shape = first.shape
            if shape:
                return shape[0]
        t = _tensors.first_tensor(batch)
        if t is not None and t.dim() > 0:
            return int(t.shape[0])
        if isinstance(batch, list) and batch and not isinstance(batch[0], (list, tuple, dict)):
            return len(batch)
    except Exception:
        pass
    return None


def install_manual_update(probe, torch) -> None:
    """Patch ``torch.no_grad``'s enter and exit (undone by the probe's patches): a block that opens
    after a backward, outside any forward, fetch or backward, in a run without an optimizer, and runs
    no forward, is the step's update."""
    cls = torch.autograd.grad_mode.no_grad
    orig_enter, orig_exit = cls.__enter__, cls.__exit__
    sm = probe.steps
    state: list = [None]     # (the no_grad object, its start, training forwards so far)

    def __enter__(ng):
        out = orig_enter(ng)
        if state[0] is None and probe.active and not probe._forked:
            try:
                if (not probe.in_backward and not probe.depth and not probe._in_data
                        and sm.manual_update_may_begin()):
                    state[0] = (ng, time.perf_counter(), probe.forward_calls())
            except Exception as e:
                probe.report_error("no_grad.__enter__", e)
        return out

    def __exit__(ng, *exc):
        out = orig_exit(ng, *exc)
        rec = state[0]
        if rec is not None and rec[0] is ng:
            state[0] = None
            end = time.perf_counter()
            # a forward ran inside: evaluation under no_grad, not the update
            if not (exc and exc[0] is not None) and probe.forward_calls() == rec[2]:
                try:
                    sm.manual_update(rec[1], end)
                except DiagStop:
                    raise
                except Exception as e:
                    probe.report_error("no_grad.__exit__", e)
        return out

    __enter__.__wrapped__ = orig_enter
    __exit__.__wrapped__ = orig_exit
    probe.patch(cls, "__enter__", __enter__)
    probe.patch(cls, "__exit__", __exit__)


def detect_framework(probe) -> None:
    """Once, at the first training activity: is a known framework driving the loop? Its frames are
    on the stack (transformers' Trainer, Lightning's Trainer, accelerate). Emits a ``framework``
    event with the user's line that called into it."""
    found = None
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename.replace("\\", "/")
        for marker, name, package in _FRAMEWORKS:
            if marker in fn:
                found = (name, package)   # the outermost one wins (Trainer over accelerate)
                break
        f = f.f_back
    if found is None:
        return
    name, package = found
    version = None
    try:
        from importlib.metadata import version as _version

        version = _version(package)
    except Exception:
        pass
    probe.emit(E.FRAMEWORK, name=name, version=version, entry=frame_location(user_frame(2)))


# (a path fragment of the framework's own loop, its name in Evidence, its distribution)
_FRAMEWORKS = (
    ("/transformers/trainer", "transformers", "transformers"),
    ("/lightning/pytorch/", "lightning", "lightning"),
    ("/pytorch_lightning/", "lightning", "pytorch-lightning"),
    ("/accelerate/", "accelerate", "accelerate"),
)
