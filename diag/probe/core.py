"""The probe: hooks installed inside the user's process that turn a training run into events, and
the step state machine that decides where a training step begins and ends.

Everything here runs in the user's process, on their hot path: keep each hook cheap (no I/O
except one JSON line per step, no allocation proportional to tensors, no synchronisation).

Events are dicts ``{"kind": ..., "t": seconds since install, "rank": r, ...}`` handed to a sink
(:mod:`diag.probe.sink`). The folding of events into Evidence is in :mod:`diag.fold` (which must
stay torch-free).

The probe is split by concern:

- :mod:`diag.probe.sink`         where events go (a JSON-lines file, or a callback);
- :mod:`diag.probe.frames`, :mod:`~diag.probe.tensors`, :mod:`~diag.probe.models`,
  :mod:`~diag.probe.environment`: introspection (the user's frame, the tensors a forward holds,
  model descriptions, the environment);
- :mod:`diag.probe.hooks`        undoing hooks and patches;
- :mod:`diag.probe.context`      the extension interface (``ProbeContext``, ``Extension``);
- this module                    the ``Probe``: torch hooks and the step state machine.

Extensions (``diag.probe.extensions``) add their own observations through
:class:`diag.probe.context.Extension` hooks; the probe passes itself to them as a
:class:`~diag.probe.context.ProbeContext`, and they use nothing of it beyond that interface.
"""
from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Callable

from diag.evidence import events as E
from diag.probe.environment import ENV_ALLOWLIST, environment
from diag.probe.frames import (_LIB_CACHE, exception_info, frame_location, is_library_file, is_oom, line_of,
                               set_user_script, user_frame)
from diag.probe import marks
from diag.probe.handover import HandOver, handover_enabled, remove_global_hook
from diag.probe.hooks import (DiagStop, OptimizerCensus, Patches, _never, compiling_check, hot_first, inside_step,
                              optimizer_alive, remove_hooks, run_eagerly)
from diag.probe.quiet import silence_hook_warnings
from diag.probe.models import (MAX_LAYER_SHAPES, describe_model, device_type, find_ddp, has_parameters,
                               wrappers_of)
from diag.probe.sink import FileSink
from diag.probe import children
from diag.probe.budget import CORE_UNSEEN, Budget
from diag.probe.evalsteps import EvalWatch
from diag.probe.lane import Lane, calibrate_entry_ns, lane_enabled, no_closure
from diag.probe.stepmachine import Step as _Step
from diag.probe.stepmachine import StepMachine, closure_of, timed_closure, with_closure
from diag.probe.steps import batch_samples, detect_framework, install_manual_update
from diag.probe.tensors import (TorchState, batch_size_of, first_tensor, grad_tensor, grad_tensors, on_backward,
                                output_grad_tensors, samples_of)

# former private names, kept for code that imported them from here
_is_library_file = is_library_file
_has_parameters = has_parameters
_device_type = device_type
_compiling = _never     # torch.compiler.is_dynamo_compiling once a probe is installed (hooks.compiling_check)
# what the hooks read on a lane step, in the order they do: first in the probe's dict (hooks.hot_first)
HOT = ("active", "_forked", "_lane", "depth", "in_backward", "_in_data", "_handover", "steps", "forward_start",
       "_top_module", "_top_depth", "_seek_model", "_ext_live", "own_ns", "_last_sampled", "_site_dirty",
       "_opt_start", "_opt_inner")


_TorchState = TorchState   # (moved to diag.probe.tensors: the hand-over's lane path reads it too)


# ---------------------------------------------------------------------------------------------------
# the probe

