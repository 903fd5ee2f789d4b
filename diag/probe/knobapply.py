"""``diag try``'s knobs, applied inside the user's process, without editing the script.

A probe extension, loaded only when ``DIAG_TRY_KNOBS`` is set (:mod:`diag.probe.extensions`); torch
is imported lazily, in ``install``. It does three things:

* **applies knobs** (ids of :mod:`diag.knobs`): the *restart* knobs for the whole run, when the
  object they set is built (``DataLoader.__init__``'s keywords: ``num_workers``, ``pin_memory``,
  ``persistent_workers``; a ``torch.optim`` optimizer built ``fused=True``; ``Module.compile()`` on
  the outermost model after its first forward), and the *switch* knobs either for the whole run or in
  alternating blocks of steps (``DIAG_TRY_ARMS``): bf16 autocast entered at the outermost training
  forward and left before the backward (so the loss is computed under it), TF32 and
  ``cudnn.benchmark`` flags, ``zero_grad(set_to_none=True)``, anomaly detection off during the step;
* **tags each step** with its arm: ``step["extra"]["try"]`` is the arm's name (``"base"``, a knob
  id, ``"a+b"``, or ``"warmup"``) and ``step["extra"]["try_block"]`` the block's number;
* **records the loss**: the scalar each ``torch.autograd.backward`` is called on, summed over the
  step, read back in batches (one host read every block or every 16 steps) and sent as
  ``extras.try_losses`` (lists of ``[step, loss]``), so that diag can judge NaN/inf and a departed
  loss curve.

What it applied, and why a knob could not be, goes to ``extras.try`` (``{knob: {"applied": n,
"not_applicable": reason or None, "notes": [...]}}``) at the end of the run. Every patch goes through
:class:`diag.probe.hooks.Patches` and is undone at uninstall; nothing is done in forked children
(DataLoader workers).

Environment:

``DIAG_TRY_KNOBS``   comma-separated knob specs applied for the whole run (``dataloader.workers=2,
                     optim.fused``); set but empty: record the losses only (a baseline run).
``DIAG_TRY_ARMS``    ``;``-separated arms alternated in blocks of steps; an arm is ``base`` or switch
                     knobs joined by ``+`` (``base;amp.bf16;debug.anomaly``).
``DIAG_TRY_BLOCK``   steps per block (default 5).
``DIAG_TRY_WARMUP``  steps before the first block, every switch knob off (default 3).
"""
from __future__ import annotations

import inspect
import os

from diag.evidence import events as E

ENV_KNOBS = "DIAG_TRY_KNOBS"
ENV_ARMS = "DIAG_TRY_ARMS"
ENV_BLOCK = "DIAG_TRY_BLOCK"
ENV_WARMUP = "DIAG_TRY_WARMUP"

SWITCH = ("amp.bf16", "matmul.tf32", "cudnn.benchmark", "optim.set-to-none", "debug.anomaly")
RESTART = ("dataloader.workers", "dataloader.pin-memory", "dataloader.persistent-workers", "optim.fused", "compile")
LOSS_FLUSH_STEPS = 16


def parse_specs(text: str) -> dict[str, int | None]:
    """``"a,b=2"`` -> ``{"a": None, "b": 2}`` (diag's side validated the ids before the run)."""
    out: dict[str, int | None] = {}
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        kid, eq, val = part.partition("=")
        try:
            out[kid.strip()] = int(val) if eq else None
        except ValueError:
            out[kid.strip()] = None
    return out


def parse_arms(text: str) -> list[tuple[str, frozenset]]:
    """``"base;amp.bf16;a+b"`` -> ``[("base", {}), ("amp.bf16", {"amp.bf16"}), ("a+b", {"a", "b"})]``."""
    arms = []
    for part in (text or "").split(";"):
        part = part.strip()
        if not part:
            continue
        ks = frozenset() if part == "base" else frozenset(k.strip() for k in part.split("+") if k.strip())
        arms.append((part, ks))
    return arms


