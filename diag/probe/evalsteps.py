"""Evaluation steps (docs/steps.md, section 5): an evaluation "step" is one forward of the model on one
batch. Where they begin and end is the step machine's (:mod:`diag.probe.stepmachine`); this module is
the probe's side of them (:class:`EvalWatch`): the counting of host syncs and copies, one evaluation
forward's FLOPs, the events.

- An evaluation step begins where the previous one ended (the first of a pass: at the previous
  training step's end, or at its own first fetch in an evaluation-only run) and ends when the next
  batch starts to be fetched, when its call site forwards again without a fetch in between (a loop
  without a DataLoader), or when the pass ends (training resumes, the run ends).
- Its phases: ``data`` (waiting in ``DataLoader.__next__`` for its batch), ``h2d`` (``Tensor.to`` /
  ``.cuda`` copies to a CUDA device outside the forward: measured only when an evaluated model lives on
  CUDA), ``forward`` (its forwards) and ``other`` (the post-processing between forwards: metrics,
  ``.item()``, logging). ``data + h2d + forward + other == total`` by construction.
- Per-batch host syncs: ``.item()``, ``.tolist()``, ``.cpu()`` and ``.numpy()`` called on a tensor
  outside the forward while an evaluation step is open are counted per step and located (the first
  ``MAX_LOCATED`` calls walk to the user's line).
- A fetch made while no training step is open is provisional (the step rules' tail): when training
  claims it, the provisional evaluation step is dropped.

The tensor-method patches are installed lazily, at the first evaluation step, and undone at the probe's
uninstall only when the attribute is still ours (another extension that patched the same method later
and restored it keeps its restore).
"""
from __future__ import annotations

import os
import time

from diag.evidence import events as E
from diag.probe.frames import line_of, user_frame
from diag.probe.hooks import DiagStop, compiling_check
from diag.probe.models import wrappers_of
from diag.probe.stepmachine import EVAL_FLOPS_STEP

MAX_LOCATED = 2000      # host-sync calls walked to the user's line (then only counted)
MAX_SYNC_SITES = 10
_SYNC_OPS = ("item", "tolist", "cpu", "numpy")