class Probe:
    """Torch hooks, and the step machine they feed (``self.steps``, :class:`StepMachine`, which it
    owns and serves as its :class:`~diag.probe.stepmachine.Listener`). Extensions receive the probe
    as their :class:`~diag.probe.context.ProbeContext` and use only that interface."""

    def __init__(self, sink: Callable[[dict], None], *, max_steps: int | None = None,
                 rank: int = 0, local_rank: int = 0, world_size: int = 1,
                 extensions: list | None = None, script: str | None = None):
        self.sink = sink
        self.max_steps = max_steps
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.script = script
        self.t0 = time.perf_counter()
        self.wall0 = time.time()
        self.pid = os.getpid()
        self.active = False
        self._forked = False
        self._handles: list = []
        self._patches = Patches()
        self._globals = None                    # the global hooks when the hand-over is off
        self._lifted = marks.Lifted()          # diag's hooks out of torch.jit.script/trace, export, fx
        self._iters: dict[int, list] = {}       # id(DataLoader iterator) -> [weakref, loader id, first batch?,
        #                                          batches, ended]
        self._last_iter: dict[int, list] = {}   # loader id -> its newest iterator's record (a peek is no epoch)
        self.extensions = list(extensions or [])
        # state
        self.depth = 0
        self.forward_start = 0.0
        self._top_module = None
        self._top_depth = 0          # the depth the model forward runs at (1, or deeper under a bare one)
        self._bare_start = 0.0       # a parameterless outermost forward (a loss module): when it began
        self._bare_had_model = False
        self._seek_model = False     # inside a parameterless outermost forward, no model seen yet
        self.forward_counts_samples = True   # the training forward being reported adds to the step's samples
        self.sampled = True          # the step in progress is a sampled one (ProbeContext.sampled; issue 28)
        self._in_data = 0
        self.in_backward = False
        self._bwd_start = 0.0
        self._opt_start: dict[int, float] = {}
        self._opt_inner: dict[int, int] = {}    # id(optimizer) -> its steps running inside its step (_opt_pre)
        self._models: dict[int, int] = {}        # id(module) -> model id
        self._model_device: dict[int, str] = {}  # model id -> device type of its first parameter
        self._model_refs: dict[int, Any] = {}    # model id -> weakref
        self._model_inner: dict[int, Any] = {}   # model id -> the module inside its wrappers (DDP, compile)
        self._fwd_models: dict[int, tuple] = {}  # id(module) -> (weakref, model id, device type): one lookup
        self._sites: dict[tuple, dict] = {}
        self._site_counts: dict[str, int] = {}
        self._site_dirty: set[str] = set()
        self._loaders: dict[int, dict] = {}      # id(loader) -> info
        self._loaders_by_lid: dict[int, dict] = {}   # info["id"] -> info (per batch: one lookup)
        self._loader_refs: dict[int, Any] = {}
        self._optimizers: dict[int, dict] = {}
        self._opt_seen: dict[int, Any] = {}      # id(optimizer) -> weakref, once it stepped
        self._last_model = None                  # weakref to the last top-level training model
        self.errors_reported: set[str] = set()
        self._env_refreshed = False
        self.lock = threading.RLock()
        # issue 20: the hook hand-over and the probe's own cost
        self._handover: HandOver | None = None
        self._eager_opt_pre = self._eager_opt_post = None   # for compiled code (prepare_compiled)
        self.compile_used = False     # torch.compile was called in this process (a model, a function, a step)
        self._bwd_twins: list = []    # (autograd wrapper, [its eager twin]) (_wrap_backward)
        self._has_params: dict[int, tuple] = {}   # id(module) -> (weakref, has parameters)
        self.own_ns = 0              # the probe's own time (hook bodies, extensions, sink), nanoseconds
        self._own_mark = 0            # own_ns at the previous step event
        self._ext_ns: dict[str, int] = {}   # per extension (inside own_ns)
        self._sink_ns = 0                   # emitting events (inside own_ns)
        self.slow_path_ns = 0.0       # torch's cost of a global hook pair per module call (measured at install)
        # what the probe's own timer cannot see (issue 20), calibrated once at install (_calibrate):
        # torch's slow path of a module carrying the probe's hooks and the hook trampolines, per hooked
        # forward; the autograd engine calling back into Python (node pre-hook and end callback), per backward
        self.hooked_call_ns = 0.0
        self.autograd_hook_ns = 0.0
        self._bwd_calls = 0           # _bwd_hook invocations (autograd called into the probe)
        self._bwd_wrapped = False     # backwards are timed by wrapping torch.autograd.backward / grad
        self._est_ns = 0.0            # the estimated part so far (inside own_s, not in own_ns)
        self._est_marks = (0, 0, 0)   # (window calls, hooked forwards, backward calls) at the previous step event
        # the step model (diag.probe.stepmachine): owned, fed by the hooks below, concluding through
        # this probe's Listener methods; evaluation steps' torch side (diag.probe.evalsteps)
        self.steps = StepMachine(self, t0=self.t0, loaders=self._loaders_by_lid)
        self._evals = EvalWatch(self)
        self._close_ns = 0            # when the step being closed began to close (step_closed)
        self._finishing = False       # finish() runs: a step it closes does not stop the run
        # the cost budget (diag.probe.budget): which steps the extensions' per-step extras run on
        # (self.sampled); on while an extension that honours it is live (SAMPLED_EXTRAS)
        self._budget: Budget | None = None
        self._budget_exts: tuple = ()         # the class names whose time is the extras
        self._budget_checked_n = -1           # len(extensions) when _budget_exts was last looked up
        self._extras_ns = 0                   # the extras' cumulative time at the last step's accounting
        self._step_sink: tuple | None = None  # (sink, its file sink, tags): the step event's fast path
        self._last_core_s = 0.0               # the last accounted step's probe time, core and extras
        self._last_extras_s = 0.0
        self._last_sampled = True             # whether that step was sampled (its extras ran)
        # the lane (diag.probe.lane): the unsampled steps of a plain loop on a short path
        self._lane = Lane(lane_enabled())
        self._census = OptimizerCensus()
        self._ext_ver = 0                     # bumped when an extension hook goes idle or wakes

    # ---- events ------------------------------------------------------------------------------------
    def now(self) -> float:
        return time.perf_counter() - self.t0

    def emit(self, kind: str, **data) -> None:
        self.emit_dict(kind, data)

    def emit_dict(self, kind: str, data: dict) -> None:
        """:meth:`emit` of a dict the caller hands over (not copied: the per-step event)."""
        if self._forked:
            return
        if self._lane.qbuf:
            self.flush_lane()    # (the lane's quiet steps first: the file keeps the order of emission)
        data["kind"] = kind
        # rounded to the µs by float arithmetic: round(x, 6) converts through a decimal string, ~0.2 µs
        # warm and several µs after a deep step's work evicted it from the caches (issue 20); the
        # printed value is the same
        data["t"] = int((time.perf_counter() - self.t0) * 1e6 + 0.5) / 1e6
        data["rank"] = self.rank
        t0 = _ns()
        try:
            self.sink(data)
        except Exception as e:  # never break the user's run because of our output
            self.report_error("sink", e)
        self._sink_ns += _ns() - t0

    def flush_lane(self, any_thread: bool = False) -> None:
        """The quiet steps the lane keeps on the step's thread (diag.probe.lane.Lane.flush), onto the sink:
        from the step's thread only (it appends to them), unless the process is about to end."""
        lane = self._lane
        if lane.qbuf and (any_thread or lane.tid == threading.get_ident()):
            try:
                lane.flush(self)
            except Exception as e:
                self.report_error("lane", e)

    def report_error(self, where: str, e: BaseException) -> None:
        """A ``probe_error`` event, once per ``where``; never raises."""
        if where in self.errors_reported:
            return
        self.errors_reported.add(where)
        try:
            self.sink({"kind": E.PROBE_ERROR, "t": self.now(), "rank": self.rank, "where": where,
                       "error": f"{type(e).__name__}: {e}",
                       "traceback": traceback.format_exc(limit=8)})
        except Exception:
            pass

    @property
    def extensions(self) -> list:
        return self._extensions

    @extensions.setter
    def extensions(self, value) -> None:
        self._extensions = value
        self._ext_fns = {}
        self._ext_live: dict[str, bool] = {}   # method -> whether any extension implements it (hot paths
        self._ext_n = len(value)               # check it before calling _ext: a call saved per hook)
        self._ext_idle: set = set()     # (id(extension), method) no longer called (Probe.idle)
        self._ext_ver = getattr(self, "_ext_ver", 0) + 1
        lane = getattr(self, "_lane", None)
        if lane is not None and lane.on:
            lane.hand_back(self)
        if not hasattr(self, "_ext_once_ns"):
            self._ext_once_ns: dict[str, int] = {}   # per extension: install, on_exit, uninstall

    def _ext(self, method: str, *args) -> None:
        # the extensions that implement `method`, looked up once per method (issue 20: this runs
        # several times per step; a getattr per extension and call was a visible part of the step)
        exts = self._extensions
        fns = self._ext_fns.get(method)
        if fns is None or self._ext_n != len(exts):   # (an extension appended to the list: look again)
            if self._ext_n != len(exts):
                self._ext_fns = {}
                self._ext_live = {}
                self._ext_n = len(exts)
            idle = self._ext_idle
            fns = self._ext_fns[method] = [(ext, type(ext).__name__, getattr(ext, method))
                                          for ext in exts if getattr(ext, method, None) is not None
                                          and (id(ext), method) not in idle]
            self._ext_live[method] = bool(fns)
        # the run's start and end (install, on_exit: a memory replay, a capture) are not per-step
        # work: they are kept apart, so that the per-step parts name what a step pays
        ext_ns = self._ext_ns if method not in _ONCE else self._ext_once_ns
        for ext, name, fn in fns:
            t0 = _ns()
            try:
                fn(self, *args)
                ext_ns[name] = ext_ns.get(name, 0) + _ns() - t0
            except DiagStop:
                raise
            except Exception as e:
                self.report_error(f"{name}.{method}", e)
                if method != "uninstall":
                    self.disable(ext)

    # ---- the extension interface (diag.probe.context.ProbeContext) -----------------------------------
    # the step model's state, read through the probe (plain reads of the machine's attributes)
    @property
    def manual_mode(self) -> bool | None:
        return self.steps.manual_mode

    @property
    def current_step(self) -> _Step | None:
        lane = self._lane
        if lane.phase > lane.rest:    # a step the lane is taking: the machine gets it first (diag.probe.lane)
            self.lane_off()
        return self.steps.current

    @property
    def steps_done(self) -> int:
        return self.steps.done

    @property
    def epoch(self) -> int:
        return self.steps.epoch

    @property
    def step_closed_at(self) -> float:
        return self.steps.closed_at

    @property
    def last_batch_samples(self) -> int | None:
        return self.steps.last_batch_samples

    @property
    def eval_passes(self) -> int:
        return self.steps.eval_passes

    @property
    def last_boundary(self) -> float | None:
        return self.steps.last_boundary

    _eval_passes = eval_passes          # the names the timeline extension read before issue 28
    _last_boundary = last_boundary

    def forward_calls(self) -> int:
        """Top-level forwards seen so far, every call site together."""
        return sum(self._site_counts.values())

    def is_live(self) -> bool:
        return self.active and not self._forked

    def model_id(self, module) -> int | None:
        return self._models.get(id(module))

    def models(self) -> list:
        out = []
        for ref in list(self._model_refs.values()):
            try:
                m = ref()
            except Exception:
                m = None
            if m is not None:
                out.append(m)
        return out

    def last_model(self):
        ref = self._last_model
        return ref() if ref is not None else None

    def is_top_forward(self, module) -> bool:
        return self.depth == 1 and module is self._top_module

    def phase(self) -> str:
        if self._in_data:
            return "data"
        if self.in_backward:
            return "backward"
        if self.depth > 0:
            return "forward"
        return "other"

    @contextlib.contextmanager
    def paused(self):
        was_active = self.active
        self.active = False
        try:
            yield self
        finally:
            self.active = was_active
            # optimizer steps begun while paused never reach the post hook's bookkeeping
            for o in list(self._opt_start):
                if o not in self._optimizers:
                    self._opt_start.pop(o, None)
                    self._opt_inner.pop(o, None)

    def module_has_parameters(self, module) -> bool:
        """``has_parameters(module)``, cached per module (asked on every outermost forward; a module
        that gets a parameter later is forgotten by the hand-over's registration hook). Keyed by id with
        a weak reference that proves the module is the same one: one dict lookup and a C call, where a
        WeakKeyDictionary's ``get`` is a Python frame (issue 20)."""
        ent = self._has_params.get(id(module))
        if ent is not None and ent[0]() is module:
            return ent[1]
        v = has_parameters(module)
        if len(self._has_params) >= 4096:   # modules built and dropped over a long run: start again
            self._has_params.clear()
        try:
            self._has_params[id(module)] = (weakref.ref(module), v)
        except TypeError:
            pass
        return v

    def forget_parameters(self, module) -> None:
        self._has_params.pop(id(module), None)

    def own_cost(self) -> dict:
        """The probe's own time so far, by part (seconds), and the hand-over's windows."""
        ext = {k: v / 1e9 for k, v in self._ext_ns.items()}
        timed = self.own_ns / 1e9
        sink = self._sink_ns / 1e9
        est = self._est_ns / 1e9
        ho = self._handover
        out = {"own_s": timed + est, "timed_s": timed, "estimated_s": est,
               "by_part": {"hooks": max(timed - sink - sum(ext.values()), 0.0), "sink": sink, **ext,
                           "estimated": est},
               "slow_path_us_per_call": round(self.slow_path_ns / 1e3, 4),
               "calibration_us": {"global_hook_pair_per_module_call": round(self.slow_path_ns / 1e3, 4),
                                  "hooked_forward": round(self.hooked_call_ns / 1e3, 4),
                                  "backward_callbacks": round(self.autograd_hook_ns / 1e3, 4)},
               "handover": ho is not None}
        mark = getattr(self, "_parts_mark", None)
        if mark is not None:    # the same parts after the first steps: what a steady step pays, by part
            index, own0, sink0, est0, ext0 = mark
            ext_d = {k: (v - ext0.get(k, 0)) / 1e9 for k, v in self._ext_ns.items()}
            timed_d, sink_d = (self.own_ns - own0) / 1e9, (self._sink_ns - sink0) / 1e9
            out["by_part_steady"] = {"hooks": max(timed_d - sink_d - sum(ext_d.values()), 0.0), "sink": sink_d,
                                     **ext_d, "estimated": (self._est_ns - est0) / 1e9}
            out["steady_after_step"] = index
        if self._ext_once_ns:   # the extensions' work at the run's start and end, outside any step
            out["once_s"] = {k: v / 1e9 for k, v in self._ext_once_ns.items()}
        writer = getattr(self.sink, "writer_ns", None)   # FileSink's writer thread (TaggedSink passes it on)
        if isinstance(writer, int):
            out["writer_s"] = writer / 1e9
            out["writer_steps"] = self.steps_done
        if ho is not None:
            out.update(ho.summary())
        return out

    def idle(self, extension, method: str) -> None:
        """Stop calling ``extension``'s ``method``: it has nothing more to do there (issue 20: every
        call on the per-step path costs, several times its warm cost after a step's work)."""
        self._ext_idle.add((id(extension), method))
        self._ext_fns.pop(method, None)
        self._ext_live.pop(method, None)
        self._ext_ver += 1

    def wake(self, extension, method: str) -> None:
        """Call ``extension``'s ``method`` again after :meth:`idle` (an extension that idles a per-step
        hook until something it needs shows up: a convolutional model, a DDP model)."""
        self._ext_idle.discard((id(extension), method))
        self._ext_fns.pop(method, None)
        self._ext_live.pop(method, None)
        self._ext_ver += 1
        if self._lane.on:          # it may want this very step: the full path takes it from here
            self._lane.hand_back(self)

    def disable(self, extension) -> None:
        try:
            self._extensions.remove(extension)
        except ValueError:
            pass
        self._ext_fns = {}
        self._ext_live = {}
        self._ext_n = len(self._extensions)

    # ---- install / uninstall -----------------------------------------------------------------------
    def install(self, scan_modules: bool = False) -> "Probe":
        """Install the hooks. ``scan_modules``: the script already built its models (``diag.watch()``):
        find them once in the garbage collector's objects."""
        import torch
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)
        from torch.utils.data import dataloader as dl

        global _compiling
        _TorchState.bind()
        _compiling = compiling_check()
        self.active = True
        set_user_script(self.script)
        self.emit(E.START, pid=self.pid, host=socket.gethostname(), local_rank=self.local_rank,
                  world_size=self.world_size, started_at=self.wall0, script=self.script,
                  argv=list(sys.argv))
        self.emit(E.ENV, **environment())
        self.slow_path_ns, self.hooked_call_ns, self.autograd_hook_ns = _calibrate()
        if self._lane.allowed:
            self._lane.entry_ns = calibrate_entry_ns()
            self._lane.core_ns = None
            self._lane.cores = []
        if handover_enabled():
            self._handover = HandOver(self).install(scan=scan_modules)
            self._lifted.register(self._handover)
        else:
            fwd_pre, fwd_post = self.fwd_pre, self.fwd_post

            def g_pre(module, args):          # traced to nothing under torch.compile (hooks.compiling_check)
                return None if _compiling() else fwd_pre(module, args)

            def g_post(module, args, kwargs=None, output=None):
                return None if _compiling() else fwd_post(module, args, kwargs, output)

            self._globals = marks.GlobalHooks(g_pre, g_post).add()
            self._lifted.register(self._globals)
        try:   # nothing of diag in a pickled, copied, scripted or traced module (diag.probe.marks)
            marks.install(self._patches, self._lifted,
                          self._handover.restored if self._handover is not None else None)
        except Exception as e:
            self.report_error("marks", e)
        self._handles.append(register_optimizer_step_pre_hook(self._opt_pre))
        self._handles.append(register_optimizer_step_post_hook(self._opt_post))
        try:    # the live optimizers, counted as they are made (not a gc scan inside a step)
            self._census.install(self._patches, scan=scan_modules)
        except Exception as e:
            self._census.ok = False
            self.report_error("optimizer census", e)

        probe = self
        # torch.compile: the step-marking hooks get their eager twins before anything is traced
        # (hooks.compiling_check; made here, not at install: torch._dynamo takes a second to import)
        orig_compile = getattr(torch, "compile", None)
        if callable(orig_compile):
            @functools.wraps(orig_compile)
            def compile(*args, **kwargs):
                probe.compile_used = True      # (the FLOP counter counts no step of a process that compiles)
                if probe._handover is not None:
                    probe._handover.give_call()   # (never compiled through the lane's call: HandOver.take_call)
                try:
                    probe.prepare_compiled()
                except Exception as e:
                    probe.report_error("torch.compile", e)
                return orig_compile(*args, **kwargs)

            self.patch(torch, "compile", compile)
        try:
            self._wrap_backward(torch)
        except Exception as e:   # the per-forward node hooks time the backward instead
            self.report_error("autograd.backward", e)
        if "torch._dynamo" in sys.modules:   # imported before the probe (diag.watch() in a notebook)
            self.prepare_compiled()
        orig_iter = dl.DataLoader.__iter__
        orig_next = dl._BaseDataLoaderIter.__next__

        def __iter__(loader):
            it = orig_iter(loader)
            t0 = _ns()
            try:
                probe._on_loader_iter(loader, it)
            except Exception as e:
                probe.report_error("dataloader.__iter__", e)
            probe.own_ns += _ns() - t0
            return it

        sm = self.steps
        iters, by_lid, tensor_cls = self._iters, self._loaders_by_lid, torch.Tensor
        lane = self._lane

        def stopped(it) -> None:   # the iterator's pass ended (StopIteration)
            try:
                rec = probe._iters.get(id(it))
                if rec is not None:
                    rec[4] = True
                sm.pass_ended(probe._iter_lid(it))
            except Exception as e:
                probe.report_error("dataloader.StopIteration", e)

        def __next__(it):
            if not probe.active or probe._forked:
                return orig_next(it)
            if lane.on:
                if lane.phase == 5 and id(it) == lane.it_id:
                    # the step's optimizer-step group ends at this fetch (other optimizers are alive)
                    lane.close(probe, _ns(), lane.o_end)
                if lane.on and lane.phase < 4 and lane.phase != 2 and id(it) == lane.it_id:
                    # the lane (diag.probe.lane): the step's batch and its clock values; gradient accumulation:
                    # after a backward with no optimizer step, the step's next micro-batch; before a forward,
                    # a batch fetched ahead (the Trainer fetches a step's micro-batches first); the loader's
                    # record counts the lane's fetches at the lane's end (Lane.settle_counts)
                    probe._in_data += 1
                    t0 = _pc()
                    try:
                        batch = orig_next(it)
                    except StopIteration:
                        probe._in_data -= 1
                        if lane.phase:
                            lane.hand_back(probe)   # a step's micro-batches, its optimizer step not run
                        else:
                            lane.off(probe)     # (at a step's boundary: nothing to hand back)
                        stopped(it)
                        raise
                    except BaseException:
                        probe._in_data -= 1
                        if lane.phase:
                            lane.hand_back(probe)
                        else:
                            lane.off(probe)
                        raise
                    dt = _pc() - t0
                    probe._in_data -= 1
                    lane.nb += 1
                    lane.wsum += dt
                    if dt > lane.wmax:
                        lane.wmax = dt
                    n = _batch_samples(batch, tensor_cls)
                    if n is not None:
                        sm.last_batch_samples = n
                    if lane.phase == 1:
                        # fetched ahead of its forward (Lane.queue); before the step's first forward, its
                        # wait is not the main thread's own work before it (pre_forward_s: Lane.lead)
                        lane.queue.append((t0, dt))
                        lane.acc = True
                        if not lane.mbs:
                            lane.lead += dt
                        return batch
                    if lane.phase:
                        lane.push()          # (phase 1: the next micro-batch, in a closure too)
                    else:
                        lane.phase = lane.pf     # (1; 8 in the closure mode: the optimizer's step comes next)
                    lane.t_fetch = t0
                    lane.dt_fetch = dt
                    return batch
                if lane.on:
                    lane.hand_back(probe)
            if sm.current is not None:
                sm.before_fetch(time.perf_counter())   # may close the last step: not data wait
                if lane.on and lane.phase == 0 and id(it) == lane.it_id:
                    return __next__(it)   # that close armed the lane: this fetch is its first step's
            n0 = _ns()
            t0 = n0 * 1e-9      # (perf_counter's clock)
            if probe._ext_live.get("on_data", True):
                probe._ext("on_data", "start")
                probe.own_ns += _ns() - n0
            # (else the few lines since n0 are left in the data wait, untimed: a clock read costs more)
            probe._in_data += 1
            try:
                batch = orig_next(it)
            except StopIteration:
                probe._in_data -= 1
                stopped(it)
                raise
            except BaseException:
                probe._in_data -= 1
                raise
            probe._in_data -= 1
            n0, closed = _ns(), sm.done
            if probe._ext_live.get("on_data", True):
                probe._ext("on_data", "end")
                dt = time.perf_counter() - t0
            else:
                dt = n0 * 1e-9 - t0   # (perf_counter_ns is perf_counter's clock: one read less)
            # the batch's record, here in the wrapper (per batch: issue 28); batch_samples' common case first
            rec = iters.get(id(it))
            if rec is not None and (rec[0] is None or rec[0]() is it):
                lid = rec[1]
                info = by_lid.get(lid)
                if info is not None:
                    info["batches"] += 1
                    info["wait_s"] += dt
                    if dt > info["max_wait_s"]:
                        info["max_wait_s"] = dt
                    rec[3] += 1
                    if rec[2]:
                        rec[2] = False
                        info["first_batch_s"].append(round(dt, 6))
                        if len(info["first_batch_s"]) > 200:
                            del info["first_batch_s"][0]
                    lane.fetch = (id(it), rec, info)   # what the lane would expect (Lane.consider)
                else:
                    lane.fetch = None
            else:
                lid = None
                lane.fetch = None
            n = _batch_samples(batch, tensor_cls)
            if n is not None:
                sm.last_batch_samples = n
            sm.fetched(lid, t0, dt)
            if sm.done == closed:   # a step closed in there counted itself
                probe.own_ns += _ns() - n0
            return batch

        self.patch(dl.DataLoader, "__iter__", __iter__)
        self.patch(dl._BaseDataLoaderIter, "__next__", __next__)

        orig_zero_grad = torch.optim.Optimizer.zero_grad
        optimizers = self._optimizers

        def zero_grad(opt, set_to_none: bool = True):
            if _compiling():
                return orig_zero_grad(opt, set_to_none)
            t0 = _ns()
            out = orig_zero_grad(opt, set_to_none)
            n0 = _ns()
            if lane.on and id(opt) == lane.opt_id and probe.active and not probe._forked:
                # the lane's optimizer: counted in its record at the lane's end (Lane.settle_counts)
                lane.zg_n += 1
                lane.zg_ns += n0 - t0
                lane.zg_none = set_to_none
                return out      # (untimed: priced as one of the lane's hook entries, lane.ENTRIES)
            if not probe._forked and probe.active:
                try:   # zero_grad's record, here in the wrapper (per step: issue 28)
                    info = optimizers.get(id(opt)) or probe.optimizer_info(opt)
                    info["zero_grad_calls"] += 1
                    info["zero_grad_s"] += (n0 - t0) / 1e9
                    info["zero_grad_set_to_none"] = bool(set_to_none)
                except Exception as e:
                    probe.report_error("zero_grad", e)
            probe.own_ns += _ns() - n0
            return out

        self.patch(torch.optim.Optimizer, "zero_grad", zero_grad)

        # the sink may hold the last step events for up to 0.2 s (diag.probe.sink): a script that ends
        # with os._exit (no atexit, no finally) must not lose them
        orig_exit = os._exit
        flush = getattr(self.sink, "flush", None)
        if callable(flush):
            def _exit(code, _orig=orig_exit, _flush=flush):
                try:
                    probe.flush_lane(any_thread=True)
                    _flush()
                except BaseException:
                    pass
                _orig(code)

            self.patch(os, "_exit", _exit)

            # os.exec* replaces the process image: the waiting steps are written first (issue 27,
            # class 18); os.execl/execlp/execvp/execvpe all end in one of these two
            def _execer(orig_exec):
                def exec_(*args, _orig=orig_exec, _flush=flush):
                    try:
                        probe.flush_lane(any_thread=True)
                        _flush()
                    except BaseException:
                        pass
                    return _orig(*args)
                exec_.__wrapped__ = orig_exec
                exec_.__name__ = orig_exec.__name__
                exec_.__doc__ = orig_exec.__doc__
                return exec_

            for name in ("execv", "execve"):
                if callable(getattr(os, name, None)):
                    self.patch(os, name, _execer(getattr(os, name)))
        try:
            install_manual_update(self, torch)   # diag.probe.steps: the update of a loop without torch.optim
        except Exception as e:
            self.report_error("no_grad", e)
        os.register_at_fork(after_in_child=self._after_fork)
        try:
            children.install(self)    # follow training into multiprocessing children (diag.probe.children)
        except Exception as e:
            self.report_error("children", e)
        self._unsilence = silence_hook_warnings()   # torch.compile's warning about diag's global hooks
        # the attributes a lane step reads, first in the probe's dict (diag.probe.hooks.hot_first)
        hot_first(self, HOT)
        self._ext("install")
        return self

    def _wrap_backward(self, torch) -> None:
        """Time every backward from its call: ``torch.autograd.backward`` (``Tensor.backward`` calls it)
        and ``torch.autograd.grad``. One Python call per backward, nothing registered per forward and no
        callback from the autograd engine (issue 20: a node pre-hook per training forward and the engine
        calling back into Python twice per backward cost more than the whole wrapper)."""
        import torch.autograd as ag

        probe = self
        sm = self.steps
        lane = self._lane
        self._bwd_twins = []

        # torch.compile's backend (AOTAutograd, under inductor or aot_eager) traces the backward graph with
        # torch.autograd.grad on functional fake tensors while it compiles: not a backward of the script's
        # (counted as one, a compiled model's first steps had two backwards, the first 5x its length). The
        # grad wrapper asks torch.compiler.is_compiling (True there; is_dynamo_compiling is not): ~0.2 µs a
        # call of autograd.grad, which a training step rarely makes (.backward() goes through autograd.backward)
        in_compile = getattr(getattr(torch, "compiler", None), "is_compiling", None) or _never

        def _wrap(orig, name, check_compile=False):
            eager = [None]    # the wrapper behind torch._dynamo.disable (prepare_compiled)

            def wrapper(*args, **kwargs):
                if _compiling():   # a backward inside compiled code: a graph break without diag too
                    f = eager[0]
                    return f(*args, **kwargs) if f is not None else orig(*args, **kwargs)
                if check_compile and in_compile():
                    return orig(*args, **kwargs)     # torch.compile's own tracing of a backward graph
                if probe.in_backward or probe._forked or not probe.active:
                    return orig(*args, **kwargs)   # nested (a reentrant checkpoint's recomputation), or paused
                if lane.on and lane.phase != 2:
                    lane.hand_back(probe)
                probe.in_backward = True
                start = _pc()   # (setting the flag above: tens of ns, left in the backward)
                try:
                    return orig(*args, **kwargs)
                finally:
                    t0 = _ns()
                    probe.in_backward = False
                    if lane.on and lane.phase == 2:   # the lane's backward (diag.probe.lane)
                        lane.b_start = start
                        lane.b_end = t0 * 1e-9   # (perf_counter's clock)
                        lane.phase = 3
                    else:
                        end = t0 * 1e-9
                        try:             # Probe._backward_done, inlined (per step: issue 28)
                            sm.backward(start, end)
                        except DiagStop:
                            raise
                        except Exception as e:
                            probe.report_error("backward", e)
                        finally:
                            probe.own_ns += _ns() - t0

            wrapper.__wrapped__ = orig
            wrapper.__name__ = name
            wrapper.__qualname__ = name
            wrapper.__doc__ = orig.__doc__
            wrapper.__module__ = orig.__module__
            self._bwd_twins.append((wrapper, eager))
            return wrapper

        self.patch(ag, "backward", _wrap(ag.backward, "backward"))
        self.patch(ag, "grad", _wrap(ag.grad, "grad", check_compile=True))
        self._bwd_wrapped = True

    def _backward_done(self, start: float, end: float) -> None:
        t0 = _ns()
        try:
            self.steps.backward(start, end)
        except DiagStop:
            raise
        except Exception as e:
            self.report_error("backward", e)
        self.own_ns += _ns() - t0

    def lane_off(self) -> None:
        """Turn the lane off, handing the step it was taking to the step machine (diag.probe.lane): the
        run ends, a child process closes its step, anything that reads the machine from outside a hook."""
        if self._lane.on:
            try:
                self._lane.hand_back(self)
            except Exception as e:
                self.report_error("lane", e)

    def _after_fork(self) -> None:
        # DataLoader workers (and other forks) inherit the hooks: they must stay silent.
        self._forked = True
        self._lane.qbuf = []      # (the parent's quiet steps: the parent writes them)
        self._lane.q_extra = 0

    silence = _after_fork

    def become_child(self, sink) -> None:
        """The inherited (forked) probe, turned back on for a child process that trains
        (diag.probe.children): fresh step state, no extensions (their per-run work belongs to the
        parent), events to ``sink`` (one that only counts)."""
        self.lane_off()
        lane = self._lane
        lane.streak, lane.sig, lane.fwd, lane.fetch, lane.optc = 0, None, None, None, None
        self.sink = sink
        self.extensions = []
        self.pid = os.getpid()
        self.child = True
        self.t0 = time.perf_counter()
        self.depth = 0
        self._in_data = 0
        self.in_backward = False
        self._opt_start = {}
        self._opt_inner = {}
        self._top_module = None
        self._seek_model = False
        self.max_steps = None
        self.steps.reset(self.t0)     # in place: the patched methods hold the machine
        self.steps.optimizers_known = len(self._optimizers)
        self._evals.watch = False
        self._forked = False

    def patch(self, owner, name: str, new) -> None:
        """Replace ``owner.name`` for the run (undone at uninstall, newest first)."""
        self._patches.patch(owner, name, new)

    _patch = patch

    def uninstall(self) -> None:
        if not self.active:
            return
        self.active = False
        if self._handover is not None:
            self._handover.uninstall()
        if self._globals is not None:
            self._globals.remove()
        self._evals.uninstall()   # diag.probe.evalsteps: its lazily patched tensor methods
        for h in self._handles:
            remove_global_hook(h)   # also torch's with_kwargs leak (a compile warning for ever after)
        remove_hooks(self._handles)
        # the extensions first: they patched after the probe (both wrap torch.compile), newest first
        self._ext("uninstall")
        self._patches.undo()
        if getattr(self, "_unsilence", None) is not None:
            self._unsilence()
        if children._PARENT is self:
            children._PARENT = None     # (nothing of a probe that ended stays reachable from diag's modules)

    # ---- end of run --------------------------------------------------------------------------------
    def finish(self, status: str, exit_code: int | None = None, exception: BaseException | None = None,
               reason: str | None = None) -> None:
        """Flush what is pending and emit the `end` event."""
        if self._forked:
            return
        self._finishing = True
        self.lane_off()
        try:
            self.steps.finish(time.perf_counter())
            self._flush_sites()
            self._emit_loaders()
            self._emit_optimizers()
            self.emit(E.ENV, **environment())
        except Exception as e:
            self.report_error("finish", e)
        if exception is not None:
            self.emit(E.EXCEPTION, **exception_info(exception, self.steps_done, self.script))
        self._ext("on_exit", status)
        try:
            self.emit(E.MERGE, path="probe", value=self.own_cost())   # RankEvidence.probe
        except Exception as e:
            self.report_error("probe_cost", e)
        self.emit(E.END, status=status, exit_code=exit_code, reason=reason, steps=self.steps_done)

    # ---- module hooks ------------------------------------------------------------------------------
    def fwd_pre(self, module, args):
        # Nested calls (every layer of the model) only touch two ints and a bool here: inside a
        # compiled region dynamo traces these hooks, and reading the model object from it breaks tracing.
        if self.in_backward:   # recomputation (activation checkpointing): not a forward of the step,
            return None         # and it may end by an exception that skips the post hook
        self.depth += 1
        if self.depth == 1:
            # (a lane step's model forward begins in HandOver._local_pre, which sets what this case sets:
            # a change here is a change there)
            ent = self._has_params.get(id(module))   # module_has_parameters' cache hit, inlined
            if (ent[1] if ent is not None and ent[0]() is module else self.module_has_parameters(module)):
                self.forward_start = time.perf_counter()
                self._top_module = module
                self._top_depth = 1
                self._seek_model = False
                if self._ext_live.get("on_forward_start", True):
                    self._on_forward_start(module)
            else:
                # a module without parameters (a loss, a bare activation) is not a model: its forward
                # is timed, and a module with parameters it calls counts as the model forward
                self._top_module = None
                self._top_depth = 0
                self._seek_model = True
                self._bare_start = time.perf_counter()
                self._bare_had_model = False
        elif self._seek_model and has_parameters(module):
            self.forward_start = time.perf_counter()
            self._top_module = module
            self._top_depth = self.depth
            self._seek_model = False
            self._bare_had_model = True
            if self._ext_live.get("on_forward_start", True):
                self._on_forward_start(module)
        return None

    def _on_forward_start(self, module) -> None:
        """A model's outermost forward begins (extensions that count from here: FLOPs)."""
        t0 = _ns()
        self._ext("on_forward_start", module)
        self.own_ns += _ns() - t0

    def fwd_post(self, module, args, kwargs, output=None):
        # torch calls always_call hooks as hook(module, args, result) when a forward raised
        # (module.py ignores with_kwargs there): `kwargs` then holds the result
        if self.in_backward:
            return None
        self.depth -= 1
        lane = self._lane
        if lane.on and self.active and not self._forked and not self._in_data:
            # (paused, forked or inside a fetch: the full path below ignores this forward; so does the lane)
            if self.depth == 0:
                try:
                    # (the lane's model forward ends in HandOver._local_post: what reaches here is not one)
                    if (lane.phase in (1, 2) and self._top_depth == 0 and not self._bare_had_model
                            and self._top_module is None and output is not None):
                        # a parameterless outermost module that called no model (a loss module)
                        ts = _TorchState
                        if lane.phase == 1 or (type(output) is ts.Tensor and output.requires_grad and ts.grad()):
                            end = time.perf_counter()
                            self._seek_model = False
                            self._handover.note(module, True, False)
                            if lane.phase == 2:
                                lane.bare_s += end - self._bare_start
                                if lane.bid != id(module):
                                    # the next steps take it in the hand-over's trampolines (lane.bid)
                                    lane.bid, lane.bref = id(module), weakref.ref(module)
                            return None
                except Exception:
                    pass
            lane.hand_back(self)
        if output is None and not isinstance(kwargs, dict):
            self.depth = max(self.depth, 0)
            if self.depth == self._top_depth - 1 and self._top_module is module:
                self._top_module, self._top_depth = None, 0
                self._seek_model = self.depth > 0
            return None
        if self.depth < 0:   # a forward started before the probe was installed
            self.depth = 0
            return None
        if self.depth == self._top_depth - 1 and module is self._top_module:
            # the model's forward is over: the probe lets go of it (kept, it held the model and its memory
            # after the script dropped them, until another model's forward)
            self._top_module = None
            if self.depth > 0:          # a model called by a parameterless module: look for another
                self._top_depth, self._seek_model = 0, True
            ho = self._handover
            if ho is not None:           # HandOver.note, inlined (per outermost forward)
                ho.outermost_forwards += 1
                if id(module) not in ho.known:
                    ho.learn(module)
        elif self.depth == 0 and self._top_depth == 0:
            self._seek_model = False
            if self._handover is not None:
                self._handover.note(module, True, self._bare_had_model)
            if not self._bare_had_model:
                end = time.perf_counter()
                t0 = _ns()
                self._on_bare_forward(output, self._bare_start, end)
                self.own_ns += _ns() - t0
            return None
        else:
            return None
        if self._forked or not self.active or self.in_backward or self._in_data:
            return None
        t0 = _ns()
        end = t0 * 1e-9      # (perf_counter_ns is perf_counter's clock: one read less, issue 28)
        try:
            self._on_top_forward(module, args, kwargs, output, self.forward_start, end)
        except DiagStop:
            self.own_ns += _ns() - t0
            raise
        except Exception as e:
            self.report_error("forward", e)
        self.own_ns += _ns() - t0
        return None

    def _on_bare_forward(self, output, start: float, end: float) -> None:
        """An outermost forward of a module without parameters (``loss_fn(model(x), y)``): its time
        belongs to the step's forward (or evaluation), and a backward may start at its output; it is
        not a model, a call site or a batch of its own."""
        if self._forked or not self.active or self._in_data:
            return
        try:
            import torch

            outs = output_grad_tensors(output) if torch.is_grad_enabled() else []
            self.steps.bare_forward(end - start, bool(outs))
            if outs and not self._bwd_wrapped:
                for t in outs:
                    on_backward(t, self._bwd_hook)
        except Exception as e:
            self.report_error("forward", e)

    def _model_entry(self, module) -> tuple:
        """(weak reference, model id, device type) of a module called as an outermost forward; a model
        seen for the first time is described (``model`` event, the extensions' ``on_model``)."""
        mid = self._models.get(id(module))
        if mid is None or self._model_refs.get(mid) is None or self._model_refs[mid]() is not module:
            mid = len(self._model_refs) + 1
            self._models[id(module)] = mid
            try:
                self._model_refs[mid] = weakref.ref(module)
            except TypeError:
                self._model_refs[mid] = lambda: None
            info = describe_model(module, mid)
            self.emit(E.MODEL, **info)
            self._ext("on_model", module, info)
        ref = self._model_refs[mid]
        dev_type = self._model_device.get(mid)
        if dev_type is None:
            dev_type = self._model_device[mid] = device_type(module)
        if len(self._fwd_models) >= 4096:   # modules built and dropped over a long run: start again
            self._fwd_models.clear()
        self._fwd_models[id(module)] = (ref, mid, dev_type)
        return ref, mid, dev_type

    def _on_top_forward(self, module, args, kwargs, output, start: float, end: float) -> None:
        ts = _TorchState if _TorchState.torch is not None else _TorchState.bind()
        # the model's weak reference, id and device type in one lookup (issue 28: per outermost forward)
        ent = self._fwd_models.get(id(module))
        if ent is not None and ent[0]() is module:
            mref, mid, dev_type = ent
        else:
            mref, mid, dev_type = self._model_entry(module)
        grad = ts.grad()
        # the innermost module's flag: frameworks call .train() on the model, not on its DDP wrapper
        training = module.training is True
        if not training:
            ref = self._model_inner.get(mid)
            inner = ref() if ref is not None else None
            if inner is None:
                inner = wrappers_of(module)[2]
                try:
                    self._model_inner[mid] = weakref.ref(inner)
                except TypeError:
                    pass
            training = bool(getattr(inner, "training", False))
        # inference mode implies grad mode off: one C call less on a training forward
        inference = False if grad else ts.inference()
        if not grad:
            out_t = None
        elif type(output) is ts.Tensor:      # the common case, inlined (output_grad_tensors)
            out_t = output if output.requires_grad else None
        else:
            outs = output_grad_tensors(output)
            out_t = outs[0] if outs else None
        out_rg = out_t is not None
        try:
            ac = ts.any_autocast() and ts.autocast(dev_type)
            acd = ts.autocast_dtype(dev_type) if ac else None
            ac_dtype = str(acd).replace("torch.", "") if ac else None
        except Exception:
            ac, acd, ac_dtype = False, False, None
        # the caller, out through the hook and torch: user_frame(3), inlined (per outermost forward)
        frame = sys._getframe(2)
        lib_cache = _LIB_CACHE
        up = 1                   # (its depth from fwd_post: the lane checks the frame there)
        while frame is not None:
            fn = frame.f_code.co_filename
            lib = lib_cache.get(fn)
            if lib is None:
                lib = is_library_file(fn)
            if not lib:
                break
            frame = frame.f_back
            up += 1
        loc_key = (frame.f_code.co_filename, line_of(frame)) if frame is not None else None
        key = (mid, loc_key, training, grad, inference, ac_dtype, out_rg)
        site = self._sites.get(key)
        if site is None:
            samples, tokens, shapes, dtypes = batch_size_of(args, kwargs)
            skey = f"s{len(self._sites) + 1}"
            site = {
                "key": skey, "model": mid, "module": wrappers_of(module)[0],
                "location": frame_location(frame), "training": training, "grad_enabled": grad,
                "inference_mode": inference, "autocast": ac_dtype,
                "autocast_device": dev_type if ac else None, "output_requires_grad": out_rg,
                "in_step": grad and training and out_rg, "first_step": self.steps.done + 1,
                "input_shapes": shapes, "input_dtypes": dtypes, "backpropagated": False,
            }
            self._sites[key] = site
            self._site_counts[skey] = 0
            self.emit(E.FORWARD_SITE, **site)
        # a training forward: grad mode, an output that needs grad, and the module in training mode
        # or a call site whose output was seen to feed a backward (training in eval mode, e.g. to
        # freeze BatchNorm statistics)
        train_fwd = grad and out_rg and (training or site["backpropagated"])
        skey = site["key"]
        sm = self.steps
        if train_fwd:
            # the step machine: which step this forward belongs to (it may close the previous one, and
            # open the next), its forward phase, the main thread's own work before it (pre_forward_s)
            step = sm.training_forward(start, end, skey)
            self._site_counts[skey] += 1     # (after: a step it closed carried the counts before it)
            self._site_dirty.add(skey)
            if step.sample_site is None:
                # the step's first training forward (StepMachine.counts_samples is True, add_samples sets
                # the site and the counts), and samples_of's common case (a plain tensor first), inlined
                counted = True
                t = args[0] if args else None
                shape = t.shape if type(t) is ts.Tensor else None
                if shape and t.is_floating_point():   # (None or torch.Size; no tokens of a float)
                    hint = sm.last_batch_samples
                    samples = shape[0]
                    if hint is not None and samples != hint and hint in shape:
                        samples = hint
                    step.micro_batches += 1
                    step.sample_site = skey
                    step.samples, step.tokens = samples, None
                else:
                    samples, tokens = samples_of(args, kwargs, sm.last_batch_samples)
                    sm.add_samples(step, skey, samples, tokens)
                # what the lane would check on the next steps (diag.probe.lane: Lane.consider)
                self._lane.fwd = (mref, skey, up, frame.f_code, frame.f_lasti, dev_type, acd) \
                    if frame is not None and acd is not False else None
            else:
                counted = sm.counts_samples(step, skey)
                if counted:
                    samples, tokens = samples_of(args, kwargs, sm.last_batch_samples)
                    sm.add_samples(step, skey, samples, tokens)
            self.forward_counts_samples = counted
            self._last_model = mref
            if not self.in_backward and not self._bwd_wrapped:
                # (torch.autograd.backward could not be wrapped) on every output that needs grad: the
                # loss may use any of them
                for t in output_grad_tensors(output):
                    try:
                        on_backward(t, self._bwd_hook)
                    except Exception:
                        pass
            if self._ext_live.get("on_forward", True):
                self._ext("on_forward", module, args, kwargs, output, True)
        else:
            self._site_counts[skey] += 1
            self._site_dirty.add(skey)
            e_samples = e_tokens = None
            if sm.wants_eval_batch():
                e_samples, e_tokens, _, _ = batch_size_of(args, kwargs, sm.last_batch_samples)
            # a forward of the open step (a teacher's: its eval_s), or of an evaluation pass
            if sm.eval_forward(start, end - start, skey, e_samples, e_tokens) and self.extensions \
                    and self._evals.ext_calls < 8:
                # the first evaluation forwards (diag.probe.evalsteps): an evaluation-only run's batch
                self._evals.ext_calls += 1
                self._ext("on_eval_forward", module, args, kwargs, output, site)
            if out_rg and not self.in_backward:
                # a graph built outside training mode: find out whether a backward goes through it
                try:
                    on_backward(out_t, functools.partial(self._graph_bwd_hook, site))
                except Exception:
                    pass
        if not train_fwd and out_rg and self._extensions:
            # a forward that built an autograd graph outside training (eval mode, grad enabled)
            self._ext("on_graph_forward", module, args, kwargs, output, site)

    # ---- backward ----------------------------------------------------------------------------------
    def _bwd_hook(self, grad):
        self._bwd_calls += 1          # autograd called into Python (the estimated part, _account_step)
        if self.in_backward or self._forked:
            return None
        t0 = _ns()
        self.in_backward = True
        self._bwd_start = time.perf_counter()
        try:
            import torch

            torch.autograd.Variable._execution_engine.queue_callback(self._bwd_end)
        except Exception as e:
            self.in_backward = False
            self.report_error("backward", e)
        self.own_ns += _ns() - t0
        return None

    def _graph_bwd_hook(self, site, grad):
        """A backward reached the output of a forward made in eval mode: that call site trains."""
        if self._forked:
            return None
        if not site["backpropagated"]:
            site["backpropagated"] = True
            site["in_step"] = True
            self.emit(E.FORWARD_SITE, **site)
        return self._bwd_hook(grad)

    def _bwd_end(self):
        end = time.perf_counter()
        self.in_backward = False
        self._backward_done(self._bwd_start, end)   # times itself

    # ---- optimizer ---------------------------------------------------------------------------------
    def prepare_compiled(self) -> None:
        """torch.compile is in use: make the eager twins of the hooks that mark a step, which code
        torch.compile traces calls instead of tracing them (hooks.compiling_check)."""
        if self._eager_opt_pre is None:
            self._eager_opt_pre = run_eagerly(self._opt_pre)
            self._eager_opt_post = run_eagerly(self._opt_post)
        for wrapper, eager in self._bwd_twins:
            if eager[0] is None:
                eager[0] = run_eagerly(wrapper)
        if self._handover is not None:
            self._handover.prepare_compiled()

    def _opt_pre(self, opt, args, kwargs):
        if _compiling():        # an optimizer step inside compiled code: run eagerly (one graph break)
            f = self._eager_opt_pre
            return f(opt, args, kwargs) if f is not None else None
        if self._forked or not self.active:
            return None
        lane = self._lane
        if lane.on:
            if (lane.phase == 4 or lane.phase == 6) and opt is lane.oref():
                # the lane's optimizer step, inside itself: a subclass's step() calling super().step() (torch
                # fires the step hooks at each class's level: hooks.inside_step): the outer call is the step
                lane.onest += 1
                return None
            # the lane's optimizer step (diag.probe.lane): its own, without a closure (torch hands the hook
            # (optimizer,) and step()'s arguments; plain `opt.step()` first)
            if (lane.phase == 3 and ((not kwargs and len(args) == 1 and args[0] is opt) or no_closure(opt, args, kwargs))
                    and opt is lane.oref()):
                lane.o_start = _pc()
                lane.phase = 4
                return None
            if (lane.phase == 8 or (lane.phase == 1 and lane.cmode and lane.acc)) and opt is lane.oref():
                # the closure mode (a Lightning loop): the step's forward and backward run in the closure (the
                # last micro-batch's, with gradient accumulation: its batch fetched, phase 1)
                wrapped = self._lane_closure(lane, opt, args, kwargs)
                if wrapped is not None:
                    return wrapped
            lane.hand_back(self)
        if self._opt_start and id(opt) in self._opt_start:
            if inside_step(opt):
                # the same optimizer's step inside its step (a subclass's step() calling super().step()):
                # the outer call is the step; its inner hooks are left out, the post-hook's too
                self._opt_inner[id(opt)] = self._opt_inner.get(id(opt), 0) + 1
                return None
            self._opt_inner.pop(id(opt), None)      # (an earlier step raised inside: nothing is nested now)
        t0 = _ns()
        ho = self._handover
        if ho is not None and id(opt) not in ho._opts:
            ho._opt_pre(opt, args, kwargs)   # called from here, not as a hook of its own (one dispatch less)
        sm = self.steps
        step = sm.current
        if step is not None and step.group_end is not None and id(opt) in step.group:
            self.own_ns += _ns() - t0
            sm.optimizer_begins(id(opt))   # the same optimizer again: the previous iteration is over (times itself)
            t0 = _ns()
        ref = self._opt_seen.get(id(opt))
        if ref is None or ref() is not opt:     # an optimizer's first step (or a new one at a reused id)
            try:
                self._opt_seen[id(opt)] = weakref.ref(opt)
            except TypeError:
                pass
            if self._ext_live.get("on_optimizer", True):
                self._ext("on_optimizer", opt)
        if self._ext_live.get("on_optimizer_step", True):
            self._ext("on_optimizer_step", opt)
        # torch hands the hook (optimizer,) + step()'s own arguments: a closure makes them longer
        wrapped = sm.wrap_closure(id(opt), opt, args, kwargs) \
            if kwargs or len(args) > 1 or (args and args[0] is not opt) else None
        lane.opt_plain = wrapped is None
        if wrapped is not None:
            sm.begin_training(time.perf_counter())   # its forwards and backwards run inside
        n1 = _ns()
        self._opt_start[id(opt)] = n1 * 1e-9     # (perf_counter's clock: one read for both)
        self.own_ns += n1 - t0
        return wrapped

    def _lane_closure(self, lane, opt, args, kwargs):
        """The lane's optimizer step with a closure (its closure mode, diag.probe.lane): the step's
        ``(args, kwargs)`` with the closure timed, as ``StepMachine.wrap_closure`` times it, and followed:
        its entry begins the step's forward (phase 1), its exit after the backward ends it (phase 4, the
        optimizer's start moved on by the closure's time). A second call (LBFGS re-evaluating), an
        exit before the backward or a lane gone off goes to the full path, with the same record. None
        when the step has no closure."""
        closure, at = closure_of(opt, args, kwargs)
        if closure is None:
            return None
        rec = lane.crec = [0.0, 0]
        full = timed_closure(closure, rec, _pc)     # (the full path's, on the same record)
        probe = self

        def lane_closure(*a, **k):
            if rec[1] or not lane.on or lane.phase != 6 or lane.crec is not rec:
                if lane.on and lane.crec is rec:
                    lane.hand_back(probe)
                return full(*a, **k)
            rec[1] = 1
            lane.phase = 1
            t0 = _pc()
            try:
                return closure(*a, **k)
            finally:
                rec[0] += _pc() - t0
                if lane.on and lane.crec is rec:
                    if lane.phase == 3:
                        lane.phase = 4
                        lane.o_start += rec[0]
                    else:
                        lane.hand_back(probe)

        lane.o_start = lane.o_real = _pc()
        lane.phase = 6
        lane.inclos = True
        return with_closure(args, kwargs, at, lane_closure)

    def _opt_post(self, opt, args, kwargs):
        if _compiling():
            f = self._eager_opt_post
            return f(opt, args, kwargs) if f is not None else None
        if self._forked or not self.active:
            return None
        t0 = _ns()
        lane = self._lane
        if lane.on:
            if lane.phase == 4 and opt is lane.oref():
                if lane.onest:
                    lane.onest -= 1     # (the post-hook of a step inside the step: _opt_pre)
                    return None
                if lane.alive > 1:
                    # other optimizers are alive: the group (and the step) ends at the next fetch
                    lane.o_end, lane.phase = t0 * 1e-9, 5
                    return None
                if lane.close(self, t0):
                    return None    # the lane's step closed (diag.probe.lane)
            if lane.on:
                lane.hand_back(self)
        if self._opt_inner:
            k = self._opt_inner.get(id(opt))
            if k:
                # the post-hook of the optimizer's step inside its step (_opt_pre): the outer one ends it
                if k > 1:
                    self._opt_inner[id(opt)] = k - 1
                else:
                    del self._opt_inner[id(opt)]
                return None
        end = t0 * 1e-9      # (perf_counter's clock)
        ho = self._handover
        if ho is not None and ho.active:   # HandOver._opt_post, inlined (per step; the probe is live here)
            opts, fwd = ho._opts, ho.outermost_forwards
            unexplained = opts.get(id(opt)) == fwd    # stepped twice with no known forward between
            opts[id(opt)] = fwd
            if unexplained and not ho.discovering:
                ho.request("a step no known forward fed")
        start = self._opt_start.pop(id(opt), end)
        info = self._optimizers.get(id(opt)) or self.optimizer_info(opt)
        info["steps"] += 1
        lane.optc = (self._opt_seen.get(id(opt)), info)   # (a weak reference: the lane holds no user object)
        sm = self.steps
        lane.oclos = sm.closures.get(id(opt)) if sm.closures else None   # (the lane's closure mode: Lane.consider)
        closed = sm.done
        # the optimizer phase (less a closure's time: its forwards and backwards are in their own
        # phases) and the step's optimizer-step group, which may close the step now
        sm.optimizer_stepped(id(opt), start, end)
        if sm.done == closed:
            self.own_ns += _ns() - t0
        else:                    # the step's close counted itself (step_closed) from when it began
            self.own_ns += max(self._close_ns - t0, 0)
        return None

    def optimizer_info(self, opt, create: bool = True) -> dict | None:
        info = self._optimizers.get(id(opt))
        if info is None and create:
            defaults = getattr(opt, "defaults", {}) or {}
            groups = getattr(opt, "param_groups", []) or []
            info = {
                "id": len(self._optimizers) + 1, "cls": type(opt).__name__,
                "param_groups": len(groups),
                "params": sum(len(g.get("params", [])) for g in groups),
                "lr": _float_or_none(groups[0].get("lr")) if groups else None,
                "foreach": defaults.get("foreach"), "fused": defaults.get("fused"),
                "steps": 0, "zero_grad_calls": 0, "zero_grad_set_to_none": None, "zero_grad_s": 0.0,
                "state_bytes": None,
            }
            self._optimizers[id(opt)] = info
            self.steps.optimizers_known = len(self._optimizers)
        return info

    _optimizer_info = optimizer_info

    # ---- DataLoader --------------------------------------------------------------------------------
    def _on_loader_iter(self, loader, it) -> None:
        if self._forked or not self.active:
            return
        if self._lane.on:     # a new pass (an epoch, an evaluation loop): the full path sees it
            self._lane.hand_back(self)
        info = self._loaders.get(id(loader))
        if info is None or self._loader_refs.get(id(loader), lambda: None)() is not loader:
            ds = getattr(loader, "dataset", None)
            try:
                ds_len = len(ds)  # type: ignore[arg-type]
            except Exception:
                ds_len = None
            from torch.utils.data import IterableDataset

            frame = user_frame(3)
            info = {
                "id": len(self._loaders) + 1,
                "num_workers": int(getattr(loader, "num_workers", 0) or 0),
                "pin_memory": bool(getattr(loader, "pin_memory", False)),
                "batch_size": getattr(loader, "batch_size", None),
                "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
                "prefetch_factor": getattr(loader, "prefetch_factor", None),
                "drop_last": bool(getattr(loader, "drop_last", False)),
                "dataset_type": type(ds).__name__ if ds is not None else "",
                "dataset_len": ds_len,
                "iterable_dataset": isinstance(ds, IterableDataset),
                "location": frame_location(frame),
                "epochs": 0, "batches": 0, "wait_s": 0.0, "first_batch_s": [], "max_wait_s": 0.0,
                "role": None,
            }
            if info["batch_size"] is None:   # a batch_sampler (accelerate's DataLoaderShard)
                bs = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
                info["batch_size"] = bs if isinstance(bs, int) else None
            self._loaders[id(loader)] = info
            self._loaders_by_lid[info["id"]] = info
            try:
                self._loader_refs[id(loader)] = weakref.ref(loader)
            except TypeError:
                pass
        # a pass that delivered at most one batch and never ended, followed by a new pass of the same
        # loader, was a peek (`len(next(iter(loader))[0])` to read the batch size, as the DDP tutorial
        # does every epoch): not an epoch
        prev = self._last_iter.get(info["id"])
        if prev is not None and prev[3] <= 1 and not prev[4] and info["epochs"] > 0:
            info["epochs"] -= 1
        info["epochs"] += 1
        sm = self.steps
        sm.pass_started(info["id"])
        if info["role"] != "eval":
            # an evaluation loader's passes are not epochs of training (a validation loader iterated
            # every N steps showed "epoch 5" on a one-epoch Lightning run)
            sm.epoch = max(sm.epoch, info["epochs"])
        if self._handover is not None:
            self._handover.request("loader")   # an epoch or an evaluation loop begins: look again
        # the iterator is the user's object: what the probe knows of it is kept here, not on it
        key = id(it)
        iters = self._iters
        try:
            ref = weakref.ref(it, lambda _r, k=key: iters.pop(k, None))
        except TypeError:
            ref = None
        rec = iters[key] = [ref, info["id"], True, 0, False]   # ..., first batch?, batches, ended
        self._last_iter[info["id"]] = rec
        self.emit(E.DATALOADER, **info)

    def _iter_lid(self, it):
        """The loader id of a DataLoader iterator the probe saw start (None for one it did not)."""
        rec = self._iters.get(id(it))
        if rec is None or (rec[0] is not None and rec[0]() is not it):
            return None
        return rec[1]

    def _emit_loaders(self) -> None:
        for info in self._loaders.values():
            self.emit(E.DATALOADER, **_loader_event(info))

    def _emit_optimizers(self) -> None:
        for info in self._optimizers.values():
            self.emit(E.OPTIMIZER, **info)

    # ---- the step machine's listener (diag.probe.stepmachine.Listener) ---------------------------------
    def emit_event(self, kind: str, data: dict) -> None:
        self.emit_dict(kind, data)

    def step_opened(self, step: _Step) -> None:
        if self._ext_live.get("on_step_start", True):
            self._ext("on_step_start", step.index)

    def step_closed(self, step: _Step, ev: dict) -> None:
        """A step closed (the machine built its event ``ev``): the extensions' per-step records, the
        probe's own time in it, the forward counts, the event itself; then the step limit."""
        t_close = self._close_ns = _ns()
        self.depth = 0   # a step ends outside any forward: heal a count a swallowed exception left raised
        self._seek_model = False
        if step.index == STEADY_FROM:
            # the parts of the probe's time so far (the first steps carry its one-off work: the memory
            # replay, the FLOP count, the first model's description): own_cost's steady parts start here
            self._parts_mark = (step.index, self.own_ns, self._sink_ns, self._est_ns, dict(self._ext_ns))
        if self._budget_checked_n != self._ext_n:
            self._budget_lookup()
        b = self._budget
        this_sampled = self.sampled
        if b is not None:
            # this step's sampling on its event; the next step's decided before the extensions' step-end
            # work (which reads ctx.sampled as the next step's), from the last accounted step's costs
            if not this_sampled and self._budget_exts:
                ev["sampled"] = False
            self.sampled = b.after_step(ev["total_s"], self._last_core_s, self._last_extras_s,
                                        self._last_sampled)
            if b.changes and (self._budget_exts or self._lane.steps):
                # (a budget kept for the lane alone says nothing until the lane skipped a step's extras)
                for change in b.pop_changes():
                    self.emit(E.PROBE_SAMPLING, **change)
        if self._ext_live.get("on_step_end", True):
            self._ext("on_step_end", ev)
        # the probe's own time in this step (``probe_s``: since the previous step event, that event's
        # write included; a step in a discovery window adds torch's slow path for each module call the
        # global hooks saw) and whether a discovery window covered it (``probe_window``); inlined here
        # (one frame less per step: issue 28)
        ho = self._handover
        own = self.own_ns + (_ns() - t_close)
        probe_ns = own - self._own_mark
        self._own_mark = own
        in_window = False
        # the estimated part: what the timer cannot see, counted per step and priced by the calibration
        # at install (warm figures: a lower bound of what it costs after a step's work evicted the caches)
        w0, h0, b0 = self._est_marks
        if ho is not None:
            w1, h1 = ho.window_calls, ho.local_calls
            in_window = ho.boundary()
        else:
            w1, h1 = w0, h0
        b1 = self._bwd_calls
        self._est_marks = (w1, h1, b1)
        est = (w1 - w0) * self.slow_path_ns + (h1 - h0) * self.hooked_call_ns + (b1 - b0) * self.autograd_hook_ns
        self._est_ns += est
        probe_ns += est
        ev["probe_s"] = int(probe_ns + 0.5) / 1e9    # rounded to the ns (see emit_dict)
        if b is not None:   # the split the budget is fed with at the next step's close
            ext_ns = self._ext_ns
            extras = sum(ext_ns.get(n, 0) for n in self._budget_exts)
            d = extras - self._extras_ns
            self._extras_ns = extras
            lane = self._lane
            if lane.allowed and (this_sampled or self._last_sampled or self.sampled):
                # the lane's steps are the budget's core; everything a sampled step on the full path, or an
                # unsampled one next to it, costs beyond it is extras (before the first lane step: the
                # lane's calibrated entries, a guess); an unsampled step away from any sampled one costs
                # what it costs whatever the sampling (the lane did not take it): no extras
                core = lane.core_ns if lane.core_ns is not None else est + 6 * lane.entry_ns
                d = max(d, probe_ns - core)
            self._last_extras_s = d / 1e9
            self._last_core_s = max(probe_ns - d, 0) / 1e9
            self._last_sampled = this_sampled
        if in_window:
            ev["probe_window"] = True
        dirty = self._site_dirty
        if dirty:   # forward counts ride on the step event: one write per step
            counts = self._site_counts
            fc = ev["forward_counts"] = {}
            for k in dirty:           # (a loop, not a comprehension: one frame less per step)
                fc[k] = counts[k]
            dirty.clear()
        self.write_step(ev)
        if not self._env_refreshed and step.index >= 2:
            # flags such as cudnn.benchmark are often set after import: read them again once
            self._env_refreshed = True
            self._emit_loaders()
            self._emit_optimizers()
            self.emit(E.ENV, **environment())
        if self._lane.allowed:
            try:
                self._lane.consider(self, step, ev)   # arm the lane for the next step? (diag.probe.lane)
            except Exception as e:
                self._lane.off(self)
                self.report_error("lane", e)
        self.own_ns += _ns() - t_close
        if self.max_steps is not None and step.index >= self.max_steps and not self._finishing:
            raise DiagStop(f"--steps {self.max_steps} reached", "stopped")

    def write_step(self, ev: dict) -> None:
        """Write a step event (the full path's and the lane's): straight onto the file sink's writer queue
        when there is one (emit_dict and the sinks' calls, inlined: issue 28), else through emit_dict."""
        fast = self._step_sink
        if fast is None or fast[0] is not self.sink:
            fast = self._step_path()
        fs = fast[1]
        if fs is not None and fs.ready and not self._forked:
            ev["kind"] = E.STEP
            n0 = _ns()
            ev["t"] = int((n0 * 1e-9 - self.t0) * 1e6 + 0.5) / 1e6     # (emit_dict's rounding)
            ev["rank"] = self.rank
            if fast[2]:
                ev.update(fast[2])
            fs.defer(ev)
            self._sink_ns += _ns() - n0
        else:
            self.emit_dict(E.STEP, ev)

    def _step_path(self) -> tuple:
        """(the sink it is for, the file sink under it or None, the tags it adds): the step event's way
        to the writer's queue without the sinks' calls (:meth:`diag.probe.sink.FileSink.step_path`)."""
        sink = self.sink
        fn = getattr(type(sink), "step_path", None)   # (the class's: TaggedSink forwards unknown names)
        got = None
        if fn is not None:
            try:
                got = fn(sink)
            except Exception:
                got = None
        fast = self._step_sink = (sink, got[0], got[1]) if got is not None else (sink, None, None)
        return fast

    def _budget_lookup(self) -> None:
        """Is an extension that honours ``ctx.sampled`` live (its class sets ``SAMPLED_EXTRAS``)? Then
        the budget runs (made once, from ``DIAG_PROBE_BUDGET``); else every step is sampled and the
        budget costs nothing."""
        self._budget_checked_n = self._ext_n
        names = tuple(type(e).__name__ for e in self._extensions if getattr(e, "SAMPLED_EXTRAS", False))
        self._budget_exts = names
        if not names and not self._lane.allowed:
            if self._budget is not None:
                self._budget = None
                self.sampled = True
            return
        if self._budget is None:
            b = Budget.from_env(core_unseen=CORE_UNSEEN)
            if b.error:
                self.report_error("budget", ValueError(b.error))
            if b.on:
                self._budget = b
                self._extras_ns = sum(self._ext_ns.get(n, 0) for n in names)

    def first_training(self) -> None:
        detect_framework(self)

    def optimizer_alive(self) -> bool:
        return self._census.any()

    def live_optimizers(self) -> int:
        return self._census.count()

    def eval_step_opened(self, es: dict) -> None:
        self._evals.opened(es)

    def eval_forward(self, es: dict, site: str | None) -> None:
        self._evals.forward(es, site)

    def eval_step_closed(self, es: dict | None, ev: dict | None) -> None:
        self._evals.closed(es, ev)

    def eval_finished(self) -> None:
        try:
            self._evals.finished()
        except Exception as e:
            self.report_error("eval_steps", e)

    def _flush_sites(self) -> None:
        if self._site_dirty:
            self.emit(E.FORWARD_COUNTS, counts={k: self._site_counts[k] for k in self._site_dirty})
            self._site_dirty.clear()


