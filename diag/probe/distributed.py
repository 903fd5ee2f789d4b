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
    * collectives the script calls itself (``dist.all_reduce(loss)`` for logging, ``barrier()``, ...);
  and ``ddp_sync`` / ``ddp_no_sync``: training forwards of a DDP model with gradient
  synchronisation on / off (inside ``no_sync()``), for the gradient-accumulation check;
- per-rank memory: peak CUDA memory allocated/reserved on this rank's device (when CUDA is in
  use) and the process's peak resident host memory.

Cheap on the hot path: a few ``perf_counter`` calls per step, one ``getrusage`` per step, one event
every ``MEMORY_EVERY`` steps. Inactive (no patches, nothing recorded) in a single-process run that
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
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list",
               "barrier", "all_to_all", "all_to_all_single", "gather", "scatter", "monitored_barrier")
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
        self._coll: dict[str, list] = {}            # name -> [calls, seconds]
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
        self._emit_totals(probe)

    # ---- models and forwards -----------------------------------------------------------------------
    def on_model(self, probe, module, info) -> None:
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

    # ---- the script's own collectives --------------------------------------------------------------
    def _patch_collectives(self, probe) -> None:
        try:
            import torch.distributed as dist
        except Exception:
            return
        if not dist.is_available():
            return
        ext = self
        for name in COLLECTIVES:
            orig = getattr(dist, name, None)
            if orig is None or not callable(orig):
                continue

            def make(orig, name):
                def wrapper(*args, **kwargs):
                    if not probe.is_live():
                        return orig(*args, **kwargs)
                    t0 = time.perf_counter()
                    try:
                        return orig(*args, **kwargs)
                    finally:
                        dt = time.perf_counter() - t0
                        c = ext._coll.get(name)
                        if c is None:
                            c = ext._coll[name] = [0, 0.0]
                        c[0] += 1
                        c[1] += dt
                        if not kwargs.get("async_op"):
                            ext._wait[ext._phase()] += dt
                wrapper.__wrapped__ = orig
                wrapper.__name__ = getattr(orig, "__name__", name)
                wrapper.__doc__ = getattr(orig, "__doc__", None)
                return wrapper

            self._patches.patch(dist, name, make(orig, name))

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
            "collectives": {k: {"calls": v[0], "s": round(v[1], 6)} for k, v in self._coll.items()},
            "steps": self._steps,
            "measured": ["ddp_grad_sync", "ddp_buffer_sync", "script_collectives"],
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
