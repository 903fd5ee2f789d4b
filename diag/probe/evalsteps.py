"""Evaluation steps (docs/steps.md, section 5): an evaluation "step" is one forward of the model on one
batch. A mixin of :class:`diag.probe.steps.StepRules` (and so of the probe); it keeps its own state and
is driven by the step rules' fetch / evaluation-forward / training-start / pass-end hooks.

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
from diag.probe.models import wrappers_of

EVAL_FLOPS_STEP = 3     # the evaluation step whose forward is counted with FlopCounterMode (evaluation-only runs)
MAX_LOCATED = 2000      # host-sync calls walked to the user's line (then only counted)
MAX_SYNC_SITES = 10
_SYNC_OPS = ("item", "tolist", "cpu", "numpy")


class EvalStepRules:
    """Mixin: evaluation steps and their per-batch host syncs."""

    def _init_eval_steps(self) -> None:
        self._es: dict | None = None           # the evaluation step in progress
        self._es_count = 0                     # evaluation steps emitted
        self._es_last_end: float | None = None
        self._es_watch = False                 # an evaluation step is open: count syncs and copies
        self._es_patched = False
        self._es_mine: list = []               # (owner, name, ours, original)
        self._es_sites: dict[tuple, dict] = {}
        self._es_located = 0
        self._es_cuda = False                  # an evaluated model lives on CUDA: time copies
        self._es_flops = None                  # FlopCounterMode over the counted evaluation step
        self._es_pend_t0: float | None = None  # fetches not yet given to a step (training runs before any evaluation)
        self._es_pend_dt = 0.0
        self._es_ext_calls = 0                 # evaluation forwards handed to extensions (on_eval_forward)
        self._es_flops_done = False
        self._es_finishing = False

    # ---- the step ------------------------------------------------------------------------------------
    def _es_open(self, t: float) -> dict:
        starts = [x for x in (self._es_last_end, self._last_boundary) if x is not None]
        start = min(max(starts), t) if starts else t
        self._es = {"start": start, "data_s": 0.0, "h2d_s": 0.0, "forward_s": 0.0, "forwards": 0,
                    "samples": None, "tokens": None, "site": None, "sites": set(), "syncs": 0,
                    "provisional": False, "sync_at": [], "instrumented": False}
        self._es_watch = self._es_patched
        if not self._es_flops_done and self._es_count == EVAL_FLOPS_STEP - 1:
            self._es_flops_enter()
        return self._es

    def _es_fetch(self, t0: float, dt: float, provisional: bool) -> None:
        """A batch arrived while no training step is open."""
        es = self._es
        if es is None and self.steps_done and not self._es_patched:
            # a training run that has not evaluated yet (the hot path of every training step): only
            # remember the fetch, in case an evaluation forward comes next
            if self._es_pend_t0 is None:
                self._es_pend_t0 = t0
            self._es_pend_dt += dt
            return
        if es is not None and es["forwards"]:
            self._es_close(t0)
            es = None
        if es is None:
            es = self._es_open(t0)
        es["data_s"] += dt
        es["provisional"] = es["provisional"] or provisional

    def _es_forward(self, start: float, dt: float, site: str | None, samples, tokens) -> None:
        """A forward of an evaluation pass."""
        es = self._es
        if es is not None and es["forwards"] and site in es["sites"]:
            self._es_close(start)        # the same call site again without a fetch: the next batch
            es = None
        if es is None:
            es = self._es_open(start)
            if self._es_pend_t0 is not None and self._es_pend_t0 >= es["start"]:
                es["data_s"] += self._es_pend_dt      # the fetch of its batch, made before it was known
        self._es_pend_t0, self._es_pend_dt = None, 0.0
        if not self._es_patched:
            self._es_install()           # the first evaluation forward: watch syncs and copies from now on
        self._es_watch = True
        es["forwards"] += 1
        es["forward_s"] += dt
        es["provisional"] = False
        if es["site"] is None:
            es["site"], es["samples"], es["tokens"] = site, samples, tokens
        es["sites"].add(site)
        if self._es_flops is not None:
            self._es_flops_exit(es, site)
        if not self._es_cuda and site is not None:
            self._es_cuda = any(str(d).startswith("cuda") for d in self._model_device.values())

    def _es_close(self, end: float) -> None:
        es = self._es
        self._es = None
        self._es_watch = False
        if self._es_flops is not None:
            self._es_flops_exit(None, None)
        if es is None:
            return
        if not es["forwards"]:
            return                       # fetches without a forward: not an evaluation step
        end = max(end, es["start"])
        total = end - es["start"]
        other = total - es["data_s"] - es["h2d_s"] - es["forward_s"]
        self._es_count += 1
        self._es_last_end = end
        for key in es["sync_at"]:
            rec = self._es_sites.get(key)
            if rec is None:
                if len(self._es_sites) >= 100:
                    continue
                rec = self._es_sites[key] = {"file": key[0], "line": key[1], "function": key[2],
                                             "op": key[3], "calls": 0}
            rec["calls"] += 1
        ev = {"index": self._es_count, "pass_index": self._eval_passes + 1, "total_s": total,
              "data_s": es["data_s"], "h2d_s": es["h2d_s"], "forward_s": es["forward_s"], "other_s": other,
              "forwards": es["forwards"], "samples": es["samples"], "tokens": es["tokens"], "site": es["site"],
              "host_syncs": es["syncs"], "instrumented": es["instrumented"]}
        if self._site_dirty and self._es_count % 50 == 1:
            ev["forward_counts"] = {k: self._site_counts[k] for k in self._site_dirty}
            self._site_dirty.clear()
        self.emit(E.EVAL_STEP, **ev)
        if (self.max_steps is not None and self._es_count >= self.max_steps and not self._es_finishing
                and self._evaluation_only()):
            from diag.probe.core import DiagStop

            self._es_watch = False
            raise DiagStop(f"--steps {self.max_steps} reached ({self._es_count} evaluation steps: "
                           "an evaluation run)", "stopped")

    def _evaluation_only(self) -> bool:
        """No training so far and no optimizer in the process (looked up once): ``--steps N`` counts
        evaluation steps in such a run."""
        if self.steps_done or self._optimizers or self._any_optimizer_step:
            return False
        if getattr(self, "_es_no_optimizer", None) is None:
            from diag.probe.core import _optimizer_alive

            self._es_no_optimizer = not _optimizer_alive()
        return self._es_no_optimizer

    def _es_claimed_by_training(self, t: float, tail_taken: bool) -> None:
        """Training begins at ``t``: an evaluation step built on fetches that training takes is dropped;
        one that evaluated ends here."""
        self._es_pend_t0, self._es_pend_dt = None, 0.0
        es = self._es
        if es is None:
            return
        if tail_taken:
            # the tail (its fetches, and the forwards after them: a teacher's) feeds the training step
            self._es = None
            self._es_watch = False
            if self._es_flops is not None:
                self._es_flops_exit(None, None)
            return
        self._es_close(t)

    def _es_finish(self) -> None:
        """The run ends: the open evaluation step closes with the pass (never a --steps stop here)."""
        self._es_finishing = True
        if self._es is not None:
            es = self._es
            last = es["start"] + es["data_s"] + es["h2d_s"] + es["forward_s"]
            ev_last = self._eval["last"] if self._eval is not None else last
            self._es_close(max(last, ev_last))
        if self._es_sites:
            sites = sorted(self._es_sites.values(), key=lambda s: -s["calls"])[:MAX_SYNC_SITES]
            self.emit(E.EVAL_SYNCS, sites=sites)
        self._es_uninstall()

    # ---- tensor-method patches (lazy) ----------------------------------------------------------------
    def _es_install(self) -> None:
        self._es_patched = True
        if "evalsyncs" in os.environ.get("DIAG_PROBE_DISABLE", ""):
            return              # no per-batch host syncs or copies counted (eval.host-sync skips)
        try:
            import torch
        except Exception:
            return
        probe = self
        Tensor = torch.Tensor
        from diag.probe.hooks import compiling_check

        compiling = compiling_check()

        # compiling() first: under torch.compile's tracing it is a constant True, so dynamo neither
        # traces diag's bookkeeping nor guards on the probe's flags (no graph break, no recompile)
        def make_sync(name, orig):
            def wrapper(t, *args, **kwargs):
                if compiling():
                    return orig(t, *args, **kwargs)
                if probe._es_watch and not probe._depth and not probe._forked:
                    probe._es_sync(name)
                return orig(t, *args, **kwargs)
            wrapper.__wrapped__ = orig
            wrapper.__doc__ = getattr(orig, "__doc__", None)
            wrapper.__name__ = name
            return wrapper

        def make_copy(name, orig):
            def wrapper(t, *args, **kwargs):
                if compiling():
                    return orig(t, *args, **kwargs)
                if probe._es_watch and probe._es_cuda and not probe._depth and not probe._forked:
                    t0 = time.perf_counter()
                    out = orig(t, *args, **kwargs)
                    try:
                        if out is not t and t.device.type == "cpu" and out.device.type == "cuda":
                            es = probe._es
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
                self.report_error("eval_steps.patch", e)
                continue
            self._es_mine.append((Tensor, name, new, own))

    # ---- FLOPs of one evaluation forward (evaluation-only runs) ----------------------------------------
    def _es_flops_enter(self) -> None:
        """Count the next evaluation step's forward with FlopCounterMode: only in a run with no training
        so far and no optimizer (an evaluation or batch-inference script; a training run's FLOPs are
        counted on a training step by the flop counter extension, and its forward FLOPs price its
        evaluation)."""
        self._es_flops_done = True
        if self.steps_done or self._optimizers or "flopcounter" in os.environ.get("DIAG_PROBE_DISABLE", ""):
            return
        try:
            from diag.probe.core import _optimizer_alive

            if _optimizer_alive() or any("compiled" in wrappers_of(m)[1] for m in self.models()):
                return
            from torch.utils.flop_counter import FlopCounterMode

            mode = FlopCounterMode(display=False)
            mode.__enter__()
            self._es_flops = mode
            if self._es is not None:
                self._es["instrumented"] = True
        except Exception as e:
            self._es_flops = None
            self.report_error("eval_steps.flops", e)

    def _es_flops_exit(self, es: dict | None, site: str | None) -> None:
        mode, self._es_flops = self._es_flops, None
        try:
            mode.__exit__(None, None, None)
        except Exception as e:
            self.report_error("eval_steps.flops", e)
            return
        if es is None or site is None:
            return
        try:
            flops = int(mode.get_total_flops())
            rec = next((v for v in self._sites.values() if v["key"] == site), None)
            ref = self._model_refs.get(rec["model"]) if rec else None
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
                     "eval_step": self._es_count + 1, "device": dev_type, "device_name": dev_name,
                     "precision": rec.get("autocast") if rec and rec.get("autocast") else dtype,
                     "analytic_flops": analytic,
                     "analytic_basis": "tokens" if es["tokens"] else "samples",
                     "ratio_to_analytic": flops / analytic if analytic else None}
            self.emit(E.SET, path="flops.eval", value=value)
        except Exception as e:
            self.report_error("eval_steps.flops", e)

    def _es_uninstall(self) -> None:
        if self._es_flops is not None:
            self._es_flops_exit(None, None)
        mine, self._es_mine = self._es_mine, []
        for owner, name, ours, orig in reversed(mine):
            try:
                if owner.__dict__.get(name) is ours:   # still ours: restore; else whoever patched after us restored
                    if orig is None:
                        delattr(owner, name)            # the inherited method shows through again
                    else:
                        setattr(owner, name, orig)
            except Exception:
                pass
        self._es_watch = False

    def _es_sync(self, op: str) -> None:
        es = self._es
        if es is None:
            return
        es["syncs"] += 1
        if self._es_located >= MAX_LOCATED:
            return
        self._es_located += 1
        try:
            from diag.probe.frames import user_frame

            f = user_frame(3)
            if f is not None:
                es["sync_at"].append((f.f_code.co_filename, f.f_lineno, f.f_code.co_name, op))
        except Exception:
            pass