_ns = time.perf_counter_ns
_pc = time.perf_counter
_ONCE = frozenset({"install", "uninstall", "on_exit"})   # extension hooks that run once, outside the steps
STEADY_FROM = 5   # own_cost's steady parts count from this step's close (diag.evidence.probe.PROBE_WARMUP)
_SEQ = (list, tuple)


def _batch_samples(batch, tensor_cls) -> int | None:
    """A DataLoader batch's samples (``batch_samples``), its common case first: a tensor, or a list or
    tuple whose first item is one (both the lane's fetch and the full path's count it here)."""
    first = batch[0] if type(batch) in _SEQ and batch else batch
    if type(first) is tensor_cls:
        shape = first.shape    # (one read: each is a call into torch, ~0.1 µs warm and more after a step)
        if shape:
            return shape[0]
    return batch_samples(batch)


def _loader_event(info: dict) -> dict:
    """A loader's record as of now: the sink may encode it later (``dataloader`` events are deferred,
    diag.probe.sink), so the list the probe keeps appending to is copied."""
    out = dict(info)
    out["first_batch_s"] = list(info.get("first_batch_s") or ())
    return out


def _calibrate() -> tuple[float, float, float]:
    """(global hook pair per module call, hooked outermost forward, backward callbacks), nanoseconds:
    what the probe costs torch outside its own timed code, measured once at install (~10 ms). Warm
    figures (the best of several tries right after one another): in a real step the same work runs
    after the step evicted the caches and costs more, so the estimate they give is a lower bound."""
    return _measure_slow_path(), _measure_hooked_forward(), _measure_backward_callbacks()


