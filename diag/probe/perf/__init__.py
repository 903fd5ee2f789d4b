"""Probe extension for the performance checklist (checks/amp.py, dataloader.py, eval.py, parallel.py,
tuning.py, sync.py): what those checks need that the core probe does not record.

What it writes (the shapes are documented in docs/performance-checks.md):

``amp.scaler``                   GradScaler use: created, enabled, scale()/step() calls, device, where.
``extras.eval_graph``            per eval-mode forward site that built an autograd graph: the bytes of
                                 activations the graph kept alive (parameters and inputs excluded), the
                                 calling line's source text.
``extras.input_shapes``          per convolutional model: the distinct training input shapes (cudnn.benchmark).
``extras.data_parallel``         per nn.DataParallel model: its device_ids.
``extras.optimizers``            per optimizer: parameter device, foreach/fused as given and as torch
                                 resolves them, which ones its class supports.
``extras.module_zero_grad``      nn.Module.zero_grad() calls (set_to_none=False ones, time, where).
``extras.debug``                 steps run with autograd anomaly detection / a profiler on, and where they
                                 were switched on.
``extras.compile``               torch.compile calls and compiled models.
``extras.perf``                  machine facts for amp.availability (CPU capability).
``sync``                         (CUDA training only) host-device synchronisations counted per step over a
                                 window of ``SYNC_STEPS`` steps with ``torch.cuda.set_sync_debug_mode("warn")``,
                                 located in the user's code.
``extras.copies``                (CUDA training only, same window) host-to-device copies: bytes, and
                                 ``non_blocking=True`` copies from pageable (unpinned) memory, which are
                                 synchronous in fact; sync debug mode cannot see those.

Cost on the hot path: per training forward a few attribute reads (plus a shape tuple for
convolutional models); per step two C calls (anomaly / profiler state); one event at steps
1, 2, 5, 10, 20, 50 and every 100th. The sync window costs one Python warning per synchronisation
for ``SYNC_STEPS`` steps, then is switched off. Measured figures: docs/performance-checks.md.
"""
from __future__ import annotations

from diag.evidence import events as E
from diag.probe.hooks import Patches, remove_hooks
from diag.probe.perf._common import MAX_LOCATE, MAX_SITES
from diag.probe.perf.amp import AmpRecorder
from diag.probe.perf.eval import EVAL_MEASURE, MAX_GRAPH_NODES, EvalRecorder, graph_saved_bytes
from diag.probe.perf.parallel import ParallelRecorder
from diag.probe.perf.sync import SYNC_FIRST_STEP, SYNC_MSG, SYNC_STEPS, SyncRecorder, h2d_target
from diag.probe.perf.tuning import MAX_SHAPES, TuningRecorder

FLUSH_AT = (1, 2, 5, 10, 20, 50)
DEBUG_EVERY = 8     # anomaly detection / profiler state read at steps 1, 9, 17, ... until one is seen on


