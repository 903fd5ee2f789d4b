"""Probe extension for multi-process runs (torchrun, DistributedDataParallel).

Records into the rank section ``distributed`` (see docs/distributed.md for the shape):

- the process group: backend (``gloo``, ``nccl``, ``cpu:gloo,cuda:nccl``), world size, rank, which
  backends this torch build has, the launcher's variables (node rank, local world size, run id);
- every DDP model: device, bucket size, find_unused_parameters, static_graph, broadcast_buffers,
  comm hook, and the parameters that received no gradient in the first few training forwards
  (a walk of the autograd graph from the outputs, as DDP's own find_unused_parameters does);
- per step (``StepRecord.extra``): ``comm_wait_s``, the time this rank waited in collectives, taken
  *out of* the phase it happened in, so that data/forward/backward/optimizer/other are this rank's
  own work and ``total_s = data + forward + backward + optimizer + other + comm_wait``.
  Sources of the wait:
    * DDP's gradient all-reduce: the time from the end of this rank's local backward until DDP's
      reducer has finished waiting for the buckets' all-reduce (two autograd final callbacks around
      DDP's own ``finalize_backward`` callback; no comm hook is registered, so the user's own
      ``register_comm_hook`` keeps working);
    * DDP's buffer broadcast before forward (``broadcast_buffers=True`` with buffers, e.g. BatchNorm);
    * every collective called through ``torch.distributed``: the script's own (``dist.all_reduce(loss)``
      for logging, ``barrier()``, ...) and the frameworks' (FSDP2's ``all_gather_single`` /
      ``reduce_scatter_single``, FSDP1's, DeepSpeed ZeRO's ``all_gather_into_tensor`` /
      ``reduce_scatter_tensor``); an asynchronous one (``async_op=True``) for its launch and its
      ``work.wait()`` (``Work.wait`` patched once one was seen), its time in flight before the wait
      kept apart (``comm_in_flight_s``: what could overlap the step's own work);
  per kind (all_gather, reduce_scatter, all_reduce, broadcast, barrier, all_to_all) ``extra.comm``:
  ``[calls, exposed seconds, bytes]``; on CUDA, on sampled steps, CUDA events on the current stream
  around each collective on a CUDA tensor, each ``work.wait()`` and FSDP2's ``wait_for_unshard``: the
  compute stream's stall, resolved a step later into ``distributed.comm_device``;
- a sharded model's configuration (``distributed.fsdp``: FSDP2 units, FSDP1 options, a DeepSpeed
  engine's ZeRO settings; diag/probe/fsdp.py);
  and ``ddp_sync`` / ``ddp_no_sync``: training forwards of a DDP model with gradient
  synchronisation on / off (inside ``no_sync()``), for the gradient-accumulation check;
- per-rank memory: peak CUDA memory allocated/reserved on this rank's device (when CUDA is in
  use) and the process's peak resident host memory.

Cheap on the hot path: a few ``perf_counter`` calls per step, one ``getrusage`` per step, one event
every ``MEMORY_EVERY`` steps; a collective costs about 3 us more (its wrapper), only when called. Inactive (no patches, nothing recorded) in a single-process run that
never initialises torch.distributed nor wraps a model in DDP.
"""
from __future__ import annotations

import os
import time
import weakref

from diag.evidence import events as E
from diag.probe.hooks import Patches
from diag.probe.models import find_ddp

MEMORY_EVERY = 10          # steps between two `distributed.memory` events
UNUSED_CHECK_FORWARDS = 3  # DDP training forwards whose autograd graph is walked for unused params
MAX_NAMES = 20
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "_all_gather_base",
               "all_gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single",
               "_reduce_scatter_base", "broadcast", "broadcast_object_list", "barrier", "all_to_all",
               "all_to_all_single", "gather", "scatter", "monitored_barrier")
