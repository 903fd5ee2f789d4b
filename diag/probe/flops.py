"""Probe extension: FLOPs of one real training step, counted with ``FlopCounterMode``.

Runs in the user's process. For one steady-state step (step 3 by default, ``DIAG_FLOPS_STEP=N``;
disable with ``DIAG_PROBE_DISABLE=flopcounter``) it:

* enters ``torch.utils.flop_counter.FlopCounterMode`` when the previous step ends (two steps earlier
  for scripts that train without an optimizer, whose next forward runs before the step closes), and
  exits it when the measured step ends, on exit, or on uninstall, whichever comes first;
* attributes counted FLOPs to the step's top-level training forwards (snapshot at each forward's
  start and end) and backwards (snapshot when the gradient reaches the forward's output and when the
  backward finishes), so evaluation forwards run between steps are not counted;
* marks the step (and the step before it when counting started early) ``instrumented`` so timing
  statistics leave it out;
* for a ``torch.compile``d model, or in a process that called ``torch.compile`` at all (a compiled
  optimizer step), does not count (the mode over compiled code is a risk on the user's
  hot path, and fused kernels are invisible to it): the step's FLOPs are 6 x non-embedding parameters
  x tokens (or samples), ``method: "analytic"`` (``DIAG_FLOPS_COMPILED=1`` counts anyway);
* writes ``flops.measured`` (FLOPs, forward/backward split, samples and tokens, precision, device
  type and name) when the step ends, and ``flops.achieved`` (achieved FLOP/s, samples and tokens per
  second, the counter's overhead) a few steps later, every 50 steps, and at exit.

The probe records, diag judges: nothing here reads the GPU catalogue. MFU and HFU (achieved FLOP/s
over the device's published peak for the precision) are judged by diag from the recorded device name
and precision, so ``diag check --from`` re-judges them with a corrected catalogue.

Model FLOPs vs hardware FLOPs: the counter sees what executes. With activation recomputation the
backward re-runs forwards, so backward > 2x forward; then the model FLOPs are taken as 3x the forward
FLOPs (MFU) and the executed total is kept as hardware FLOPs (HFU).

Every hook here catches its own errors: a failure exits the counter and reports a ``probe_error``,
never an exception in the user's code.
"""
from __future__ import annotations

import os
import time
import weakref
from typing import Any

from diag.evidence import events as E
from diag.probe.hooks import remove_hooks
from diag.probe.models import wrappers_of
from diag.probe.tensors import batch_size_of, grad_tensors

RECOMPUTE_RATIO = 2.2       # backward > 2.2 x forward: recomputed forwards are inside the backward
EMIT_AFTER = (1, 3, 10)     # emit flops.achieved this many steps after the measured one, then go idle:
MAX_TOTALS = 1000           # diag recomputes it from every step when it judges (diag.cost.measured)


def _dtype_precision(dtype, device_type: str) -> tuple[str, str]:
    import torch

    name = str(dtype).replace("torch.", "")
    if name == "bfloat16":
        return "bf16", "bfloat16"
    if name == "float16":
        return "fp16", "float16"
    if name.startswith("float8"):
        return "fp8", name
    if device_type == "cuda":
        try:
            tf32 = torch.get_float32_matmul_precision() != "highest" or bool(torch.backends.cuda.matmul.allow_tf32)
        except Exception:
            tf32 = False
        if tf32:
            return "tf32", "float32 with TF32 matmuls allowed"
    return "fp32", "float32"


