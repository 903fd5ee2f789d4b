"""Phase attribution from one stack sample of a training process's main thread.

A stack is a list of :class:`Frame` from the outermost (``<module>``) to the innermost. The phase of a
sample is decided by the *outermost* frame that belongs to a known phase: a ``Module._call_impl``
under ``Tensor.backward`` (activation checkpointing) is backward, the DataLoader's worker fetch under
the training loop is data, a collective inside ``Optimizer.step`` (ZeRO) is optimizer. Two
exceptions look at the innermost frames instead: a host-device synchronisation (``.item()``,
``.cpu()``, ``torch.cuda.synchronize``) is a C call made from a Python line, so it is recognised from
the innermost frame's line text; and checkpointing / logging calls are recognised wherever they sit.

The phase names are the step vocabulary of the probe (data, forward, backward, optimizer, other)
plus the ones only sampling can tell apart: evaluation, sync, collective, checkpoint, logging.

What a stack cannot show (documented in docs/attach.md): whether a ``with torch.no_grad():`` block is
active (evaluation inlined in the training loop counts as forward), the GPU kernels queued by a
forward (on CUDA the host returns before the GPU has finished: the time shows up at the next
synchronisation), and time spent in C++ threads (the autograd engine's worker threads, NCCL).

Pure Python, no torch.
"""
from __future__ import annotations

import linecache
import re
import sysconfig
from dataclasses import dataclass

from diag.evidence import phases as _ph

# phases that make up a training step (a cycle through them is "step-like"): the probe's, from the one
# definition (diag.evidence.phases)
TRAINING_PHASES = _ph.LOOP_NAMES
# those, then the ones only sampling tells apart, then the probe's "other"
PHASES = (*TRAINING_PHASES, "evaluation", "sync", "collective", "checkpoint", "logging", _ph.OTHER.name)


@dataclass(frozen=True)
class Frame:
    name: str           # function name as py-spy gives it (3.11+: the qualified name, e.g. "Module._call_impl")
    file: str           # full path ("" for py-spy's synthetic frames)
    line: int

    @property
    def short(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}"

    def to_dict(self) -> dict:
        return {"function": self.name, "file": self.file, "line": self.line}


def _paths() -> tuple[str, ...]:
    out = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            p = sysconfig.get_paths().get(key)
        except Exception:
            p = None
        if p:
            out.add(p.rstrip("/") + "/")
    return tuple(sorted(out))


_LIB_PATHS = _paths()
_LIB_MARKERS = ("/site-packages/", "/dist-packages/", "/lib/python3", "<frozen ", "<string>")


def is_user_frame(f: Frame) -> bool:
    """A frame in the user's own code: not in an installed package, not in the standard library,
    not one of py-spy's synthetic frames. (The target may run another interpreter than diag's, so
    this is judged from the path's shape, not only from this interpreter's paths.)"""
    if not f.file or f.file.startswith("<"):
        return False
    if any(m in f.file for m in _LIB_MARKERS):
        return False
    return not f.file.startswith(_LIB_PATHS)


def _in(f: Frame, *parts: str) -> bool:
    return any(p in f.file for p in parts)


_SYNC_LINE = re.compile(r"\.(item|cpu|tolist|numpy)\(\s*\)|\.to\(\s*['\"]cpu['\"]|cuda\.synchronize\(|"
                        r"\.synchronize\(\)|\.nonzero\(")
_EVAL_NAME = re.compile(r"(^|[._])(eval|evaluate|evaluation|validate|validation|valid|val|test|predict|"
                        r"inference|infer)($|[._])|evaluate|validat", re.IGNORECASE)
_LOG_MODULES = ("/logging/__init__.py", "/wandb/", "/tensorboard/", "/torch/utils/tensorboard/", "/mlflow/",
                "/tensorboardX/", "/comet_ml/", "/neptune/", "/clearml/", "/aim/sdk/")


def line_text(f: Frame) -> str:
    """The source line of a frame, read on diag's side (same machine; '' when not readable)."""
    if not f.file or f.line <= 0:
        return ""
    try:
        text = linecache.getline(f.file, f.line).strip()
    except Exception:
        return ""
    return _CTRL.sub("?", _strip_comment(text))[:200]


_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")     # from the user's file: never raw to a terminal


def _strip_comment(text: str) -> str:
    """The line without a trailing ``# comment`` (a ``#`` inside a string literal is kept)."""
    quote = None
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            return text[:i].rstrip()
    return text


def frame_phase(f: Frame) -> str | None:
    """The phase one frame belongs to by itself (None: neutral)."""
    file, name = f.file, f.name
    base = name.rsplit(".", 1)[-1]
    if "/torch/" in file:
        if "/torch/utils/data/dataloader.py" in file and base in ("__next__", "_next_data", "_get_data",
                                                                    "_try_get_data", "__iter__", "_reset"):
            return "data"
        if file.endswith("/torch/serialization.py") and base in ("save", "_save", "_legacy_save"):
            return "checkpoint"
        if "/torch/distributed/checkpoint/" in file:
            return "checkpoint"
        if file.endswith("/torch/_tensor.py") and base == "backward":
            return "backward"
        if "/torch/autograd/" in file and base in ("backward", "_engine_run_backward", "grad"):
            return "backward"
        if "/torch/optim/" in file and base not in ("__init__", "add_param_group", "load_state_dict",
                                                      "state_dict"):
            return "optimizer"
        if "/torch/amp/grad_scaler.py" in file and base in ("step", "unscale_", "update"):
            return "optimizer"
        if file.endswith("/torch/cuda/__init__.py") and base == "synchronize":
            return "sync"
        if "/torch/distributed/" in file and "/torch/distributed/run.py" not in file \
                and "/elastic/" not in file:
            return "collective"
        if "/torch/nn/modules/module.py" in file and base in ("_call_impl", "_wrapped_call_impl"):
            return "forward"
        if "/torch/utils/tensorboard/" in file:
            return "logging"
        return None
    if _in(f, *_LOG_MODULES):
        return "logging"
    return None


def classify(stack: list[Frame]) -> str:
    """The phase of one main-thread sample (stack outermost first)."""
    if not stack:
        return "other"
    # innermost evidence first: checkpoint and logging anywhere, a sync at the innermost user line
    for f in stack:
        ph = frame_phase(f)
        if ph in ("checkpoint", "logging"):
            return ph
    leaf = stack[-1]
    if is_user_frame(leaf) and _SYNC_LINE.search(line_text(leaf)):
        return "sync"
    # the outermost phase frame decides; a user function named like evaluation above it makes the
    # forward an evaluation forward
    eval_seen = False
    decorated_nograd = False
    for i, f in enumerate(stack):
        if is_user_frame(f):
            if _EVAL_NAME.search(f.name):
                eval_seen = True
            if decorated_nograd:
                eval_seen = True
            decorated_nograd = False
            continue
        if f.file.endswith("/torch/utils/_contextlib.py") and f.name.endswith("decorate_context"):
            decorated_nograd = True     # @torch.no_grad() / @torch.inference_mode() on the next frame
            continue
        ph = frame_phase(f)
        if ph is None:
            continue
        if eval_seen and ph in ("forward", "data", "sync", "collective", "other"):
            return "evaluation"
        return ph
    return "evaluation" if eval_seen else "other"


def user_line(stack: list[Frame]) -> Frame | None:
    """The innermost frame in the user's own code (None when the stack has none)."""
    for f in reversed(stack):
        if is_user_frame(f):
            return f
    return None