# the kinds a step's communication is told in (FSDP2 in torch >= 2.10 calls all_gather_single and
# reduce_scatter_single; FSDP1 and DeepSpeed the *_into_tensor / *_tensor forms, older code the _base ones)
KIND = {"all_gather": "all_gather", "all_gather_into_tensor": "all_gather", "all_gather_single": "all_gather",
        "_all_gather_base": "all_gather", "all_gather_object": "all_gather",
        "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
        "reduce_scatter_single": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
        "all_reduce": "all_reduce", "reduce": "all_reduce",
        "broadcast": "broadcast", "broadcast_object_list": "broadcast",
        "barrier": "barrier", "monitored_barrier": "barrier",
        "all_to_all": "all_to_all", "all_to_all_single": "all_to_all"}
MAX_PENDING = 256          # async works remembered until their wait() (works a C++ caller waits for are dropped)
MAX_DEVICE_STEPS = 64      # per-step device-clock records kept (distributed.comm_device)


def _nbytes(t) -> int:
    try:
        return int(t.numel()) * int(t.element_size())
    except Exception:
        return 0


def _first_tensor(args, kwargs) -> int:
    """Bytes of the call's first tensor (or list of tensors): the payload of all_reduce, broadcast, ..."""
    for a in (*args[:2], *kwargs.values()):
        if hasattr(a, "element_size"):
            return _nbytes(a)
        if isinstance(a, (list, tuple)) and a and hasattr(a[0], "element_size"):
            return sum(_nbytes(t) for t in a[:1024])
    return 0


def _arg(args, kwargs, i, *names):
    if len(args) > i:
        return args[i]
    for n in names:
        if n in kwargs:
            return kwargs[n]
    return None


def _gathered(args, kwargs) -> int:
    """An all-gather's payload: the gathered (output) tensor, what every rank ends up holding."""
    out = _arg(args, kwargs, 0, "output_tensor", "tensor_list")
    if isinstance(out, (list, tuple)):
        return sum(_nbytes(t) for t in out[:1024])
    return _nbytes(out) if out is not None else 0


def _scattered(args, kwargs) -> int:
    """A reduce-scatter's payload: the full (input) tensor every rank contributes."""
    inp = _arg(args, kwargs, 1, "input", "input_tensor", "input_list")
    if isinstance(inp, (list, tuple)):
        return sum(_nbytes(t) for t in inp[:1024])
    return _nbytes(inp) if inp is not None else 0


_PAYLOAD = {"all_gather": _gathered, "all_gather_into_tensor": _gathered, "all_gather_single": _gathered,
            "_all_gather_base": _gathered, "reduce_scatter": _scattered, "reduce_scatter_tensor": _scattered,
            "reduce_scatter_single": _scattered, "_reduce_scatter_base": _scattered,
            "all_gather_object": lambda a, k: 0, "broadcast_object_list": lambda a, k: 0,
            "barrier": lambda a, k: 0, "monitored_barrier": lambda a, k: 0}


def _first_cuda(args, kwargs):
    for a in (*args[:2], *kwargs.values()):
        if isinstance(a, (list, tuple)):
            a = a[0] if a else None
        if getattr(a, "is_cuda", False):
            return a
    return None


class CudaStreamClock:
    """CUDA events on the current stream (the timeline's clock interface: ``record``, ``query``,
    ``elapsed_ms``) and whether the current stream is the device's default one, the stream the
    training loop computes on unless it chose another."""

    def __init__(self):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA")
        self._torch = torch

    def record(self):
        e = self._torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def on_compute_stream(self) -> bool:
        cuda = self._torch.cuda
        return cuda.current_stream() == cuda.default_stream()

    def query(self, e) -> bool:
        return bool(e.query())

    def elapsed_ms(self, a, b) -> float:
        return float(a.elapsed_time(b))