def _best(fn, n: int = 15) -> int:
    b = None
    for _ in range(n):
        t0 = _ns()
        fn()
        dt = _ns() - t0
        b = dt if b is None or dt < b else b
    return b or 0


def _measure_hooked_forward() -> float:
    """A module call on torch's slow path with a pre and a post hook shaped as the probe's local hooks
    (``HandOver``'s trampolines, with_kwargs, always_call) against the same call on the fast path:
    per outermost forward of a hooked model."""
    try:
        import torch

        from diag.probe.marks import ProbeHook as _Hook

        m = torch.nn.Identity()
        x = torch.zeros(1)
        n = 32

        def calls():
            for _ in range(n):
                m(x)

        with torch.no_grad():
            bare = _best(calls)
            a = m.register_forward_pre_hook(_Hook(_noop_pre))
            b = m.register_forward_hook(_Hook(_noop_post), with_kwargs=True, always_call=True)
            try:
                hooked = _best(calls)
            finally:
                a.remove()
                b.remove()
        return max(hooked - bare, 0) / n
    except Exception:
        return 0.0


def _measure_backward_callbacks() -> float:
    """A backward that calls a Python pre-hook on its first node and queues a Python end callback
    (what the probe does per backward) against the same backward without them; the hook's
    registration is left out (the probe times it itself, in its forward hook)."""
    try:
        import torch

        engine = torch.autograd.Variable._execution_engine
        w = torch.zeros(4, requires_grad=True)
        k = 4

        def cb():
            return None

        def pre(grad):
            engine.queue_callback(cb)

        def plain():
            for _ in range(k):
                y = (w * 2).sum()
                y.grad_fn.register_prehook(_noop_grad).remove()
                y.backward()

        def hooked():
            for _ in range(k):
                y = (w * 2).sum()
                y.grad_fn.register_prehook(pre)
                y.backward()

        diffs = []
        for _ in range(3):
            diffs.append(_best(hooked, 5) - _best(plain, 5))
        w.grad = None
        diffs.sort()
        return max(diffs[1], 0) / k
    except Exception:
        return 0.0


