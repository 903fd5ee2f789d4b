"""Probe extension: memory. Runs in the user's process; writes into the rank section ``memory``.

What it records (shapes in docs/memory.md):

* ``memory.persistent`` once, after step 1, on every run: parameter, buffer, gradient and optimizer
  state bytes of the live model and optimizer (any device).
* CUDA runs only (skipped cleanly otherwise): ``memory.device`` once; ``memory.steps`` one record
  per step for the first 50 steps, then one at least 10 steps after the last, and the last step,
  read only on the steps the probe samples (``step["sampled"]``: its cost budget), from the allocator's counters
  (``torch.cuda.memory_stats_as_nested_dict()``: allocated, reserved, running peaks, allocation
  retries, OOMs, inactive split bytes); ``memory.breakdown`` (the peak split into parameters,
  gradients, optimizer state, activations, other) at each recorded step whose peak rose.
* ``memory.oom`` carries the failing step's batch (its forward's inputs, from the traceback).
* ``memory.capture``: the structure, shapes and dtypes of the first training forward's inputs
  (never the tensors: the shapes are copied and the references dropped at once).
* ``memory.oom`` when the script dies of an out-of-memory error: the allocator's state at that
  moment and the numbers parsed from the message.
* ``memory.estimate``: the fake-tensor replay of the step and the plan (:mod:`diag.memory.plan`).
  It runs once, and only when asked (``DIAG_MEMORY_ESTIMATE=1|plan``, set by ``diag memory``), after
  step ``DIAG_MEMORY_AT_STEP`` (1), or when a CUDA OOM ends the run (``DIAG_MEMORY_ON_OOM=0``
  turns that off): the run is dying anyway and the plan is what the OOM finding needs. The step
  after the replay is marked ``instrumented`` (timing statistics leave it out).

Configuration (environment): ``DIAG_MEMORY_CAPACITY`` (bytes of the target device; default: the live
CUDA device), ``DIAG_MEMORY_CAPABILITY`` ("9.0"), ``DIAG_MEMORY_HEADROOM`` (0.1),
``DIAG_MEMORY_BATCH`` (the training batch to plan for; default: the observed one),
``DIAG_MEMORY_EVAL_BATCH``, ``DIAG_MEMORY_BUDGET_S`` (120; 30 after an OOM).
"""
from __future__ import annotations

import gc
import os
import sys
import time
import weakref
from typing import Any

from diag.evidence import events as E
from diag.probe.hooks import remove_hooks
from diag.probe.models import find_ddp

MAX_STEP_RECORDS = 2000
# the allocator's counters are read at every step's end for the first steps (the peak settles there),
# then every RECORD_EVERY steps and at the run's end: peaks, retries and OOMs are running totals, so
# nothing a check reads is lost between two records, and a step does not pay the read (issue 20)
EVERY_STEP_UNTIL = 50
RECORD_EVERY = 10
PEAK_RISE = 0.01            # recompute the breakdown when the running peak rises by more than 1%


def _env_int(name: str) -> int | None:
    try:
        v = int(float(os.environ.get(name, "") or 0))
        return v if v > 0 else None
    except ValueError:
        return None


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