LAUNCHER_ENV = {"CUDA_VISIBLE_DEVICES": "cuda_visible_devices", "LOCAL_WORLD_SIZE": "local_world_size", "GROUP_RANK": "node_rank",
                "ROLE_WORLD_SIZE": "role_world_size", "TORCHELASTIC_RUN_ID": "run_id",
                "TORCHELASTIC_RESTART_COUNT": "restart_count", "TORCHELASTIC_MAX_RESTARTS": "max_restarts",
                "MASTER_ADDR": "master_addr", "MASTER_PORT": "master_port"}


def _tensors(obj, out: list, depth: int = 0) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        if obj.requires_grad and obj.grad_fn is not None:
            out.append(obj)
    elif depth < 3 and isinstance(obj, (list, tuple)):
        for o in obj[:32]:
            _tensors(o, out, depth + 1)
    elif depth < 3 and isinstance(obj, dict):
        for o in list(obj.values())[:32]:
            _tensors(o, out, depth + 1)
    return out


def reached_params(outputs: list) -> set[int]:
    """ids of the leaf tensors (parameters) whose gradient the outputs' autograd graph computes."""
    seen: set = set()
    found: set[int] = set()
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        var = getattr(fn, "variable", None)   # AccumulateGrad nodes hold the leaf
        if var is not None:
            found.add(id(var))
        for nxt, _ in getattr(fn, "next_functions", ()):
            if nxt is not None and nxt not in seen:
                stack.append(nxt)
    return found