class Schedule:
    """Which arm a step belongs to: ``warmup`` steps first (every switch knob off), then the arms in
    turn, ``block`` steps each. Without arms every step is ``"run"`` (the fixed knobs only)."""

    def __init__(self, arms: list[tuple[str, frozenset]], block: int = 5, warmup: int = 3):
        self.arms = arms
        self.block = max(1, int(block))
        self.warmup = max(0, int(warmup))

    def at(self, index: int) -> tuple[str, int, frozenset]:
        """(arm name, block number, switch knobs on) for 1-based step ``index``."""
        if not self.arms:
            return "run", 0, frozenset()
        if index <= self.warmup:
            return "warmup", -1, frozenset()
        blk = (index - self.warmup - 1) // self.block
        name, ks = self.arms[blk % len(self.arms)]
        return name, blk, ks


class KnobApply:
    """The extension (see the module's docstring)."""

    def __init__(self, env: dict | None = None):
        env = os.environ if env is None else env
        self.fixed = parse_specs(env.get(ENV_KNOBS, ""))
        try:
            block = int(env.get(ENV_BLOCK) or 5)
            warmup = int(env.get(ENV_WARMUP) or 3)
        except ValueError:
            block, warmup = 5, 3
        self.schedule = Schedule(parse_arms(env.get(ENV_ARMS, "")), block, warmup)
        in_arms = set().union(*[ks for _, ks in self.schedule.arms]) if self.schedule.arms else set()
        self.knobs = dict(self.fixed)
        for k in in_arms:
            self.knobs.setdefault(k, None)
        self.status: dict[str, dict] = {k: {"applied": 0, "not_applicable": None, "notes": []} for k in self.knobs}
        self.torch = None
        self.patches = None
        self._on: frozenset = frozenset()       # switch knobs on for the step in progress
        self._arm = ("run", 0)
        self._autocast = None                   # our autocast context while it is entered
        self._autocast_until = "backward"
        self._step_loss = None
        self._pending: list = []
        self._saved: dict = {}
        self._compiled = False
        self._compiling = lambda: False
        self._flushed_at = 0
        self._seen = {"loaders": 0, "optimizers": 0, "zero_grad_false": 0, "zero_grad": 0, "anomaly": 0,
                      "train_forwards": 0, "models": 0, "conv": False}
        self._emitted: set = set()

    # ---- bookkeeping ---------------------------------------------------------------------------------
    def _applied(self, ctx, kid: str, note: str | None = None) -> None:
        st = self.status.get(kid)
        if st is None:
            return
        st["applied"] += 1
        if note and note not in st["notes"] and len(st["notes"]) < 5:
            st["notes"].append(note)
        if kid not in self._emitted:      # the first application is sent at once (a run that dies keeps it)
            self._emitted.add(kid)
            self._emit_status(ctx)

    def _na(self, kid: str, reason: str) -> None:
        st = self.status.get(kid)
        if st is not None and st["not_applicable"] is None:
            st["not_applicable"] = reason

    def _note(self, kid: str, note: str) -> None:
        st = self.status.get(kid)
        if st is not None and note not in st["notes"] and len(st["notes"]) < 5:
            st["notes"].append(note)

    def _emit_status(self, ctx) -> None:
        try:
            ctx.emit(E.SET, path="extras.try", value={"knobs": self.status, "arms":
                                                        [n for n, _ in self.schedule.arms],
                                                        "block": self.schedule.block,
                                                        "warmup": self.schedule.warmup})
        except Exception as e:
            ctx.report_error("knobapply.status", e)

    def _active(self, kid: str) -> bool:
        return kid in self.fixed or kid in self._on

    # ---- install -------------------------------------------------------------------------------------
    def install(self, ctx) -> None:
        import torch

        from diag.probe.hooks import Patches, compiling_check

        self.torch = torch
        self.patches = Patches()
        self._compiling = compiling_check()
        for name in (ENV_KNOBS, ENV_ARMS, ENV_BLOCK, ENV_WARMUP):   # the script sees its own environment
            os.environ.pop(name, None)
        cuda = bool(torch.cuda.is_available())
        for kid in list(self.knobs):
            if kid not in SWITCH and kid not in RESTART:
                self._na(kid, "diag cannot apply it from outside the script")
        if "matmul.tf32" in self.knobs:
            if not cuda:
                self._na("matmul.tf32", "no CUDA GPU: TF32 is a tensor-core mode of Ampere-or-newer GPUs")
            elif torch.cuda.get_device_capability(0) < (8, 0):
                self._na("matmul.tf32", "the GPU predates Ampere (compute capability < 8.0): no TF32")
        if "cudnn.benchmark" in self.knobs and not cuda:
            self._na("cudnn.benchmark", "no CUDA GPU: cudnn.benchmark tunes cuDNN convolutions on a GPU")
        if "dataloader.pin-memory" in self.knobs and not cuda:
            self._na("dataloader.pin-memory", "no CUDA GPU: pinned memory only speeds copies to a GPU")
        if "amp.bf16" in self.knobs and cuda:
            try:
                if not torch.cuda.is_bf16_supported():
                    self._na("amp.bf16", "this GPU has no bf16 support")
            except Exception:
                pass
        if any(k in self.knobs for k in ("dataloader.workers", "dataloader.pin-memory", "dataloader.persistent-workers")):
            self._patch_dataloader(ctx)
        if "optim.fused" in self.knobs:
            self._patch_optimizers(ctx)
        if "optim.set-to-none" in self.knobs:
            self._patch_zero_grad(ctx)
        self._patch_backward(ctx)
        if not self.schedule.arms:     # fixed knobs: the flags hold from the start
            self._set_flags(ctx, frozenset(k for k in self.fixed if k in SWITCH))
        self._emit_status(ctx)

    def uninstall(self, ctx) -> None:
        self._leave_autocast()
        try:
            self._set_flags(ctx, frozenset())
        except Exception:
            pass
        if self.patches is not None:
            self.patches.undo()

    # ---- DataLoader keywords -------------------------------------------------------------------------
    def _patch_dataloader(self, ctx) -> None:
        from torch.utils.data import DataLoader, IterableDataset

        orig = DataLoader.__dict__["__init__"]
        sig = inspect.signature(orig)
        ext = self

        def __init__(loader, *args, **kwargs):
            try:
                if ctx.is_live():
                    bound = sig.bind(loader, *args, **kwargs)
                    ext._loader_keywords(ctx, bound.arguments, IterableDataset)
                    args, kwargs = tuple(bound.args[1:]), dict(bound.kwargs)
            except Exception as e:
                ctx.report_error("knobapply.DataLoader", e)
            return orig(loader, *args, **kwargs)

        __init__.__wrapped__ = orig
        self.patches.patch(DataLoader, "__init__", __init__)

    def _loader_keywords(self, ctx, a: dict, iterable_cls) -> None:
        self._seen["loaders"] += 1
        iterable = isinstance(a.get("dataset"), iterable_cls)
        if "dataloader.workers" in self.knobs:
            n = self.knobs["dataloader.workers"]
            n = max(1, (os.cpu_count() or 2) - 1) if n is None else n
            given = a.get("num_workers", 0) or 0
            if iterable and n > 0 and given == 0:
                self._note("dataloader.workers", "an IterableDataset DataLoader kept its 0 workers (each worker "
                           "would yield the whole dataset unless it shards itself)")
            elif given == n:
                self._note("dataloader.workers", f"a DataLoader already had num_workers={n}")
            else:
                a["num_workers"] = n
                if n == 0:
                    a.pop("persistent_workers", None)
                    a.pop("prefetch_factor", None)
                    a.pop("timeout", None)
                self._applied(ctx, "dataloader.workers", f"num_workers {given} -> {n}")
        if "dataloader.persistent-workers" in self.knobs:
            if (a.get("num_workers", 0) or 0) > 0:
                if a.get("persistent_workers"):
                    self._note("dataloader.persistent-workers", "a DataLoader already kept its workers")
                else:
                    a["persistent_workers"] = True
                    self._applied(ctx, "dataloader.persistent-workers")
            else:
                self._note("dataloader.persistent-workers", "a DataLoader without workers has none to keep")
        if "dataloader.pin-memory" in self.knobs and self.status["dataloader.pin-memory"]["not_applicable"] is None:
            if a.get("pin_memory"):
                self._note("dataloader.pin-memory", "a DataLoader already pinned its batches")
            else:
                a["pin_memory"] = True
                self._applied(ctx, "dataloader.pin-memory")

    # ---- optimizers built fused ----------------------------------------------------------------------
    def _patch_optimizers(self, ctx) -> None:
        torch = self.torch
        for name in dir(torch.optim):
            cls = getattr(torch.optim, name)
            if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)) or cls is torch.optim.Optimizer:
                continue
            orig = cls.__dict__.get("__init__")
            if orig is None:
                continue
            try:
                sig = inspect.signature(orig)
            except (TypeError, ValueError):
                continue
            if "fused" not in sig.parameters:
                continue
            self.patches.patch(cls, "__init__", self._fused_init(ctx, cls, orig, sig))

    def _fused_init(self, ctx, cls, orig, sig):
        ext = self

        def __init__(opt, *args, **kwargs):
            if type(opt) is not cls or not ctx.is_live():
                return orig(opt, *args, **kwargs)     # a subclass calling up, or a worker: untouched
            try:
                bound = sig.bind(opt, *args, **kwargs)
            except TypeError:
                return orig(opt, *args, **kwargs)
            a = bound.arguments
            ext._seen["optimizers"] += 1
            if a.get("fused"):
                ext._note("optim.fused", f"{cls.__name__} was already fused")
                return orig(opt, *args, **kwargs)
            for what in ("foreach", "differentiable", "capturable"):
                if a.get(what):
                    ext._note("optim.fused", f"{cls.__name__}({what}=True) kept as the script built it")
                    return orig(opt, *args, **kwargs)
            params = a.get("params")
            if params is not None and not isinstance(params, (list, tuple)):
                a["params"] = params = list(params)     # a generator is read once: keep it for a retry
            a["fused"] = True
            try:
                out = orig(*bound.args, **bound.kwargs)
            except (RuntimeError, ValueError, TypeError) as e:
                ext._na("optim.fused", f"{cls.__name__}(fused=True) refused: {str(e).splitlines()[0][:200]}")
                a.pop("fused", None)
                return orig(*bound.args, **bound.kwargs)
            ext._applied(ctx, "optim.fused", f"{cls.__name__} built with fused=True")
            return out

        __init__.__wrapped__ = orig
        return __init__

    # ---- zero_grad(set_to_none=True) -----------------------------------------------------------------
    def _patch_zero_grad(self, ctx) -> None:
        torch = self.torch
        ext = self
        for owner in (torch.optim.Optimizer, torch.nn.Module):
            orig = getattr(owner, "zero_grad")

            def zero_grad(obj, set_to_none: bool = True, _orig=orig):
                if ctx.is_live():
                    ext._seen["zero_grad"] += 1
                    if not set_to_none:
                        ext._seen["zero_grad_false"] += 1
                        if ext._active("optim.set-to-none"):
                            ext._applied(ctx, "optim.set-to-none")
                            set_to_none = True
                return _orig(obj, set_to_none)

            zero_grad.__wrapped__ = orig
            self.patches.patch(owner, "zero_grad", zero_grad)

    # ---- the loss, and autocast left before the backward ---------------------------------------------
    def _patch_backward(self, ctx) -> None:
        torch = self.torch
        ag = torch.autograd
        orig = ag.backward
        ext = self

        def backward(tensors, *args, **kwargs):
            if ext._autocast is not None:
                ext._leave_autocast()
            try:
                t = tensors[0] if isinstance(tensors, (tuple, list)) and len(tensors) == 1 else tensors
                if isinstance(t, torch.Tensor) and t.numel() == 1 and t.is_floating_point() and ctx.is_live() \
                        and not ext._compiling():
                    d = t.detach().reshape(())
                    ext._step_loss = d if ext._step_loss is None else ext._step_loss + d
            except Exception as e:
                ctx.report_error("knobapply.loss", e)
            return orig(tensors, *args, **kwargs)

        backward.__wrapped__ = orig
        self.patches.patch(ag, "backward", backward)

    def _busy(self) -> bool:
        """torch.compile is tracing, or a dispatch mode (fake tensors) is active: no tensor work now."""
        try:
            if self._compiling():
                return True
            from torch.utils._python_dispatch import _get_current_dispatch_mode

            return _get_current_dispatch_mode() is not None
        except Exception:
            return False

    def _flush_losses(self, ctx) -> None:
        if not self._pending or self._busy():
            return
        pending, self._pending = self._pending, []
        try:
            torch = self.torch
            values = torch.stack([v.float() for _, v in pending]).tolist()
            ctx.emit(E.APPEND, path="extras.try_losses", value=[[i, v] for (i, _), v in zip(pending, values)],
                     limit=100000)
        except Exception as e:
            ctx.report_error("knobapply.losses", e)

    # ---- switch knobs --------------------------------------------------------------------------------
    def _set_flags(self, ctx, on: frozenset) -> None:
        """The global flags of the switch knobs as ``on`` says (the script's own values kept to restore)."""
        torch = self.torch
        if torch is None:
            return
        if "matmul.tf32" in self.knobs and self.status["matmul.tf32"]["not_applicable"] is None:
            if "matmul.tf32" in on:
                if "tf32" not in self._saved:
                    prec = torch.get_float32_matmul_precision()
                    if prec != "highest":
                        self._na("matmul.tf32", f'the script already set float32_matmul_precision("{prec}")')
                    else:
                        self._saved["tf32"] = prec
                        torch.set_float32_matmul_precision("high")
                        self._applied(ctx, "matmul.tf32")
            elif "tf32" in self._saved:
                torch.set_float32_matmul_precision(self._saved.pop("tf32"))
        if "cudnn.benchmark" in self.knobs and self.status["cudnn.benchmark"]["not_applicable"] is None:
            cudnn = torch.backends.cudnn
            if "cudnn.benchmark" in on:
                if "cudnn" not in self._saved:
                    if cudnn.benchmark:
                        self._na("cudnn.benchmark", "the script already turned cudnn.benchmark on")
                    else:
                        self._saved["cudnn"] = False
                        cudnn.benchmark = True
                        self._applied(ctx, "cudnn.benchmark")
            elif "cudnn" in self._saved:
                cudnn.benchmark = self._saved.pop("cudnn")

    def _anomaly_off(self, ctx) -> None:
        torch = self.torch
        if torch.is_anomaly_enabled():
            self._seen["anomaly"] += 1
            self._saved["anomaly"] = torch.is_anomaly_check_nan_enabled()
            torch.autograd.set_detect_anomaly(False)
            self._applied(ctx, "debug.anomaly")

    def _anomaly_restore(self) -> None:
        if "anomaly" in self._saved:
            self.torch.autograd.set_detect_anomaly(True, check_nan=self._saved.pop("anomaly"))

    def _leave_autocast(self) -> None:
        ac, self._autocast = self._autocast, None
        if ac is not None:
            try:
                ac.__exit__(None, None, None)
            except Exception:
                pass

    def _enter(self, ctx, index: int) -> None:
        """Step ``index`` is under way (it opened, or its first forward began: whichever comes first):
        its arm's switch knobs on, the others off."""
        if self.schedule.arms:
            name, blk, on = self.schedule.at(index)
            if (name, blk) != self._arm:
                if blk != self._arm[1]:
                    self._flush_losses(ctx)    # a block's first step is not judged (the arm just changed)
                self._arm = (name, blk)
                self._on = on
                self._set_flags(ctx, on)
        elif index % LOSS_FLUSH_STEPS == 0 and index != self._flushed_at:
            self._flushed_at = index
            self._flush_losses(ctx)
        if "debug.anomaly" in self.knobs and "anomaly" not in self._saved and self._active("debug.anomaly"):
            self._anomaly_off(ctx)

    def on_step_start(self, ctx, index: int) -> None:
        self._enter(ctx, index)

    def on_forward_start(self, ctx, module) -> None:
        if not ctx.is_live():
            return
        cur = ctx.current_step
        self._enter(ctx, cur.index if cur is not None else ctx.steps_done + 1)
        if "amp.bf16" not in self.knobs or self._autocast is not None or not self._active("amp.bf16"):
            return
        if self.status["amp.bf16"]["not_applicable"] is not None or not ctx.is_live():
            return
        torch = self.torch
        if not module.training or not torch.is_grad_enabled():
            return
        try:
            p = next(module.parameters(), None)
            dev = p.device.type if p is not None else "cpu"
            if dev not in ("cuda", "cpu"):
                self._na("amp.bf16", f"the model is on {dev}: diag applies bf16 autocast on cuda and cpu only")
                return
            if torch.is_autocast_enabled(dev):
                dtype = torch.get_autocast_dtype(dev)
                if dtype == torch.bfloat16:
                    self._na("amp.bf16", "the script already autocasts to bfloat16")
                    return
                # the script autocasts to another dtype: bf16 for the forward only (its own context
                # closes before the backward, and contexts must close in order)
                self._autocast_until = "forward"
                self._note("amp.bf16", f"the script autocasts to {str(dtype).replace('torch.', '')}: bf16 "
                           "replaced it for the model's forward (its loss stays in the script's dtype)")
            else:
                self._autocast_until = "backward"
            ac = torch.autocast(dev, dtype=torch.bfloat16)
            ac.__enter__()
            self._autocast = ac
            self._applied(ctx, "amp.bf16")
        except Exception as e:
            self._leave_autocast()
            ctx.report_error("knobapply.autocast", e)

    def on_forward(self, ctx, module, args, kwargs, output, training) -> None:
        self._seen["train_forwards"] += 1
        if not self._compiled and "compile" in self.fixed and training:
            self._compile(ctx, module)
        if self._autocast is not None and self._autocast_until == "forward":
            self._leave_autocast()

    def on_data(self, ctx, edge) -> None:
        if edge == "start" and self._autocast is not None:
            self._leave_autocast()

    def on_model(self, ctx, module, info) -> None:
        self._seen["models"] += 1
        if "cudnn.benchmark" in self.knobs and not self._seen["conv"]:
            from torch.nn.modules.conv import _ConvNd

            if any(isinstance(m, _ConvNd) for m in module.modules()):
                self._seen["conv"] = True
        if "compile" in self.fixed and not self._compiled and module.training:
            self._compile(ctx, module)

    def _compile(self, ctx, module) -> None:
        """The outermost training model compiled in place (``Module.compile()``), after its first
        training forward (the first forward of a framework may be a sanity check in eval mode)."""
        torch = self.torch
        if ctx.is_live():
            self._compiled = True
            if hasattr(module, "_orig_mod") or getattr(module, "_compiled_call_impl", None) is not None:
                self._na("compile", "the script already compiles its model")
                return
            if not hasattr(module, "compile"):
                self._na("compile", f"torch {torch.__version__} has no Module.compile()")
                return
            try:
                module.compile()
                self._applied(ctx, "compile", f"{type(module).__name__}.compile() after its first forward")
            except Exception as e:
                self._na("compile", f"Module.compile() failed: {str(e).splitlines()[0][:200]}")

    def on_step_end(self, ctx, step) -> None:
        if self._autocast is not None:
            self._leave_autocast()
        if "anomaly" in self._saved:
            self._anomaly_restore()
        extra = step.get("extra")
        if extra is not None and self.schedule.arms:
            extra["try"] = self._arm[0]
            extra["try_block"] = self._arm[1]
        if self._step_loss is not None:
            self._pending.append((step.get("index", ctx.steps_done), self._step_loss))
            self._step_loss = None

    def on_exit(self, ctx, status) -> None:
        self._leave_autocast()
        self._anomaly_restore()
        self._flush_losses(ctx)
        s = self._seen
        why = {
            "dataloader.workers": "the script built no DataLoader" if not s["loaders"] else None,
            "dataloader.persistent-workers": "no DataLoader had workers to keep" if s["loaders"] else
            "the script built no DataLoader",
            "dataloader.pin-memory": "the script built no DataLoader" if not s["loaders"] else None,
            "optim.fused": "the script built no torch.optim optimizer that has a fused implementation"
            if not s["optimizers"] else None,
            "optim.set-to-none": "the script never called zero_grad(set_to_none=False)" if s["zero_grad"]
            else "the script never called zero_grad",
            "debug.anomaly": "anomaly detection was never on during a training step",
            "amp.bf16": "no training forward ran with the knob on",
            "compile": "no training forward was seen",
            "matmul.tf32": "no training step ran with the knob on",
            "cudnn.benchmark": "the model has no convolution" if not s["conv"] else "no training step ran with the knob on",
        }
        for kid, st in self.status.items():
            if not st["applied"] and st["not_applicable"] is None:
                reason = why.get(kid)
                if reason is None and st["notes"]:
                    reason = "; ".join(st["notes"])
                self._na(kid, reason or "it found nothing to apply to")
        self._emit_status(ctx)