class _NoModules:
    """What ``FlopCounterMode`` reads of its module tracker when only the total is wanted: every FLOP
    counted under "Global", no hooks."""

    parents = frozenset({"Global"})

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def totals_counter():
    """A ``FlopCounterMode`` that counts totals only (``get_total_flops``): without its module tracker,
    whose global module hooks and per-module backward hooks made a counted step 5.2x the others on an
    LSTMCell loop (pytorch/examples' time_sequence_prediction, docs/performance.md, fourteenth pass)
    against 3.2x without them, for the same total. The probe splits forward and backward with its own snapshots of the total and never reads
    the per-module breakdown. A torch whose counter has no such tracker gets the stock counter."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    tracker = getattr(counter, "mod_tracker", None)
    if tracker is not None and getattr(tracker, "parents", None) == {"Global"}:
        counter.mod_tracker = _NoModules()
    return counter


class FlopCounter:
    def __init__(self) -> None:
        try:
            self.target = max(1, int(os.environ.get("DIAG_FLOPS_STEP", "3")))
        except ValueError:
            self.target = 3
        self.counter = None
        self.active = False
        self.done = False
        self.failed = False
        self._hooks: list = []
        self._probe_ref = None
        self._fwd_start = 0
        self._fwd_flops = 0
        self._bwd_flops = 0
        self._bwd_start: int | None = None
        self._in_bwd = False
        self._n_forward = 0
        self._samples = 0
        self._tokens = 0
        self._token_inputs = True
        self._models: dict[int, dict] = {}
        self._precision: tuple[str, str] | None = None
        self._device: tuple[str, str | None] | None = None
        self._entered_at: float | None = None
        self._instrumented: set[int] = set()
        self._instrumented_totals: list[float] = []
        self._totals: list[tuple[int, float, bool]] = []
        self._achieved_final = False   # flops.achieved written 10 steps after the count: idle since
        self.measured: dict[str, Any] | None = None
        self._last_emit = 0
        self.analytic = False     # torch.compile in use: no counter, 6·N·D from the step's shapes instead

    # ---- interface --------------------------------------------------------------------------------
    def install(self, probe) -> None:
        self._probe_ref = weakref.ref(probe)
        if probe.max_steps is not None and probe.max_steps < self.target:
            self.target = max(1, probe.max_steps)
        if self.target == 1:
            self._enter(probe)

    def on_step_start(self, probe, index: int) -> None:
        if self.active and probe.current_step is not None and index >= self.target - 1 and index <= self.target:
            probe.current_step.instrumented = True
            self._instrumented.add(index)

    def _count_inputs(self, module, args, kwargs) -> None:
        """Samples and tokens of a counted forward, and the model it ran (described once)."""
        if getattr(self._probe_ref() if self._probe_ref else None, "forward_counts_samples", True):
            # the same batches as the step's samples: another model's forward (a GAN's discriminator)
            # adds FLOPs to the step, not samples
            samples, tokens, _, _ = batch_size_of(args, kwargs)
            self._samples += samples or 0
            if tokens:
                self._tokens += tokens
            else:
                self._token_inputs = False
        if id(module) not in self._models:
            self._models[id(module)] = self._describe(module)

    def on_forward(self, probe, module, args, kwargs, output, training) -> None:
        if not ((self.active and self.counter is not None) or self.analytic):
            return
        step = probe.current_step
        if step is None or step.index != self.target:
            return
        try:
            self._n_forward += 1
            self._count_inputs(module, args, kwargs)
            if self.analytic:
                return
            total = self.counter.get_total_flops()
            self._fwd_flops += max(0, total - self._fwd_start)
            self._fwd_start = total
            for out in grad_tensors(output):
                out.register_hook(self._bwd_hook)
        except Exception as e:
            self._fail(probe, "on_forward", e)

    def on_step_end(self, probe, step: dict) -> None:
        try:
            idx = int(step.get("index", 0))
            total_s = float(step.get("total_s") or 0.0)
            ins = bool(step.get("instrumented"))
            if ins and idx in self._instrumented:
                self._instrumented_totals.append(total_s)
            self._totals.append((idx, total_s, ins))
            if len(self._totals) > MAX_TOTALS:
                del self._totals[0]
            if (self.active or self.analytic) and idx >= self.target:
                self._finish(probe, idx)
            elif not self.active and not self.analytic and not self.done and not self.failed:
                early = 2 if probe.manual_mode else 1
                if idx >= self.target - early:
                    if self._compiled(probe) and os.environ.get("DIAG_FLOPS_COMPILED") != "1":
                        self.analytic = True
                        probe.emit(E.SET, path="flops.status",
                                   value=f"{self._why_not_counted(probe)}: step {self.target} estimated as 6·N·D, not counted")
                    else:
                        self._enter(probe)
            elif self.measured is not None:
                after = idx - self.measured["step"]
                if after in EMIT_AFTER:
                    self._emit_achieved(probe)
                if after >= EMIT_AFTER[-1]:
                    # nothing more per step (issue 20): the step events hold every later step time
                    self._achieved_final = True
                    idle = getattr(probe, "idle", None)
                    if callable(idle):
                        idle(self, "on_step_end")
        except Exception as e:
            self._fail(probe, "on_step_end", e)

    def on_exit(self, probe, status) -> None:
        if self.active:
            self._exit(probe)
        if self.measured is not None:
            if not self._achieved_final:
                self._emit_achieved(probe)
        elif not self.failed:
            probe.emit(E.SET, path="flops.status",
                       value=f"the run ended after {probe.steps_done} step(s), before step {self.target} "
                             f"finished (FLOPs are counted on step {self.target}; DIAG_FLOPS_STEP changes it)")

    def uninstall(self, probe) -> None:
        if self.active:
            self._exit(probe)

    # ---- counting -----------------------------------------------------------------------------------
    def _enter(self, probe) -> None:
        counter = totals_counter()
        counter.__enter__()
        self.counter = counter
        self.active = True
        self._entered_at = time.perf_counter()
        probe.emit(E.SET, path="flops.status", value=f"counting step {self.target}")

    def on_forward_start(self, probe, module) -> None:
        """A model's outermost forward begins: the FLOPs counted from here are its forward's (the
        probe calls this; no global module hook of our own, so inner modules keep torch's fast path)."""
        if self.counter is not None:
            try:
                self._fwd_start = self.counter.get_total_flops()
            except Exception:
                pass

    def _bwd_hook(self, grad):
        try:
            if self._in_bwd or self.counter is None:
                return None
            self._in_bwd = True
            self._bwd_start = self.counter.get_total_flops()
            import torch

            torch.autograd.Variable._execution_engine.queue_callback(self._bwd_end)
        except Exception:
            self._in_bwd = False
        return None

    def _bwd_end(self) -> None:
        try:
            if self.counter is not None and self._bwd_start is not None:
                self._bwd_flops += max(0, self.counter.get_total_flops() - self._bwd_start)
        except Exception:
            pass
        self._in_bwd = False
        self._bwd_start = None

    def _exit(self, probe) -> None:
        counter, self.counter = self.counter, None
        self.active = False
        remove_hooks(self._hooks)
        if counter is None:
            return
        try:
            mode = getattr(counter, "mode", None)
            try:
                from torch.utils._python_dispatch import _get_current_dispatch_mode

                top = _get_current_dispatch_mode()
            except Exception:
                top = mode
            if mode is not None and top is not mode:
                # the script entered a dispatch mode of its own and has not left it: popping now would
                # pop theirs. Stop counting (the counter stays on the stack until theirs exits).
                probe.report_error("flopcounter.exit", RuntimeError(
                    "another TorchDispatchMode is on top of the FLOP counter; left it in place"))
                return
            counter.__exit__(None, None, None)
        except Exception as e:
            probe.report_error("flopcounter.exit", e)

    def _go_idle(self, probe) -> None:
        """Counted (or given up): the per-forward and step-start hooks have nothing more to do."""
        idle = getattr(probe, "idle", None)
        if callable(idle):
            for m in ("on_forward_start", "on_forward", "on_step_start"):
                idle(self, m)

    def _fail(self, probe, where: str, e: Exception) -> None:
        self.failed = True
        if self.active:
            self._exit(probe)
        self._go_idle(probe)
        probe.report_error(f"flopcounter.{where}", e)

    def _finish(self, probe, idx: int) -> None:
        counter = self.counter
        window = counter.get_total_flops() if counter is not None else 0
        by_module: dict[str, int] = {}
        by_op: dict[str, int] = {}
        try:
            counts = counter.get_flop_counts() if counter is not None else {}
            for op, n in counts.get("Global", {}).items():
                by_op[str(op)] = by_op.get(str(op), 0) + int(n)
            for name, ops in counts.items():
                if name != "Global" and name.count(".") <= 1:
                    by_module[name] = int(sum(ops.values()))
        except Exception:
            pass
        self._exit(probe)
        self.done = True
        self._go_idle(probe)
        params = sum(m["params"] for m in self._models.values())
        params_ne = sum(m["params_non_embedding"] for m in self._models.values())
        units = self._tokens if (self._token_inputs and self._tokens) else self._samples
        analytic = 6 * params_ne * units if params_ne and units else None
        if self.analytic:
            self.analytic = False
            fwd = int(analytic / 3) if analytic else 0
            bwd = 2 * fwd
        else:
            fwd, bwd = int(self._fwd_flops), int(self._bwd_flops)
        flops = fwd + bwd
        recompute = bool(fwd and bwd > RECOMPUTE_RATIO * fwd)
        model_flops = 3 * fwd if recompute else flops
        precision, precision_why = self._precision or ("fp32", "float32")
        dev_type, dev_name = self._device or ("cpu", None)
        top_modules = dict(sorted(by_module.items(), key=lambda kv: -kv[1])[:12])
        self.measured = {
            "step": self.target, "flops": flops, "model_flops": model_flops,
            "forward_flops": fwd, "backward_flops": bwd, "window_flops": int(window),
            "recompute_detected": recompute,
            "samples": self._samples or None, "tokens": self._tokens if self._token_inputs and self._tokens else None,
            "n_forward": self._n_forward, "params": params or None, "params_non_embedding": params_ne or None,
            "analytic_flops": analytic, "analytic_basis": "tokens" if units == self._tokens and self._tokens else "samples",
            "ratio_to_analytic": (model_flops / analytic) if analytic else None,
            "precision": precision, "precision_reason": precision_why,
            "device": dev_type, "device_name": dev_name, "world_size": probe.world_size,
            # no peak here (diag looks it up from device_name and precision); on CPU the reason MFU is
            # N/A is a fact of the device type, kept for the checks that show it
            **({"peak_note": "CPU run: the catalogue has no CPU peaks, so MFU is N/A"} if dev_type == "cpu" else {}),
            "compiled": any(m.get("compiled") for m in self._models.values()),
            "by_op": by_op, "by_module": top_modules,
            "instrumented_steps": sorted(self._instrumented),
            "method": "counted" if counter is not None else "analytic",
        }
        probe.emit(E.SET, path="flops.measured", value=self.measured)
        probe.emit(E.SET, path="flops.status", value=f"measured step {self.target}" if counter is not None else
                   f"{self._why_not_counted(probe)}: step {self.target} estimated as 6 x non-embedding parameters x "
                   f"{'tokens' if self._tokens and self._token_inputs else 'samples'} (DIAG_FLOPS_COMPILED=1 counts it)")
        if not flops:
            probe.emit(E.SET, path="flops.status",
                       value="no FLOPs counted in the measured step (compiled or custom kernels are invisible "
                             "to FlopCounterMode)")

    @staticmethod
    def _model_compiled(probe) -> bool:
        return any("compiled" in wrappers_of(mod)[1] for mod in probe.models())

    @classmethod
    def _why_not_counted(cls, probe) -> str:
        if cls._model_compiled(probe):
            return "compiled model"
        return "torch.compile in use (a compiled function, the model not compiled)"

    @staticmethod
    def _compiled(probe) -> bool:
        """Is torch.compile in use: any model seen so far wrapped by it, or any call of it in the process (a
        compiled optimizer step or train function)? FlopCounterMode over compiled code is not worth the
        risk on the user's hot path (and cannot see fused kernels anyway): an optimizer step compiled
        with inductor, run inside the counted step, left the Python dispatch key on after the mode
        exited, and the script's next operation raised (INTERNAL ASSERT FAILED ... PythonFallbackKernel)."""
        return getattr(probe, "compile_used", False) or FlopCounter._model_compiled(probe)

    def _describe(self, module) -> dict:
        import torch

        params = 0
        first = None
        for p in module.parameters():
            if first is None and p.is_floating_point():
                first = p
            if p.requires_grad:
                params += p.numel()
        # Kaplan et al.'s N excludes embeddings: a lookup does no multiply-adds
        emb_ids: set[int] = set()
        for sub in module.modules():
            if isinstance(sub, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
                for p in sub.parameters(recurse=False):
                    if p.requires_grad:
                        emb_ids.add(id(p))
        emb = 0
        if emb_ids:
            tied = False
            for sub in module.modules():
                if isinstance(sub, torch.nn.Linear) and id(sub.weight) in emb_ids:
                    tied = True       # a tied output head multiplies with the embedding matrix
            if not tied:
                emb = sum(p.numel() for p in module.parameters() if id(p) in emb_ids)
        _, wrappers, _ = wrappers_of(module)
        if self._precision is None or self._device is None:
            dev = first.device if first is not None else torch.device("cpu")
            dtype = first.dtype if first is not None else torch.float32
            try:
                if torch.is_autocast_enabled(dev.type):
                    dtype = torch.get_autocast_dtype(dev.type)
                    self._precision = (_dtype_precision(dtype, dev.type)[0], f"autocast {str(dtype).replace('torch.', '')}")
                else:
                    self._precision = _dtype_precision(dtype, dev.type)
            except Exception:
                self._precision = _dtype_precision(dtype, dev.type)
            name = None
            if dev.type == "cuda":
                try:
                    name = torch.cuda.get_device_name(dev.index if dev.index is not None else torch.cuda.current_device())
                except Exception:
                    name = None
            elif dev.type == "mps":
                name = "Apple MPS"
            self._device = (dev.type, name)
        return {"params": params, "params_non_embedding": params - emb, "compiled": "compiled" in wrappers}

    def _emit_achieved(self, probe) -> None:
        from diag.evidence.flops import summarize, timed_totals

        if self.measured is None:
            return
        totals = timed_totals(self._totals)
        probe.emit(E.SET, path="flops.achieved", value=summarize(self.measured, totals, self._instrumented_totals))