def _noop_pre(m, args):
    return None


def _noop_post(m, args, kwargs, out=None):
    return None


def _noop_grad(grad):
    return None


def _measure_slow_path() -> float:
    """What a global forward pre+post hook pair costs torch per module call on this machine
    (nanoseconds): a 64-module chain of ``nn.Identity`` forwarded bare and under an empty pair, the
    minimum of 15 forwards each (~2 ms, once at install). Step timing cannot see this cost (it is
    spent in ``Module._call_impl``, outside the hook bodies): windows add it per module call."""
    try:
        import torch
        from torch.nn.modules import module as nn_module

        chain = torch.nn.Sequential(*[torch.nn.Identity() for _ in range(63)])
        n = 64
        x = torch.zeros(1)

        def best() -> int:
            b = None
            for _ in range(15):
                t0 = _ns()
                chain(x)
                dt = _ns() - t0
                b = dt if b is None or dt < b else b
            return b or 0

        with torch.no_grad():
            bare = best()
            a = nn_module.register_module_forward_pre_hook(lambda m, args: None)
            b = nn_module.register_module_forward_hook(lambda m, args, kwargs, out=None: None,
                                                       with_kwargs=True, always_call=True)
            try:
                hooked = best()
            finally:
                remove_global_hook(a)
                remove_global_hook(b)
        return max(hooked - bare, 0) / n
    except Exception:
        return 0.0


def _float_or_none(v) -> float | None:
    try:
        return float(v)
    except Exception:
        return None


_optimizer_alive = optimizer_alive   # the former private name


__all__ = [
    "DiagStop", "ENV_ALLOWLIST", "FileSink", "MAX_LAYER_SHAPES", "Probe", "batch_size_of", "describe_model",
    "environment", "exception_info", "find_ddp", "first_tensor", "frame_location", "grad_tensor",
    "grad_tensors", "is_library_file", "is_oom", "user_frame", "wrappers_of",
]


# the former private name of ``Probe.report_error``
Probe._report_error = Probe.report_error