class EvalWatch:
    """The probe's side of evaluation steps (the step machine, :mod:`diag.probe.stepmachine`, decides
    where they begin and end): the tensor-method patches that count per-batch host syncs and time
    host-to-device copies while an evaluation step is open, the FLOPs of one evaluation forward, the
    sync sites, and the ``eval_step`` events. Owned by the probe (``Probe._evals``)."""

    def __init__(self, probe):
        self.probe = probe
        self.watch = False                     # an evaluation step is open: count syncs and copies
        self.patched = False
        self._mine: list = []                  # (owner, name, ours, original)
        self._sites: dict[tuple, dict] = {}
        self._located = 0
        self._cuda = False                     # an evaluated model lives on CUDA: time copies
        self._flops = None                     # FlopCounterMode over the counted evaluation step
        self._flops_done = False
        self.ext_calls = 0                     # evaluation forwards handed to extensions (on_eval_forward)
        self._no_optimizer: bool | None = None

    # ---- the step machine's evaluation events ----------------------------------------------------------
    def opened(self, es: dict) -> None:
        self.watch = self.patched
        if not self._flops_done and self.probe.steps.eval_steps == EVAL_FLOPS_STEP - 1:
            self._flops_enter(es)

    def forward(self, es: dict, site: str | None) -> None:
        if not self.patched:
            self._install()           # the first evaluation forward: watch syncs and copies from now on
        self.watch = True
        if self._flops is not None:
            self._flops_exit(es, site)
        if not self._cuda and site is not None:
            self._cuda = any(str(d).startswith("cuda") for d in self.probe._model_device.values())

    def closed(self, es: dict | None, ev: dict | None) -> None:
        self.watch = False
        if self._flops is not None:
            self._flops_exit(None, None)
        if es is None or ev is None:
            return
        for key in es["sync_at"]:
            rec = self._sites.get(key)
            if rec is None:
                if len(self._sites) >= 100:
                    continue
                rec = self._sites[key] = {"file": key[0], "line": key[1], "function": key[2],
                                          "op": key[3], "calls": 0}
            rec["calls"] += 1
        probe = self.probe
        if probe._site_dirty and ev["index"] % 50 == 1:
            ev["forward_counts"] = {k: probe._site_counts[k] for k in probe._site_dirty}
            probe._site_dirty.clear()
        probe.emit_dict(E.EVAL_STEP, ev)
        sm = probe.steps
        if (probe.max_steps is not None and ev["index"] >= probe.max_steps and not sm.finishing
                and self._evaluation_only()):
            self.watch = False
            raise DiagStop(f"--steps {probe.max_steps} reached ({ev['index']} evaluation steps: "
                           "an evaluation run)", "stopped")

    def _evaluation_only(self) -> bool:
        """No training so far and no optimizer in the process (looked up once): ``--steps N`` counts
        evaluation steps in such a run."""
        if not self.probe.steps.evaluation_only():
            return False
        if self._no_optimizer is None:
            self._no_optimizer = not self.probe.optimizer_alive()
        return self._no_optimizer

    def finished(self) -> None:
        """The run ends: the sync sites, and the patches undone."""
        if self._sites:
            sites = sorted(self._sites.values(), key=lambda s: -s["calls"])[:MAX_SYNC_SITES]
            self.probe.emit(E.EVAL_SYNCS, sites=sites)
        self.uninstall()

    # ---- tensor-method patches (lazy) ----------------------------------------------------------------
    def _install(self) -> None:
        self.patched = True
        if "evalsyncs" in os.environ.get("DIAG_PROBE_DISABLE", ""):
            return              # no per-batch host syncs or copies counted (eval.host-sync skips)
        try:
            import torch
        except Exception:
            return
        watch = self
        probe = self.probe
        sm = probe.steps
        Tensor = torch.Tensor
        compiling = compiling_check()

        # compiling() first: under torch.compile's tracing it is a constant True, so dynamo neither
        # traces diag's bookkeeping nor guards on the probe's flags (no graph break, no recompile)
        def make_sync(name, orig):
            def wrapper(t, *args, **kwargs):
                if compiling():
                    return orig(t, *args, **kwargs)
                if watch.watch and not probe.depth and not probe._forked:
                    watch._sync(name)
                return orig(t, *args, **kwargs)
            wrapper.__wrapped__ = orig
            wrapper.__doc__ = getattr(orig, "__doc__", None)
            wrapper.__name__ = name
            return wrapper

        def make_copy(name, orig):
            def wrapper(t, *args, **kwargs):
                if compiling():
                    return orig(t, *args, **kwargs)
                if watch.watch and watch._cuda and not probe.depth and not probe._forked:
                    t0 = time.perf_counter()
                    out = orig(t, *args, **kwargs)
                    try:
                        if out is not t and t.device.type == "cpu" and out.device.type == "cuda":
                            es = sm.es
                            if es is not None:
                                es["h2d_s"] += time.perf_counter() - t0
                    except Exception:
                        pass
                    return out
                return orig(t, *args, **kwargs)
            wrapper.__wrapped__ = orig
            wrapper.__doc__ = getattr(orig, "__doc__", None)
            wrapper.__name__ = name
            return wrapper

        for name in _SYNC_OPS + ("to", "cuda"):
            own = Tensor.__dict__.get(name)        # None: inherited from torch._C.TensorBase
            orig = own if own is not None else getattr(Tensor, name, None)
            if orig is None:
                continue
            new = make_copy(name, orig) if name in ("to", "cuda") else make_sync(name, orig)
            try:
                setattr(Tensor, name, new)
            except Exception as e:
                probe.report_error("eval_steps.patch", e)
                continue
            self._mine.append((Tensor, name, new, own))

    # ---- FLOPs of one evaluation forward (evaluation-only runs) ----------------------------------------
    def _flops_enter(self, es: dict) -> None:
        """Count the next evaluation step's forward with FlopCounterMode: only in a run with no training
        so far and no optimizer (an evaluation or batch-inference script; a training run's FLOPs are
        counted on a training step by the flop counter extension, and its forward FLOPs price its
        evaluation)."""
        self._flops_done = True
        probe = self.probe
        if (probe.steps.done or probe._optimizers
                or "flopcounter" in os.environ.get("DIAG_PROBE_DISABLE", "")):
            return
        try:
            if probe.optimizer_alive() or any("compiled" in wrappers_of(m)[1] for m in probe.models()):
                return
            from diag.probe.flops import totals_counter

            mode = totals_counter()     # (totals only: no module tracker's hooks on every module call)
            mode.__enter__()
            self._flops = mode
            es["instrumented"] = True
        except Exception as e:
            self._flops = None
            probe.report_error("eval_steps.flops", e)

    def _flops_exit(self, es: dict | None, site: str | None) -> None:
        mode, self._flops = self._flops, None
        probe = self.probe
        try:
            mode.__exit__(None, None, None)
        except Exception as e:
            probe.report_error("eval_steps.flops", e)
            return
        if es is None or site is None:
            return
        try:
            flops = int(mode.get_total_flops())
            rec = next((v for v in probe._sites.values() if v["key"] == site), None)
            ref = probe._model_refs.get(rec["model"]) if rec else None
            model = ref() if ref is not None else None
            params = sum(p.numel() for p in model.parameters()) if model is not None else None
            dtype = next((str(p.dtype).replace("torch.", "") for p in model.parameters()), None) if model is not None else None
            dev = next((p.device for p in model.parameters()), None) if model is not None else None
            dev_type = dev.type if dev is not None else "cpu"
            dev_name = None
            if dev_type == "cuda":
                import torch

                dev_name = torch.cuda.get_device_name(dev)
            units = es["tokens"] or es["samples"]
            analytic = 2 * params * units if params and units else None
            value = {"flops": flops, "samples": es["samples"], "tokens": es["tokens"], "params": params,
                     "eval_step": probe.steps.eval_steps + 1, "device": dev_type, "device_name": dev_name,
                     "precision": rec.get("autocast") if rec and rec.get("autocast") else dtype,
                     "analytic_flops": analytic,
                     "analytic_basis": "tokens" if es["tokens"] else "samples",
                     "ratio_to_analytic": flops / analytic if analytic else None}
            probe.emit(E.SET, path="flops.eval", value=value)
        except Exception as e:
            probe.report_error("eval_steps.flops", e)

    def uninstall(self) -> None:
        if self._flops is not None:
            self._flops_exit(None, None)
        mine, self._mine = self._mine, []
        for owner, name, ours, orig in reversed(mine):
            try:
                if owner.__dict__.get(name) is ours:   # still ours: restore; else whoever patched after us restored
                    if orig is None:
                        delattr(owner, name)            # the inherited method shows through again
                    else:
                        setattr(owner, name, orig)
            except Exception:
                pass
        self.watch = False

    def _sync(self, op: str) -> None:
        es = self.probe.steps.es
        if es is None:
            return
        es["syncs"] += 1
        if self._located >= MAX_LOCATED:
            return
        self._located += 1
        try:
            f = user_frame(3)
            if f is not None:
                es["sync_at"].append((f.f_code.co_filename, line_of(f), f.f_code.co_name, op))
        except Exception:
            pass