class MemoryProbe:
    def __init__(self) -> None:
        mode = os.environ.get("DIAG_MEMORY_ESTIMATE", "").strip().lower()
        self.mode = "" if mode in ("", "0", "no", "off", "false") else ("plan" if mode == "plan" else "estimate")
        self.at_step = _env_int("DIAG_MEMORY_AT_STEP") or 1
        self.on_oom = os.environ.get("DIAG_MEMORY_ON_OOM", "1").strip().lower() not in ("0", "no", "off", "false")
        self._model_ref = None
        self._spec = None
        self._spec_error: str | None = None
        self._autocast: str | None = None
        self._opts: dict[int, Any] = {}
        self._hooks: list = []
        self._estimated = False
        self._mark_next = False
        self._persistent_done = False
        self._cuda_dev = None            # torch.device when the run uses CUDA
        self._cuda_available: bool | None = None
        self._cuda_built = True          # torch was built with CUDA (read at install, no device asked)
        self._device_emitted = False
        self._last_peak = 0
        self._recorded_step = 0          # the last step whose allocator counters were recorded
        self._read_step = 0              # the last step a read was tried at (sampled steps only)
        self._replaying = False
        self._eval_capture = False       # the captured batch is an evaluation forward's (no training yet)

    # the probe's lane (diag.probe.lane) may skip its per-step hooks on unsampled steps: the allocator is
    # read on sampled steps only, and a requested estimate waits for the next step it sees
    LANE = True

    @property
    def SAMPLED_EXTRAS(self) -> bool:
        """It honours the step's ``sampled`` (the allocator is read on sampled steps only), and has
        per-step extras only with a CUDA build of torch: on a CPU build the probe's budget need not
        run for it. (Not ``torch.cuda.is_available()`` at install: that enumerates the devices before
        the script runs, and a script that sets CUDA_VISIBLE_DEVICES after importing torch would then
        see other devices than it does bare.)"""
        return self._cuda_built and self._cuda_available is not False

    # ---- interface --------------------------------------------------------------------------------
    def install(self, probe) -> None:
        self._idle(probe, "on_step_start")   # woken when a step must be marked instrumented (_mark_next)
        try:
            import torch

            self._cuda_built = bool(torch.cuda._is_compiled())
        except Exception:
            self._cuda_built = True

    def uninstall(self, probe) -> None:
        remove_hooks(self._hooks)

    def _idle(self, probe, method: str) -> None:
        idle = getattr(probe, "idle", None)
        if callable(idle):
            idle(self, method)

    def on_optimizer(self, probe, opt) -> None:
        # at its first step: the optimizers whose state the plan counts
        if self._replaying:
            return
        try:
            self._opts[id(opt)] = weakref.ref(opt)
        except TypeError:
            pass

    def on_forward(self, probe, module, args, kwargs, output, training) -> None:
        if self._eval_capture:
            # an evaluation before the first training step (a sanity check): training replaces it
            self._eval_capture = False
            self._spec = self._spec_error = None
        if self._spec is not None or self._spec_error is not None:
            return
        self._capture(probe, module, args, kwargs)
        # a training forward's batch is kept for the rest of the run: nothing more to do per forward
        idle = getattr(probe, "idle", None)
        if callable(idle):
            idle(self, "on_forward")

    def on_eval_forward(self, probe, module, args, kwargs, output, site) -> None:
        """An evaluation forward before any training: an evaluation-only run's batch (kept until a
        training forward replaces it), so the plan can find the largest evaluation batch."""
        if self._spec is not None or self._spec_error is not None or probe.steps_done:
            return
        self._eval_capture = True
        self._capture(probe, module, args, kwargs)

    def on_step_start(self, probe, index: int) -> None:
        if self._mark_next and probe.current_step is not None:
            probe.current_step.instrumented = True
            self._mark_next = False
            self._idle(probe, "on_step_start")

    def on_step_end(self, probe, step: dict) -> None:
        idx = int(step.get("index") or 0)
        if not self._persistent_done:
            self._persistent_done = True
            self._emit_persistent(probe)
        # the allocator is read on sampled steps only (the probe's cost budget; an unsampled step costs
        # this test): every one of the first EVERY_STEP_UNTIL, then one at least RECORD_EVERY steps
        # after the last read
        if step.get("sampled", True) is not False and \
                (idx <= EVERY_STEP_UNTIL or idx - self._read_step >= RECORD_EVERY):
            self._read_step = idx
            self._cuda_step(probe, idx)
        if self.mode and not self._estimated and idx >= self.at_step and probe.rank == 0:
            # one rank is enough (the plan reads rank 0); after an OOM every rank replays its own step
            self._estimate(probe, trigger="requested", budget=_env_float("DIAG_MEMORY_BUDGET_S", 120.0))
            self._mark_next = True
            wake = getattr(probe, "wake", None)
            if callable(wake):
                wake(self, "on_step_start")
        if self._cuda_available is False and (not self.mode or self._estimated or probe.rank != 0):
            self._idle(probe, "on_step_end")   # a CPU run: nothing more to do per step

    def on_exit(self, probe, status) -> None:
        exc = sys.exc_info()[1]
        try:
            from diag.probe.frames import is_oom
            oom = status == "oom" or (exc is not None and is_oom(exc))
        except Exception:
            oom = status == "oom"
        # the last step's counters (the steps in between were sampled); not after an OOM: the counters
        # then hold the failed allocation's retry and the failing step's peak (memory.oom has them),
        # which as the last step's record would read as fragmentation
        if self._cuda_available and not oom and probe.steps_done > self._recorded_step:
            try:
                self._cuda_step(probe, probe.steps_done)
            except Exception as e:
                report = getattr(probe, "report_error", None)
                if callable(report):
                    report("MemoryProbe.last_step", e)
        if oom:
            self._record_oom(probe, exc)
        cuda_oom = oom and exc is not None and ("cuda" in str(exc).lower() or type(exc).__name__ == "OutOfMemoryError")
        asked = self.mode and probe.steps_done < self.at_step and probe.rank == 0
        if not self._estimated and (asked or (cuda_oom and self.on_oom)):
            if self._spec is None and self._spec_error is None and exc is not None:
                self._capture_from_traceback(probe, exc)
            budget = _env_float("DIAG_MEMORY_BUDGET_S", 120.0) if self.mode else \
                _env_float("DIAG_MEMORY_OOM_BUDGET_S", 30.0)
            self._estimate(probe, trigger="oom" if oom else "exit", budget=budget, exc=exc)
        exc = None

    # ---- capture ----------------------------------------------------------------------------------
    def _capture(self, probe, module, args, kwargs) -> None:
        import torch

        from diag.probe.replay import InputSpec, ReplayError

        try:
            self._model_ref = weakref.ref(module)
        except TypeError:
            self._model_ref = None
        try:
            self._spec = InputSpec(args, kwargs)
        except ReplayError as e:
            self._spec_error = str(e)
        dev = "cpu"
        for p in module.parameters():
            dev = p.device.type
            break
        try:
            if torch.is_autocast_enabled(dev):
                self._autocast = str(torch.get_autocast_dtype(dev)).replace("torch.", "")
        except Exception:
            pass
        rec: dict[str, Any] = {"step": probe.steps_done + 1, "autocast": self._autocast}
        if self._eval_capture:
            rec["mode"] = "eval"
        if self._spec is not None:
            rec.update(batch=self._spec.batch, inputs=self._spec.describe()[:16])
        else:
            rec["error"] = self._spec_error
        probe.emit(E.SET, path="memory.capture", value=rec)

    @staticmethod
    def _forward_in_traceback(exc) -> tuple | None:
        """(module, args, kwargs) of the outermost module call in the exception's traceback (an OOM
        inside a forward: ``Module._call_impl(self, *args, **kwargs)``'s frame still holds them)."""
        import torch

        tb = exc.__traceback__ if exc is not None else None
        while tb is not None:
            f = tb.tb_frame
            if f.f_code.co_name in ("_call_impl", "_wrapped_call_impl"):
                loc = f.f_locals
                mod = loc.get("self")
                if isinstance(mod, torch.nn.Module):
                    return mod, loc.get("args", ()), loc.get("kwargs", {}) or {}
            tb = tb.tb_next
        return None

    def _capture_from_traceback(self, probe, exc) -> None:
        """An OOM inside the first forward: the model and its inputs are still in the traceback's
        frames; take the outermost call."""
        found = self._forward_in_traceback(exc)
        if found is not None:
            self._capture(probe, *found)
        found = None

    def _oom_batch(self, probe, exc) -> tuple[int | None, str | None]:
        """The batch of the step that ran out of memory (not the first step's, which memory.capture
        holds: a job whose batches grow, or whose last batch is larger, dies on another one): the
        failing forward's inputs, else the forwards of the step in progress (an OOM in backward or in
        the optimizer step)."""
        try:
            from diag.probe.tensors import batch_size_of

            found = self._forward_in_traceback(exc)
            if found is not None:
                n = batch_size_of(found[1], found[2])[0]
                found = None
                if n:
                    return int(n), "failing forward"
            st = getattr(probe, "current_step", None)
            if st is not None and st.samples and st.micro_batches:
                return int(st.samples) // int(st.micro_batches), "step in progress"
        except Exception:
            pass
        return None, None

    # ---- live (CUDA) ------------------------------------------------------------------------------
    def _model(self, probe):
        m = self._model_ref() if self._model_ref is not None else None
        if m is None:
            m = probe.last_model()
        return m

    def _optimizers(self) -> list:
        out = []
        for ref in list(self._opts.values()):
            o = ref()
            if o is not None:
                out.append(o)
        return out

    def _all_optimizers(self) -> list:
        opts = self._optimizers()
        if opts:
            return opts
        try:   # none has stepped yet (an OOM in the first step): look for live ones once
            import torch

            base = torch.optim.Optimizer
            return [o for o in gc.get_objects() if issubclass(type(o), base)]
        except Exception:
            return []

    def _cuda_device(self, probe):
        if self._cuda_dev is not None:
            return self._cuda_dev
        try:
            import torch

            avail = self._cuda_available
            if avail is None:   # asked once: the per-step path of a CPU run stops here (issue 20)
                avail = self._cuda_available = bool(torch.cuda.is_available())
            if not (avail and torch.cuda.is_initialized()):
                return None
            m = self._model(probe)
            dev = None
            if m is not None:
                for p in m.parameters():
                    if p.device.type == "cuda":
                        dev = p.device
                    break
            if dev is None:
                dev = torch.device("cuda", torch.cuda.current_device())
            self._cuda_dev = dev
            return dev
        except Exception:
            return None

    def _cuda_step(self, probe, idx: int) -> None:
        dev = self._cuda_device(probe)
        if dev is None:
            return
        import torch

        from diag.memory.breakdown import live_breakdown

        rec = self._stats(torch, dev, idx)
        if rec is None:
            return
        self._recorded_step = idx
        if not self._device_emitted:
            self._device_emitted = True
            p = torch.cuda.get_device_properties(dev)
            probe.emit(E.SET, path="memory.device", value={
                "type": "cuda", "index": dev.index, "name": p.name, "total": int(p.total_memory),
                "capability": [p.major, p.minor]})
        probe.emit(E.APPEND, path="memory.steps", value=rec, limit=MAX_STEP_RECORDS)
        peak = rec.get("peak") or 0
        if idx <= 2 or peak > self._last_peak * (1 + PEAK_RISE):
            self._last_peak = peak
            pers = self._persistent(probe, device_type="cuda")
            if pers is not None:
                b = live_breakdown(rec, pers)
                probe.emit(E.SET, path="memory.breakdown", value=b)

    @staticmethod
    def _stats(torch, dev, step: int) -> dict | None:
        """The allocator's counters as a step record, read as the nested dict (no flattening)."""
        from diag.memory.breakdown import step_record, step_record_nested

        nested = getattr(torch.cuda, "memory_stats_as_nested_dict", None)
        if nested is not None:
            return step_record_nested(nested(dev), step)
        return step_record(torch.cuda.memory_stats(dev), step)

    def _persistent(self, probe, device_type: str | None = None) -> dict | None:
        model = self._model(probe)
        if model is None:
            return None
        seen: set = set()

        def nbytes(t) -> int:
            local = getattr(t, "_local_tensor", None)   # a DTensor (FSDP2, tensor parallel): this rank's shard
            if local is not None:
                t = local
            if device_type is not None and t.device.type != device_type:
                return 0
            try:
                st = t.untyped_storage()
                key = (t.device.type, st.data_ptr())
                if key in seen:
                    return 0
                seen.add(key)
                return int(st.nbytes())
            except Exception:
                return int(t.numel() * t.element_size())

        params = sum(nbytes(p) for p in model.parameters())
        buffers = sum(nbytes(b) for b in model.buffers())
        grads = sum(nbytes(p.grad) for p in model.parameters() if p.grad is not None)
        opt = 0
        import torch

        for o in self._optimizers():
            for st in o.state.values():
                for v in st.values():
                    if isinstance(v, torch.Tensor):
                        opt += nbytes(v)
        return {"params": params, "buffers": buffers, "grads": grads, "optimizer_state": opt,
                "device": device_type or "any"}

    def _emit_persistent(self, probe) -> None:
        pers = self._persistent(probe)
        if pers is not None:
            probe.emit(E.SET, path="memory.persistent", value=pers)

    def _record_oom(self, probe, exc) -> None:
        from diag.memory.oom import parse_oom

        rec: dict[str, Any] = {"step": probe.steps_done + 1, "parsed": parse_oom(str(exc) if exc else "")}
        batch, source = self._oom_batch(probe, exc)
        if batch:
            rec["batch"], rec["batch_source"] = batch, source
        dev = self._cuda_device(probe)
        if dev is not None:
            try:
                import torch

                from diag.memory.breakdown import live_breakdown

                st = self._stats(torch, dev, probe.steps_done + 1)
                rec["stats"] = st
                rec["total"] = int(torch.cuda.get_device_properties(dev).total_memory)
                pers = self._persistent(probe, device_type="cuda")
                if st is not None and pers is not None:
                    rec["breakdown"] = live_breakdown(st, pers)
            except Exception as e:
                rec["stats_error"] = f"{type(e).__name__}: {e}"
        probe.emit(E.SET, path="memory.oom", value=rec)

    # ---- the replay -------------------------------------------------------------------------------
    def _capacity(self, probe, exc=None) -> tuple[int | None, str | None, Any]:
        cap = _env_int("DIAG_MEMORY_CAPACITY")
        capability = None
        c = os.environ.get("DIAG_MEMORY_CAPABILITY", "")
        if c:
            try:
                capability = [int(x) for x in c.split(".")[:2]]
            except ValueError:
                capability = None
        if cap:
            return cap, os.environ.get("DIAG_MEMORY_TARGET_NAME") or "given", capability
        dev = self._cuda_device(probe)
        if dev is not None:
            try:
                import torch

                p = torch.cuda.get_device_properties(dev)
                return int(p.total_memory), p.name, [p.major, p.minor]
            except Exception:
                pass
        if exc is not None:
            from diag.memory.oom import parse_oom

            parsed = parse_oom(str(exc))
            if parsed.get("capacity"):
                return int(parsed["capacity"]), "the OOM message's device", capability
        return None, None, capability

    def _estimate(self, probe, trigger: str, budget: float, exc=None) -> None:
        self._estimated = True
        t0 = time.perf_counter()
        result: dict[str, Any]
        self._replaying = True
        # the replay's forwards and optimizer steps are not the user's: the probe records none of them
        with probe.paused():
            try:
                result = self._plan(probe, budget, exc)
            except Exception as e:
                from diag.probe.replay import explain

                result = {"status": "skipped", "reason": explain(e)}
            finally:
                self._replaying = False
        result["trigger"] = trigger
        result["at_step"] = probe.steps_done
        result["wall_s"] = round(time.perf_counter() - t0, 3)
        probe.emit(E.SET, path="memory.estimate", value=result)

    def _plan(self, probe, budget: float, exc=None) -> dict:
        from diag.memory.plan import HEADROOM, make_plan
        from diag.probe.replay import ReplayError, StepReplay

        if self._spec is None:
            reason = self._spec_error or "no training forward was observed, so there is no input batch to replay"
            return {"status": "skipped", "reason": reason}
        model = self._model(probe)
        if model is None:
            return {"status": "skipped", "reason": "the model was no longer alive when the replay was due"}
        opts = self._all_optimizers()
        set_to_none = None
        for o in opts:
            info = probe.optimizer_info(o, create=False)
            if info and info.get("zero_grad_set_to_none") is not None:
                set_to_none = info["zero_grad_set_to_none"]
        try:
            replay = StepReplay(model, opts, self._spec, autocast=self._autocast,
                                set_to_none=True if set_to_none is None else set_to_none)
        except ReplayError as e:
            return {"status": "skipped", "reason": str(e)}
        capacity, cap_name, capability = self._capacity(probe, exc)
        facts: dict[str, Any] = {}
        ddp = find_ddp(model)
        if ddp is not None and not getattr(ddp, "gradient_as_bucket_view", False):
            facts["ddp_grad_bytes"] = sum(p.numel() * p.element_size() for p in replay.model.parameters()
                                          if p.requires_grad)
        if self._eval_capture:
            from diag.memory.plan import make_eval_plan

            plan = make_eval_plan(replay.eval, observed_batch=self._spec.batch,
                                  eval_batch=_env_int("DIAG_MEMORY_EVAL_BATCH"), capacity=capacity,
                                  headroom=_env_float("DIAG_MEMORY_HEADROOM", HEADROOM), capability=capability,
                                  facts=facts, budget_s=budget)
            plan["capacity_source"] = cap_name
            plan["replay"] = replay.describe()
            return plan
        first = replay.train(self._spec.batch)      # raises ReplayError: skipped with the reason
        facts.update(first["uses"])
        headroom = _env_float("DIAG_MEMORY_HEADROOM", HEADROOM)
        cached = {(self._spec.batch, 1): first}

        def train(b, a):
            r = cached.get((b, a))
            if r is None:
                r = cached[(b, a)] = replay.train(b, a)
            return r

        plan = make_plan(train, replay.eval, observed_batch=self._spec.batch,
                         target_batch=_env_int("DIAG_MEMORY_BATCH"),
                         eval_batch=_env_int("DIAG_MEMORY_EVAL_BATCH"), capacity=capacity,
                         headroom=headroom, capability=capability, facts=facts, budget_s=budget,
                         table=self.mode == "plan")
        plan["capacity_source"] = cap_name
        plan["replay"] = replay.describe()
        return plan