class DistributedProbe:
    def __init__(self):
        self.active = False
        self._patches = Patches()
        self._probe = None
        self._models: dict[int, dict] = {}          # probe model id -> record
        self._ddp_refs: dict[int, object] = {}     # probe model id -> weakref(DDP)
        self._reached: dict[int, set] = {}         # probe model id -> names of params given a grad
        self._pg_done = False
        self._pg_tries = 0
        # per-step accumulators
        self._wait = {"data": 0.0, "forward": 0.0, "backward": 0.0, "other": 0.0}
        self._sync = 0
        self._no_sync = 0
        # totals
        self._grad_wait = 0.0
        self._buffer_wait = 0.0
        self._coll: dict[str, list] = {}            # name -> [calls, s, bytes, exposed_s, async, found_done, in_flight_s]
        self._step_kind: dict[str, list] = {}       # this step: kind -> [calls, exposed_s, bytes]
        self._step_overlap = 0.0                    # this step: async collectives' time in flight before their wait
        self._depth = 0                             # inside a patched collective (nested calls are its own)
        self._pending: dict[int, tuple] = {}        # id(work) -> (name, kind, issued at)
        self._wait_patched = False
        self._dist = None
        self._device_on = True                      # record CUDA events for collectives on CUDA tensors
        self._dev_clock = None
        self._dev_failed = False
        self._dev_pending: list = []
        self._fsdp: dict | None = None
        self._steps = 0
        self._fwd_sync_total = 0
        self._fwd_nosync_total = 0
        # backward callbacks
        self._armed = False
        self._a = 0.0
        # memory
        self._mem_device = None
        self._mem_peak = {}
        self._last_mem_emit = 0

    # ---- lifecycle ---------------------------------------------------------------------------------
    def install(self, probe) -> None:
        self._probe = probe
        idle = getattr(probe, "idle", None)
        if callable(idle):   # per-step hooks with nothing to do until a DDP model or a process group
            idle(self, "on_forward")
            idle(self, "on_step_end")
        launcher = {}
        for var, key in LAUNCHER_ENV.items():
            v = os.environ.get(var)
            if v is not None:
                launcher[key] = int(v) if v.isdigit() else v
        if probe.world_size > 1 or launcher.get("run_id") is not None:
            self._activate(probe)
            probe.emit(E.MERGE, path="distributed", value={
                "world_size": probe.world_size, "rank": probe.rank, "local_rank": probe.local_rank,
                "launcher": launcher})
            self._patch_collectives(probe)

    def _activate(self, probe) -> None:
        if not self.active:
            self.active = True
            probe.emit(E.SET, path="distributed.active", value=True)
            wake = getattr(probe, "wake", None)
            if callable(wake):
                wake(self, "on_forward")
                wake(self, "on_step_end")

    def uninstall(self, probe) -> None:
        self._patches.undo()

    def on_exit(self, probe, status) -> None:
        if not self.active:
            return
        self._process_group(probe, force=True)
        self._memory(probe, emit=True)
        if self._dev_pending:
            self._device_poll(probe, force=True)
        self._emit_totals(probe)

    # ---- models and forwards -----------------------------------------------------------------------
    def on_model(self, probe, module, info) -> None:
        if self._fsdp is None:
            self._sharded(probe, module, info)
        ddp = find_ddp(module)
        if ddp is None:
            return
        self._activate(probe)
        mid = info["id"]
        hook = None
        hooks = getattr(ddp, "_comm_hooks", None) or []
        if hooks:
            fn = hooks[-1][0]
            hook = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
        try:
            n_buffers = len(getattr(ddp, "modules_buffers", []) or [])
        except Exception:
            n_buffers = None
        params = [p for p in ddp.parameters() if p.requires_grad]
        cap = getattr(ddp, "bucket_bytes_cap", None)
        rec = {
            "model": mid, "cls": info.get("cls"),
            "device": str(params[0].device) if params else None,
            "device_ids": [str(d) for d in (getattr(ddp, "device_ids", None) or [])],
            "find_unused_parameters": bool(getattr(ddp, "find_unused_parameters", False)),
            "static_graph": bool(getattr(ddp, "static_graph", False)),
            "gradient_as_bucket_view": bool(getattr(ddp, "gradient_as_bucket_view", False)),
            "broadcast_buffers": bool(getattr(ddp, "broadcast_buffers", True)),
            "buffers": n_buffers,
            "bucket_cap_mb": round(cap / (1 << 20), 3) if cap else None,
            "comm_hook": hook,
            "params": len(params),
            "param_bytes": int(sum(p.numel() * p.element_size() for p in params)),
            "unused_params": None, "unused_names": [], "forwards_checked": 0,
        }
        self._models[mid] = rec
        try:
            self._ddp_refs[mid] = weakref.ref(ddp)
        except TypeError:
            pass
        self._time_buffer_sync(ddp)
        self._emit_models(probe)
        if self._mem_device is None and params and params[0].device.type == "cuda":
            self._mem_device = params[0].device

    def _sharded(self, probe, module, info) -> None:
        """FSDP2 / FSDP1's configuration, once, from the first sharded model."""
        try:
            from diag.probe.fsdp import describe

            rec = describe(module)
        except Exception as e:
            probe.report_error("distributed.fsdp", e)
            return
        if rec is None:
            return
        self._activate(probe)
        rec["model"] = info.get("id")
        self._fsdp = rec
        probe.emit(E.SET, path="distributed.fsdp", value=rec)
        if rec["api"] == "fsdp2" and "cuda" in rec.get("devices", []):
            self._time_unshard_waits()

    def _time_unshard_waits(self) -> None:
        """FSDP2 on CUDA all-gathers on a stream of its own; the compute stream waits for it in
        ``wait_for_unshard`` (an event wait, no host block). Events on the compute stream around that
        call give the stall on the device clock (the all-gather's copy-out is included: a memory copy)."""
        import sys

        mod = sys.modules.get("torch.distributed.fsdp._fully_shard._fsdp_param_group")
        cls = getattr(mod, "FSDPParamGroup", None)
        orig = getattr(cls, "wait_for_unshard", None)
        if orig is None:
            return
        ext = self

        def wait_for_unshard(group, *args, **kwargs):
            dev = ext._device_wait_start() if ext._device_on and ext._clock() is not None else None
            try:
                return orig(group, *args, **kwargs)
            finally:
                if dev is not None:
                    ext._device_end(dev, "all_gather", 0, waited=True)

        wait_for_unshard.__wrapped__ = orig
        try:
            self._patches.patch(cls, "wait_for_unshard", wait_for_unshard)
        except Exception:
            pass

    def _emit_models(self, probe) -> None:
        probe.emit(E.SET, path="distributed.ddp.models", value=list(self._models.values()))

    def _time_buffer_sync(self, ddp) -> None:
        """Time DDP's buffer broadcast before forward (a collective: waits for every rank)."""
        orig = getattr(ddp, "_sync_buffers", None)
        if orig is None or "_sync_buffers" in ddp.__dict__:
            return
        ext = self

        def _sync_buffers(*a, **k):
            t0 = time.perf_counter()
            try:
                return orig(*a, **k)
            finally:
                dt = time.perf_counter() - t0
                ext._buffer_wait += dt
                ext._wait[ext._phase()] += dt

        try:
            self._patches.patch_instance(ddp, "_sync_buffers", _sync_buffers)
        except Exception:
            pass

    def on_forward(self, probe, module, args, kwargs, output, training) -> None:
        if not self._models:
            return
        ddp = find_ddp(module)
        if ddp is None:
            return
        mid = probe.model_id(module)
        rec = self._models.get(mid)
        sync = bool(getattr(ddp, "require_backward_grad_sync", True))
        if sync:
            self._sync += 1
            self._fwd_sync_total += 1
        else:
            self._no_sync += 1
            self._fwd_nosync_total += 1
        need_walk = rec is not None and rec["forwards_checked"] < UNUSED_CHECK_FORWARDS
        if not sync and not need_walk:
            return
        outs = _tensors(output, [])
        if not outs:
            return
        if sync:
            try:
                outs[0].register_hook(self._on_output_grad)
            except Exception:
                pass
        if need_walk:
            self._unused(probe, ddp, rec, outs)

    def _unused(self, probe, ddp, rec, outs) -> None:
        """Parameters that no checked forward's graph reached (what DDP calls unused)."""
        ids = reached_params(outs)
        reached = self._reached.setdefault(rec["model"], set())
        names = []
        for name, p in ddp.module.named_parameters():
            if not p.requires_grad:
                continue
            if id(p) in ids:
                reached.add(name)
            elif name not in reached:
                names.append(name)
        rec["forwards_checked"] += 1
        rec["unused_params"] = len(names)
        rec["unused_names"] = names[:MAX_NAMES]
        self._emit_models(probe)

    # ---- collective wait after backward (DDP's gradient all-reduce) --------------------------------
    def _on_output_grad(self, grad):
        if not self._armed:
            self._armed = True
            try:
                import torch

                torch.autograd.Variable._execution_engine.queue_callback(self._after_local_backward)
            except Exception:
                self._armed = False
        return None

    def _after_local_backward(self):
        # Runs before DDP's reducer callback (queued later, when the last bucket became ready); the
        # callback queued here runs after DDP's, when the all-reduce of every bucket has been waited for.
        self._a = time.perf_counter()
        try:
            import torch

            torch.autograd.Variable._execution_engine.queue_callback(self._after_grad_sync)
        except Exception:
            self._armed = False

    def _after_grad_sync(self):
        dt = time.perf_counter() - self._a
        self._armed = False
        self._grad_wait += dt
        # in the phase the probe is in: the backward when it times backwards from the
        # torch.autograd.backward call (the engine runs this callback inside that call), "other" when
        # its own end-of-backward callback ran before this one (the fallback: a hook on the output)
        self._wait[self._phase()] += dt

    # ---- collectives: the script's own, FSDP's, DeepSpeed's (every call through torch.distributed) ---
    def _patch_collectives(self, probe) -> None:
        try:
            import torch.distributed as dist
        except Exception:
            return
        if not dist.is_available():
            return
        try:   # CUDA events only where CUDA can be used (cheap: no CUDA initialisation)
            import torch

            self._device_on = bool(torch.cuda.is_available())
        except Exception:
            self._device_on = False
        for name in COLLECTIVES:
            orig = getattr(dist, name, None)
            if orig is None or not callable(orig):
                continue
            self._patches.patch(dist, name, self._make_wrapper(probe, orig, name))
        self._dist = dist

    def _make_wrapper(self, probe, orig, name):
        ext = self
        kind = KIND.get(name, "other")
        pick = _PAYLOAD.get(name, _first_tensor)

        def wrapper(*args, **kwargs):
            if ext._depth or not probe.is_live():
                return orig(*args, **kwargs)
            ext._depth += 1
            dev = None
            t0 = time.perf_counter()
            try:
                if ext._device_on:
                    dev = ext._device_start(args, kwargs, pick)
                result = orig(*args, **kwargs)
            finally:
                t1 = time.perf_counter()
                ext._depth -= 1
            ext._account(name, kind, t1 - t0, args, kwargs, pick, result, t1, dev)
            return result
        wrapper.__wrapped__ = orig
        wrapper.__name__ = getattr(orig, "__name__", name)
        wrapper.__qualname__ = getattr(orig, "__qualname__", name)
        wrapper.__doc__ = getattr(orig, "__doc__", None)
        return wrapper

    def _account(self, name, kind, dt, args, kwargs, pick, result, t_end, dev) -> None:
        """Book one collective call: per name (totals), per kind (this step), exposed or in flight."""
        try:
            nbytes = pick(args, kwargs)
        except Exception:
            nbytes = 0
        c = self._coll.get(name)
        if c is None:
            c = self._coll[name] = [0, 0.0, 0, 0.0, 0, 0, 0.0]   # calls, s, bytes, exposed_s, async, found_done, in_flight_s
        c[0] += 1
        c[1] += dt
        c[2] += nbytes
        k = self._step_kind.get(kind)
        if k is None:
            k = self._step_kind[kind] = [0, 0.0, 0]                # calls, exposed_s, bytes
        k[0] += 1
        k[2] += nbytes
        phase = self._phase()
        # the host time in the call is the thread's: a blocking collective (gloo, or any async_op=False
        # call that waits) is exposed whole; an async one exposes its launch here and its wait later
        c[3] += dt
        k[1] += dt
        self._wait[phase] += dt
        if result is not None and hasattr(result, "wait"):
            c[4] += 1
            self._track_async(result, name, kind, t_end)
        if dev is not None:
            self._device_end(dev, kind, nbytes)

    # ---- async collectives: the part of their wait the thread spent --------------------------------
    def _track_async(self, work, name, kind, t_issued) -> None:
        if not self._wait_patched:
            self._patch_work_wait()
        if len(self._pending) >= MAX_PENDING:          # works never waited from Python (a C++ caller)
            self._pending.pop(next(iter(self._pending)))
        self._pending[id(work)] = (name, kind, t_issued)

    def _patch_work_wait(self) -> None:
        self._wait_patched = True
        try:
            Work = self._dist.distributed_c10d.Work
        except Exception:
            return
        orig = Work.wait
        ext = self

        def wait(work, *args, **kwargs):
            rec = ext._pending.pop(id(work), None) if ext._pending else None
            if rec is None or ext._depth:
                return orig(work, *args, **kwargs)
            name, kind, t_issued = rec
            try:
                done = bool(work.is_completed())
            except Exception:
                done = False
            dev = ext._device_wait_start() if ext._device_on else None
            t0 = time.perf_counter()
            try:
                return orig(work, *args, **kwargs)
            finally:
                t1 = time.perf_counter()
                ext._account_wait(name, kind, t1 - t0, t0 - t_issued, done, dev)

        wait.__wrapped__ = orig
        try:
            self._patches.patch(Work, "wait", wait)
        except Exception:
            pass

    def _account_wait(self, name, kind, dt, in_flight, done, dev) -> None:
        c = self._coll.get(name)
        if c is not None:
            c[3] += dt
            c[5] += 1 if done else 0
            c[6] += max(in_flight, 0.0)
        k = self._step_kind.get(kind)
        if k is None:
            k = self._step_kind[kind] = [0, 0.0, 0]
        k[1] += dt
        self._step_overlap += max(in_flight, 0.0)
        self._wait[self._phase()] += dt
        if dev is not None:
            self._device_end(dev, kind, 0, waited=True)

    # ---- the device clock: collectives and waits on the compute stream (CUDA events) ---------------
    def _device_start(self, args, kwargs, pick):
        """Events around a collective on a CUDA tensor, on sampled steps: (clock, start, compute?)."""
        if not getattr(self._probe, "sampled", True):
            return None
        t = _first_cuda(args, kwargs)
        if t is None:
            return None
        clock = self._clock()
        if clock is None:
            return None
        return (clock.record(), clock.on_compute_stream())

    def _device_wait_start(self):
        if not getattr(self._probe, "sampled", True) or self._dev_clock is None:
            return None
        return (self._dev_clock.record(), True)   # a wait makes the current stream wait: a stall there

    def _device_end(self, dev, kind, nbytes, waited: bool = False) -> None:
        clock = self._dev_clock
        start, compute = dev
        if len(self._dev_pending) < 4096:
            self._dev_pending.append((self._steps + 1, kind, compute, waited, nbytes, start, clock.record()))

    def _clock(self):
        if self._dev_clock is None and not self._dev_failed:
            try:
                self._dev_clock = CudaStreamClock()
            except Exception:
                self._dev_failed = True
                self._device_on = False
        return self._dev_clock

    def _device_poll(self, probe, force: bool = False) -> None:
        """Resolve the event pairs of finished steps (a step later, when their events are done)."""
        if not self._dev_pending:
            return
        clock = self._dev_clock
        keep = []
        per_step: dict[int, dict] = {}
        for item in self._dev_pending:
            step, kind, compute, waited, nbytes, a, b = item
            if step > self._steps and not force:
                keep.append(item)
                continue
            try:
                if not clock.query(b):
                    if force:
                        continue
                    keep.append(item)
                    continue
                s = clock.elapsed_ms(a, b) / 1e3
            except Exception:
                continue
            rec = per_step.setdefault(step, {"step": step, "exposed_s": 0.0, "comm_s": 0.0, "kinds": {}})
            if compute:
                rec["exposed_s"] += s
                rec["kinds"][kind] = rec["kinds"].get(kind, 0.0) + s
            if not waited:
                rec["comm_s"] += s
        self._dev_pending = keep
        for step in sorted(per_step):
            rec = per_step[step]
            rec["exposed_s"] = round(rec["exposed_s"], 9)
            rec["comm_s"] = round(rec["comm_s"], 9)
            rec["kinds"] = {k: round(v, 9) for k, v in rec["kinds"].items()}
            probe.emit(E.APPEND, path="distributed.comm_device", value=rec, limit=MAX_DEVICE_STEPS)

    def _phase(self) -> str:
        p = self._probe
        if p is None:
            return "other"
        return p.phase()

    # ---- steps -------------------------------------------------------------------------------------
    def on_step_end(self, probe, step) -> None:
        if not self.active:
            return
        self._steps += 1
        wait = self._wait
        total_wait = 0.0
        for phase, key in (("data", "data_s"), ("forward", "forward_s"), ("backward", "backward_s"),
                           ("other", "other_s")):
            w = min(wait[phase], max(step.get(key, 0.0), 0.0))
            if w > 0:
                step[key] = step[key] - w
                total_wait += w
            wait[phase] = 0.0
        extra = step.setdefault("extra", {})
        extra["comm_wait_s"] = round(total_wait, 9)
        if self._step_kind:
            # per kind: [calls, seconds the thread spent in the calls and their waits, bytes]
            extra["comm"] = {k: [v[0], round(v[1], 9), v[2]] for k, v in self._step_kind.items()}
            self._step_kind = {}
            if self._step_overlap:
                extra["comm_in_flight_s"] = round(self._step_overlap, 9)
                self._step_overlap = 0.0
        if self._dev_pending:
            self._device_poll(probe)
        if self._models:
            extra["ddp_sync"] = self._sync
            extra["ddp_no_sync"] = self._no_sync
        self._sync = self._no_sync = 0
        if not self._pg_done:
            self._process_group(probe)
        # peaks are tracked by the kernel (ru_maxrss) and the CUDA allocator: read them only when
        # they are written out
        if self._steps - self._last_mem_emit >= MEMORY_EVERY or self._steps == 2:
            self._memory(probe, emit=True)
        if self._steps % MEMORY_EVERY == 0:
            self._emit_totals(probe)

    def _emit_totals(self, probe) -> None:
        probe.emit(E.SET, path="distributed.comm", value={
            "grad_sync_wait_s": round(self._grad_wait, 6),
            "buffer_sync_wait_s": round(self._buffer_wait, 6),
            "collectives": {k: {"calls": v[0], "s": round(v[1], 6), "bytes": v[2], "exposed_s": round(v[3], 6),
                                "async": v[4], "found_done": v[5], "in_flight_s": round(v[6], 6),
                                "kind": KIND.get(k, "other")}
                            for k, v in self._coll.items()},
            "steps": self._steps,
            "measured": ["ddp_grad_sync", "ddp_buffer_sync", "script_collectives", "framework_collectives",
                         "async_waits"] + (["device_clock"] if self._dev_clock is not None else []),
        })
        if self._models:
            probe.emit(E.MERGE, path="distributed.ddp", value={
                "forwards_sync": self._fwd_sync_total, "forwards_no_sync": self._fwd_nosync_total})

    # ---- process group -----------------------------------------------------------------------------
    def _process_group(self, probe, force: bool = False) -> None:
        if self._pg_done or (not force and self._pg_tries >= 5):
            return
        self._pg_tries += 1
        try:
            import torch
            import torch.distributed as dist
        except Exception:
            return
        out: dict = {}
        try:
            out["available"] = {
                "distributed": bool(dist.is_available()),
                "nccl": bool(dist.is_available() and dist.is_nccl_available()),
                "gloo": bool(dist.is_available() and dist.is_gloo_available()),
                "mpi": bool(dist.is_available() and dist.is_mpi_available()),
            }
        except Exception:
            pass
        try:
            if torch.cuda.is_available():
                v = torch.cuda.nccl.version()
                out["nccl_version"] = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:
            pass
        initialized = bool(dist.is_available() and dist.is_initialized())
        out["initialized"] = initialized
        if initialized:
            try:
                out["backend"] = str(dist.get_backend())
                out["world_size"] = dist.get_world_size()
                out["rank"] = dist.get_rank()
                try:
                    out["backend_config"] = str(dist.get_backend_config())
                except Exception:
                    pass
            except Exception:
                pass
            self._pg_done = True
        probe.emit(E.MERGE, path="distributed", value=out)

    # ---- memory ------------------------------------------------------------------------------------
    def _memory(self, probe, emit: bool) -> None:
        m = self._mem_peak
        try:
            import resource
            import sys

            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            m["host_peak_rss_bytes"] = int(rss if sys.platform == "darwin" else rss * 1024)
        except Exception:
            pass
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                dev = self._mem_device
                if dev is None:
                    dev = torch.device("cuda", torch.cuda.current_device())
                m["device"] = str(dev)
                m["peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(dev))
                m["peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved(dev))
                if "total_bytes" not in m:
                    props = torch.cuda.get_device_properties(dev)
                    m["total_bytes"] = int(props.total_memory)
                    uuid = getattr(props, "uuid", None)
                    if uuid is not None:
                        m["device_uuid"] = str(uuid)   # the physical GPU, whatever CUDA_VISIBLE_DEVICES says
            else:
                m.setdefault("device", "cpu")
        except Exception:
            pass
        if emit:
            self._last_mem_emit = self._steps
            probe.emit(E.MERGE, path="distributed.memory", value=dict(m))