def _next_flush(index: int) -> int:
    """The step after ``index`` at which on_step_end writes what changed: FLUSH_AT, then every 100th."""
    for k in FLUSH_AT:
        if k > index:
            return k
    return (index // 100 + 1) * 100


def _false() -> bool:
    return False


class PerfProbe(AmpRecorder, EvalRecorder, ParallelRecorder, SyncRecorder, TuningRecorder):
    """One extension; each topic's recorder (a module of this package, named after the checks that
    read it: amp, eval, parallel, sync, tuning) keeps its own state and patches, and this class routes
    the probe's hooks to them and writes what changed as ``set``/``merge`` events. What
    checks/dataloader.py needs beyond the core probe, ``extras.copies``, is counted in the sync window
    (:mod:`diag.probe.perf.sync`); ``pre_forward_s`` is the core's (``Probe._on_top_forward``)."""

    def __init__(self):
        self._probe = None
        self._torch = None
        self._patches = Patches()
        self._hooks: list = []
        self._dirty: set[str] = set()
        self._init_amp()
        self._init_eval()
        self._init_parallel()
        self._init_tuning()
        self._init_sync()
        self._next_flush = FLUSH_AT[0]
        self._anomaly_on = self._profiler_on = _false    # bound to torch's at install
        self._debug_watch = False    # read the debug state every step (one was seen on)
        self._debug_next = 1         # the next step whose debug state is read while not watching

    @property
    def LANE(self) -> bool:
        """The probe's lane may skip this extension on its unsampled steps (diag.probe.lane): not while it
        reads the debug state every step (anomaly detection or a profiler was seen on) or measures the
        training's host syncs (a CUDA run's sync window)."""
        return not self._debug_watch and not self._sync_open and not (self._cuda_training and not self._sync_done)

    # ---- install / uninstall -----------------------------------------------------------------------
    def install(self, probe) -> None:
        import torch

        self._probe = probe
        self._torch = torch
        self._anomaly_on = torch.is_anomaly_enabled
        self._profiler_on = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", _false)
        self._install_amp(probe, torch)
        self._install_tuning(probe, torch)
        idle = getattr(probe, "idle", None)
        if callable(idle):
            idle(self, "on_forward")     # woken by the first convolutional model (on_model)

    def uninstall(self, probe) -> None:
        self._close_sync(probe, emit=False)
        remove_hooks(self._hooks)
        self._patches.undo()

    def _patch(self, owner, name: str, new, bucket: Patches | None = None) -> None:
        (self._patches if bucket is None else bucket).patch(owner, name, new)

    def _live(self) -> bool:
        p = self._probe
        return p is not None and p.is_live()

    # ---- models and forwards -----------------------------------------------------------------------
    def on_model(self, probe, module, info) -> None:
        devices = info.get("devices") or []
        if any(str(d).startswith("cuda") for d in devices):
            self._cuda_training = True
        self._model_parallel(module, info)
        self._model_tuning(module, info)
        wake = getattr(probe, "wake", None)
        if self._conv_models and callable(wake):
            wake(self, "on_forward")

    def on_forward(self, probe, module, args, kwargs, output, training) -> None:
        # the training input shapes of convolutional models (cudnn.benchmark): idle until one is seen
        if self._conv_models:
            self._input_shape(probe, module, args)

    # ---- steps -------------------------------------------------------------------------------------
    def on_step_end(self, probe, step) -> None:
        # tuning's per-step debug count, inlined: on_step_end is the per-step hot path, and after a deep
        # step's work each C call and module-dict lookup here is a cache miss of microseconds (issue 20).
        # Anomaly detection and profilers are read every step once one was seen (switched on through
        # torch's API, which tuning.py patches, or found on by a read); until then every DEBUG_EVERY-th step
        d = self.debug
        index = step.get("index", 0)
        # the training steps so far (the step's index: the lane's steps, diag.probe.lane, skip this hook)
        if index > d["steps"]:
            d["steps"] = index
        if self._debug_watch or index >= self._debug_next:
            self._debug_next = index + DEBUG_EVERY
            try:
                if self._anomaly_on():
                    d["anomaly_steps"] += 1
                    self._debug_watch = True
                    self._dirty.add("debug")
                if self._profiler_on():
                    d["profiler_steps"] += 1
                    self._debug_watch = True
                    self._dirty.add("debug")
            except Exception:
                pass
        if self._sync_open or (self._cuda_training and not self._sync_done):   # no call on CPU runs
            self._sync_step(probe, index)
        if index >= self._next_flush:
            self._next_flush = _next_flush(index)
            self._flush(probe)

    def on_exit(self, probe, status) -> None:
        self._close_sync(probe)
        self._dirty.add("debug")
        self._flush(probe)

    # ---- events ------------------------------------------------------------------------------------
    _PATHS = {"scaler": "amp.scaler", "eval_graph": "extras.eval_graph", "input_shapes": "extras.input_shapes",
              "data_parallel": "extras.data_parallel", "optimizers": "extras.optimizers",
              "module_zero_grad": "extras.module_zero_grad", "debug": "extras.debug",
              "compile": "extras.compile", "sync": "sync", "copies": "extras.copies"}

    def _mark(self, name: str, now: bool = False) -> None:
        self._dirty.add(name)
        if now and self._probe is not None:
            self._flush(self._probe)

    def _flush(self, probe) -> None:
        if not self._dirty:
            return
        dirty, self._dirty = self._dirty, set()
        for name in sorted(dirty):
            value = getattr(self, name)
            if name in ("sync",):
                probe.emit(E.MERGE, path=self._PATHS[name], value=value)
            else:
                probe.emit(E.SET, path=self._PATHS[name], value=value)


__all__ = ["EVAL_MEASURE", "FLUSH_AT", "MAX_GRAPH_NODES", "MAX_LOCATE", "MAX_SHAPES", "MAX_SITES", "PerfProbe",
           "SYNC_FIRST_STEP", "SYNC_MSG", "SYNC_STEPS", "graph_saved_bytes", "h2d_target"]
