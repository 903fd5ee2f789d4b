"""Probe extension for the performance checklist (checks/amp.py, dataloader.py, eval.py, parallel.py,
tuning.py, sync.py): what those checks need that the core probe does not record.

What it writes (the shapes are documented in docs/performance-checks.md):

``step.extra["pre_forward_s"]``  seconds between the previous step's end and this step's first training
                                 forward, minus the DataLoader wait and eval forwards in between: work the
                                 main thread did to build the batch (hand-made batching, ``.to(device)``).
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

import inspect
import linecache
import os
import sys
import time
import warnings

from diag.probe.frames import frame_location
from diag.probe.frames import is_library_file as _is_library_file
from diag.probe.hooks import Patches, remove_hooks
from diag.probe.tensors import first_tensor, grad_tensor

SYNC_MSG = "called a synchronizing CUDA operation"   # the text of torch's sync debug warning
SYNC_FIRST_STEP = 1     # the window opens at the end of this step (the first one is warm-up)
SYNC_STEPS = 20         # steps counted inside the window
MAX_LOCATE = 5000       # synchronisations / copies located (counting goes on without location)
MAX_SITES = 10          # sites kept per list
EVAL_MEASURE = 3        # eval forwards per site whose graph is measured
MAX_GRAPH_NODES = 50000
MAX_SHAPES = 16
FLUSH_AT = (1, 2, 5, 10, 20, 50)


def _loc_of(f) -> dict | None:
    loc = frame_location(f)
    if loc is not None:
        code = _source(loc["file"], loc["line"])
        if code:
            loc["code"] = code
    return loc


def _source(file: str, line: int | None) -> str | None:
    if not file or not line:
        return None
    try:
        text = linecache.getline(file, line).strip()
    except Exception:
        return None
    return text[:200] or None


def _count_at_caller(sites: dict) -> None:
    """Count one event at the user's line that caused it (sites: (file, line) -> site dict)."""
    f = _caller_outside_library()
    key = (f.f_code.co_filename, f.f_lineno) if f is not None else ("?", 0)
    site = sites.get(key)
    if site is None:
        site = sites[key] = {"file": key[0], "line": key[1],
                             "function": f.f_code.co_name if f is not None else None,
                             "code": _source(key[0], key[1]), "count": 0}
    site["count"] += 1


def _caller_outside_library():
    """The innermost frame in the user's code, skipping the warnings module too."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not (_is_library_file(fn) or fn.endswith(os.sep + "warnings.py")):
            return f
        f = f.f_back
    return None


def h2d_target(args, kwargs):
    """The device type a ``Tensor.to(...)``/``.cuda(...)`` call copies to (None when it keeps the
    device), and whether it asked for ``non_blocking``. Pure argument parsing, no copy."""
    import torch

    dev = kwargs.get("device")
    nb = bool(kwargs.get("non_blocking", False))
    if args:
        a0 = args[0]
        if isinstance(a0, (str, torch.device)):
            dev = a0
        elif isinstance(a0, int) and not isinstance(a0, bool):
            dev = "cuda"
        elif isinstance(a0, torch.Tensor):
            dev = a0.device        # .to(other_tensor)
        for a in args[1:3]:
            if a is True:
                nb = True
                break
    if dev is None:
        return None, nb
    if isinstance(dev, int) and not isinstance(dev, bool):
        return "cuda", nb
    t = dev if isinstance(dev, str) else getattr(dev, "type", str(dev))
    return t.split(":")[0], nb


class PerfProbe:
    def __init__(self):
        self._probe = None
        self._torch = None
        self._patches = Patches()
        self._hooks: list = []
        self._dirty: set[str] = set()
        self._cuda_training = False
        # amp
        self.scaler = {"created": 0, "enabled": None, "scale_calls": 0, "step_calls": 0,
                       "device": None, "init_scale": None, "location": None}
        # eval graph, shapes, data parallel, optimizers
        self.eval_graph: dict[str, dict] = {}
        self._conv_models: set[int] = set()
        self.input_shapes: dict[str, dict] = {}
        self._shape_sets: dict[int, set] = {}
        self.data_parallel: dict[str, dict] = {}
        self.optimizers: dict[str, dict] = {}
        self._opts_seen: set[int] = set()
        self.module_zero_grad = {"calls": 0, "set_to_none_false": 0, "s": 0.0, "location": None}
        # debug
        self.debug = {"steps": 0, "anomaly_steps": 0, "profiler_steps": 0, "anomaly_location": None,
                      "profiler_location": None, "profiler_created": 0}
        self.compile = {"calls": 0, "location": None, "models": []}
        # sync window (CUDA)
        self._sync_open = False
        self._sync_done = False
        self._sync_since = 0
        self._sync_located = 0
        self._sync_sites: dict[tuple, dict] = {}
        self.sync = {"state": "not started", "mode": None, "first_step": None, "last_step": None,
                     "steps": 0, "total": 0, "per_step": [], "sites": []}
        self._sync_filter = None
        self._orig_showwarning = None
        self._hook = self._showwarning     # one bound method, so that `is` finds it again
        self._copy_sites: dict[tuple, dict] = {}
        self.copies = {"h2d_copies": 0, "h2d_bytes": 0, "non_blocking_pageable": 0,
                       "non_blocking_pinned": 0, "blocking": 0, "steps": 0, "sites": [], "watched": False}
        self._copy_watch = False

    # ---- install / uninstall -----------------------------------------------------------------------
    def install(self, probe) -> None:
        import torch

        self._probe = probe
        self._torch = torch
        perf = {}
        try:
            perf["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        except Exception:
            perf["cpu_capability"] = None
        probe.emit("set", path="extras.perf", value=perf)
        self._patch_scaler(torch)
        self._patch_compile(torch)
        self._patch_debug(torch)
        self._patch_module_zero_grad(torch)
        try:
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            self._hooks.append(register_optimizer_step_pre_hook(self._opt_pre))
        except Exception as e:
            probe.report_error("PerfProbe.optimizer hook", e)

    def uninstall(self, probe) -> None:
        self._close_sync(probe, emit=False)
        remove_hooks(self._hooks)
        self._patches.undo()

    def _patch(self, owner, name: str, new, bucket: Patches | None = None) -> None:
        (self._patches if bucket is None else bucket).patch(owner, name, new)

    def _live(self) -> bool:
        p = self._probe
        return p is not None and p.is_live()

    # ---- GradScaler --------------------------------------------------------------------------------
    def _patch_scaler(self, torch) -> None:
        try:
            from torch.amp.grad_scaler import GradScaler
        except Exception:
            return
        ext = self
        orig_init, orig_scale, orig_step = GradScaler.__init__, GradScaler.scale, GradScaler.step

        def __init__(sc, *args, **kwargs):
            orig_init(sc, *args, **kwargs)
            if ext._live():
                try:
                    s = ext.scaler
                    s["created"] += 1
                    s["enabled"] = bool(sc.is_enabled())
                    s["device"] = str(getattr(sc, "_device", None) or "")
                    s["init_scale"] = float(getattr(sc, "_init_scale", 0.0) or 0.0) or None
                    if s["location"] is None:
                        s["location"] = _loc_of(_caller_outside_library())
                    ext._mark("scaler", now=True)
                except Exception as e:
                    ext._probe.report_error("PerfProbe.GradScaler", e)

        def scale(sc, outputs):
            if ext._live():
                try:
                    ext.scaler["scale_calls"] += 1
                    ext.scaler["enabled"] = bool(sc.is_enabled())
                    ext._dirty.add("scaler")
                except Exception:
                    pass
            return orig_scale(sc, outputs)

        def step(sc, optimizer, *args, **kwargs):
            if ext._live():
                ext.scaler["step_calls"] += 1
                ext._dirty.add("scaler")
            return orig_step(sc, optimizer, *args, **kwargs)

        __init__.__wrapped__ = orig_init
        scale.__wrapped__ = orig_scale
        step.__wrapped__ = orig_step
        self._patch(GradScaler, "__init__", __init__)
        self._patch(GradScaler, "scale", scale)
        self._patch(GradScaler, "step", step)

    # ---- torch.compile -----------------------------------------------------------------------------
    def _patch_compile(self, torch) -> None:
        orig = getattr(torch, "compile", None)
        if orig is None:
            return
        ext = self

        def compile(*args, **kwargs):
            if ext._live():
                try:
                    ext.compile["calls"] += 1
                    if ext.compile["location"] is None:
                        ext.compile["location"] = _loc_of(_caller_outside_library())
                    ext._stop_copy_watch()      # never leave a patched Tensor.to under dynamo
                    ext._mark("compile", now=True)
                except Exception as e:
                    ext._probe.report_error("PerfProbe.compile", e)
            return orig(*args, **kwargs)

        compile.__wrapped__ = orig
        compile.__doc__ = orig.__doc__
        compile.__name__ = "compile"
        self._patch(torch, "compile", compile)

    # ---- anomaly detection and profilers -------------------------------------------------------------
    def _patch_debug(self, torch) -> None:
        ext = self
        ag = torch.autograd
        try:
            orig_sda = ag.set_detect_anomaly
            orig_da = ag.detect_anomaly

            class set_detect_anomaly(orig_sda):       # a subclass: isinstance and `with` keep working
                def __init__(self, mode, *args, **kwargs):
                    if mode:
                        ext._located("anomaly_location")
                    super().__init__(mode, *args, **kwargs)

            class detect_anomaly(orig_da):
                def __init__(self, *args, **kwargs):
                    ext._located("anomaly_location")
                    super().__init__(*args, **kwargs)

            for cls, orig in ((set_detect_anomaly, orig_sda), (detect_anomaly, orig_da)):
                cls.__module__ = orig.__module__
                cls.__qualname__ = orig.__qualname__
                cls.__doc__ = orig.__doc__
            self._patch(ag, "set_detect_anomaly", set_detect_anomaly)
            self._patch(ag, "detect_anomaly", detect_anomaly)
        except Exception as e:
            self._probe.report_error("PerfProbe.anomaly", e)
        owners = []
        try:
            import torch.profiler

            owners.append(torch.profiler.profile)
        except Exception:
            pass
        try:
            owners.append(torch.autograd.profiler.profile)
        except Exception:
            pass
        for owner in owners:
            orig_init = owner.__dict__.get("__init__")
            if orig_init is None:
                continue

            def make(orig_init):
                def __init__(prof, *args, **kwargs):
                    if ext._live():
                        ext.debug["profiler_created"] += 1
                        ext._located("profiler_location")
                    return orig_init(prof, *args, **kwargs)

                __init__.__wrapped__ = orig_init
                return __init__

            self._patch(owner, "__init__", make(orig_init))

    def _located(self, key: str) -> None:
        if not self._live() or self.debug.get(key) is not None:
            return
        try:
            self.debug[key] = _loc_of(_caller_outside_library())
            self._mark("debug", now=True)
        except Exception:
            pass

    # ---- nn.Module.zero_grad -----------------------------------------------------------------------
    def _patch_module_zero_grad(self, torch) -> None:
        Module = torch.nn.Module
        orig = Module.zero_grad
        ext = self

        def zero_grad(module, set_to_none: bool = True):
            if not ext._live():
                return orig(module, set_to_none)
            t0 = time.perf_counter()
            out = orig(module, set_to_none)
            try:
                z = ext.module_zero_grad
                z["calls"] += 1
                z["s"] += time.perf_counter() - t0
                if not set_to_none:
                    z["set_to_none_false"] += 1
                    if z["location"] is None:
                        z["location"] = _loc_of(_caller_outside_library())
                ext._dirty.add("module_zero_grad")
            except Exception:
                pass
            return out

        zero_grad.__wrapped__ = orig
        zero_grad.__doc__ = orig.__doc__
        self._patch(Module, "zero_grad", zero_grad)

    # ---- optimizers --------------------------------------------------------------------------------
    def _opt_pre(self, opt, args, kwargs):
        if id(opt) in self._opts_seen or not self._live():
            return None
        self._opts_seen.add(id(opt))
        try:
            self._describe_optimizer(opt)
        except Exception as e:
            self._probe.report_error("PerfProbe.optimizer", e)
        return None

    def _describe_optimizer(self, opt) -> None:
        params = [p for g in opt.param_groups for p in g.get("params", [])]
        defaults = getattr(opt, "defaults", {}) or {}
        try:
            sig = inspect.signature(type(opt).__init__).parameters
        except (TypeError, ValueError):
            sig = {}
        foreach, fused = defaults.get("foreach"), defaults.get("fused")
        eff_fused, eff_foreach = bool(fused), foreach
        if not fused and foreach is None and "foreach" in sig:
            try:
                from torch.optim.optimizer import _default_to_fused_or_foreach

                _, eff_foreach = _default_to_fused_or_foreach(
                    params, bool(defaults.get("differentiable", False)), use_fused=False)
            except Exception:
                eff_foreach = None
        oid = self._probe.optimizer_info(opt)["id"]
        self.optimizers[str(oid)] = {
            "id": oid, "cls": type(opt).__name__,
            "device": params[0].device.type if params else None,
            "params": len(params),
            "param_bytes": int(sum(p.numel() * p.element_size() for p in params)),
            "foreach": foreach, "fused": fused,
            "effective_foreach": bool(eff_foreach) if eff_foreach is not None else None,
            "effective_fused": eff_fused,
            "supports_foreach": "foreach" in sig, "supports_fused": "fused" in sig,
        }
        self._mark("optimizers", now=True)

    # ---- models and forwards -----------------------------------------------------------------------
    def on_model(self, probe, module, info) -> None:
        mid = info["id"]
        devices = info.get("devices") or []
        if any(str(d).startswith("cuda") for d in devices):
            self._cuda_training = True
        if any("Conv" in name for name in (info.get("module_types") or {})):
            self._conv_models.add(mid)
        wrappers = info.get("wrappers") or []
        if "DataParallel" in wrappers:
            dp = module
            for _ in range(4):
                if type(dp).__name__ == "DataParallel":
                    break
                dp = getattr(dp, "module", None) or getattr(dp, "_orig_mod", None)
                if dp is None:
                    break
            if dp is not None and type(dp).__name__ == "DataParallel":
                self.data_parallel[str(mid)] = {
                    "device_ids": [str(d) for d in (getattr(dp, "device_ids", None) or [])],
                    "output_device": str(getattr(dp, "output_device", None)),
                }
                self._mark("data_parallel", now=True)
        compiled = "compiled" in wrappers
        if not compiled:
            inner = module
            for _ in range(4):
                if getattr(inner, "_compiled_call_impl", None) is not None:
                    compiled = True
                    break
                nxt = getattr(inner, "module", None) or getattr(inner, "_orig_mod", None)
                if nxt is None:
                    break
                inner = nxt
        if compiled:
            self.compile["models"].append(mid)
            self._stop_copy_watch()
            self._mark("compile", now=True)

    def on_forward(self, probe, module, args, kwargs, output, training) -> None:
        st = probe.current_step
        if st is not None and st.n_forward == 1:
            # from when the probe finished closing the last step (its own work is not the user's)
            start = max(st.start, probe.step_closed_at)
            gap = probe.forward_start - start - st.data_s - st.eval_s
            st.extra["pre_forward_s"] = round(gap if gap > 0 else 0.0, 7)
        if self._conv_models:
            mid = probe.model_id(module)
            if mid in self._conv_models:
                shapes = self._shape_sets.setdefault(mid, set())
                if len(shapes) < MAX_SHAPES:
                    t = first_tensor(args) if args else None
                    if t is not None:
                        shp = tuple(t.shape)
                        if shp not in shapes:
                            shapes.add(shp)
                            self.input_shapes[str(mid)] = {
                                "distinct": len(shapes), "capped": len(shapes) >= MAX_SHAPES,
                                "shapes": [list(s) for s in list(shapes)[:8]]}
                            self._dirty.add("input_shapes")

    def on_graph_forward(self, probe, module, args, kwargs, output, site) -> None:
        key = site.get("key")
        rec = self.eval_graph.get(key)
        if rec is not None and rec["measured"] >= EVAL_MEASURE:
            return
        out = grad_tensor(output)
        if out is None:
            return
        exclude = set()
        for p in module.parameters():
            try:
                exclude.add(p.untyped_storage().data_ptr())
            except Exception:
                pass
        for t in _flat_tensors(args) + _flat_tensors(kwargs):
            try:
                exclude.add(t.untyped_storage().data_ptr())
            except Exception:
                pass
        nbytes, nodes, complete = graph_saved_bytes(out, exclude)
        if rec is None:
            loc = site.get("location") or {}
            rec = self.eval_graph[key] = {
                "bytes": 0, "nodes": 0, "measured": 0, "complete": True,
                "code": _source(loc.get("file"), loc.get("line")),
            }
        rec["bytes"] = max(rec["bytes"], nbytes)
        rec["nodes"] = max(rec["nodes"], nodes)
        rec["complete"] = rec["complete"] and complete
        rec["measured"] += 1
        self._mark("eval_graph", now=rec["measured"] == 1)

    # ---- steps -------------------------------------------------------------------------------------
    def on_step_end(self, probe, step) -> None:
        torch = self._torch
        d = self.debug
        d["steps"] += 1
        try:
            if torch.is_anomaly_enabled():
                d["anomaly_steps"] += 1
                self._dirty.add("debug")
            if torch._C._autograd._profiler_enabled():
                d["profiler_steps"] += 1
                self._dirty.add("debug")
        except Exception:
            pass
        index = step.get("index", 0)
        if self._sync_open:
            self.sync["per_step"].append(self._sync_since)
            self.sync["steps"] += 1
            self.sync["last_step"] = index
            self._sync_since = 0
            self.copies["steps"] += 1
            if self.sync["steps"] >= SYNC_STEPS:
                self._close_sync(probe)
        elif index >= SYNC_FIRST_STEP and self._cuda_training and not self._sync_done:
            self._open_sync(probe, index + 1)
        if index in FLUSH_AT or index % 100 == 0:
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
                probe.emit("merge", path=self._PATHS[name], value=value)
            else:
                probe.emit("set", path=self._PATHS[name], value=value)

    # ---- host-device synchronisation window (CUDA) -------------------------------------------------
    def _open_sync(self, probe, first_step: int) -> None:
        self._sync_done = True
        torch = self._torch
        try:
            mode = torch.cuda.get_sync_debug_mode()
        except Exception as e:
            self.sync["state"] = f"unavailable: {type(e).__name__}: {e}"[:300]
            self._mark("sync")
            return
        if mode != 0:
            # the script set it itself: leave it alone (it sees its own warnings or errors)
            self.sync["state"] = f"not sampled: the script set sync debug mode {mode} itself"
            self._mark("sync")
            return
        try:
            torch.cuda.set_sync_debug_mode("warn")
        except Exception as e:
            self.sync["state"] = f"unavailable: {type(e).__name__}: {e}"[:300]
            self._mark("sync")
            return
        self.start_sync_capture(first_step)
        if not self.compile["calls"] and not self.compile["models"]:
            self._start_copy_watch(torch)

    def start_sync_capture(self, first_step: int) -> None:
        """Route torch's sync warnings to the counter (public for tests: on a CPU-only build the
        warning can be issued by hand with the text a CUDA build uses)."""
        warnings.filterwarnings("always", message=SYNC_MSG)
        self._sync_filter = warnings.filters[0]
        self._orig_showwarning = warnings.showwarning
        warnings.showwarning = self._hook
        self._sync_open = True
        self.sync.update(state="sampling", mode="warn", first_step=first_step)
        self._mark("sync")

    def _showwarning(self, message, category, filename, lineno, file=None, line=None):
        if str(message).startswith(SYNC_MSG):
            try:
                self._on_sync()
            except Exception:
                pass
            return None
        orig = self._orig_showwarning or warnings._showwarning_orig
        return orig(message, category, filename, lineno, file, line)

    def _on_sync(self) -> None:
        self.sync["total"] += 1
        self._sync_since += 1
        if self._sync_located >= MAX_LOCATE:
            return
        self._sync_located += 1
        _count_at_caller(self._sync_sites)

    def _close_sync(self, probe, emit: bool = True) -> None:
        self._stop_copy_watch()
        if not self._sync_open:
            return
        self._sync_open = False
        try:
            if self._torch is not None and self._torch.cuda.is_initialized():
                self._torch.cuda.set_sync_debug_mode(0)
        except Exception:
            pass
        try:
            if self._sync_filter in warnings.filters:
                warnings.filters.remove(self._sync_filter)
                warnings._filters_mutated()
        except Exception:
            pass
        if warnings.showwarning is self._hook:
            warnings.showwarning = self._orig_showwarning or warnings._showwarning_orig
        s = self.sync
        s["state"] = "sampled"
        s["sites"] = sorted(self._sync_sites.values(), key=lambda x: -x["count"])[:MAX_SITES]
        c = self.copies
        c["sites"] = sorted(self._copy_sites.values(), key=lambda x: -x["count"])[:MAX_SITES]
        self._dirty.update(("sync", "copies"))
        if emit:
            self._flush(probe)

    # ---- host-to-device copies (CUDA, inside the window) --------------------------------------------
    def _start_copy_watch(self, torch) -> None:
        ext = self
        Tensor = torch.Tensor
        orig_to, orig_cuda = Tensor.to, Tensor.cuda
        self._copy_patches = Patches()

        def to(t, *args, **kwargs):
            if ext._copy_watch:
                try:
                    ext._on_copy(t, args, kwargs, None)
                except Exception:
                    pass
            return orig_to(t, *args, **kwargs)

        def cuda(t, *args, **kwargs):
            if ext._copy_watch:
                try:
                    ext._on_copy(t, args, kwargs, "cuda")
                except Exception:
                    pass
            return orig_cuda(t, *args, **kwargs)

        to.__wrapped__, cuda.__wrapped__ = orig_to, orig_cuda
        to.__doc__, cuda.__doc__ = orig_to.__doc__, orig_cuda.__doc__
        self._patch(Tensor, "to", to, self._copy_patches)
        self._patch(Tensor, "cuda", cuda, self._copy_patches)
        self._copy_watch = True
        self.copies["watched"] = True

    def _stop_copy_watch(self) -> None:
        self._copy_watch = False
        patches = getattr(self, "_copy_patches", None)
        if patches:
            patches.undo()

    def _on_copy(self, t, args, kwargs, target) -> None:
        if t.device.type != "cpu":
            return
        if target is None:
            target, nb = h2d_target(args, kwargs)
        else:
            nb = bool(kwargs.get("non_blocking", False)) or any(a is True for a in args[:2])
        if target != "cuda":
            return
        self.record_copy(t, nb)

    def record_copy(self, t, non_blocking: bool) -> None:
        """Count one host-to-device copy of CPU tensor ``t`` (public for tests)."""
        c = self.copies
        c["h2d_copies"] += 1
        c["h2d_bytes"] += t.numel() * t.element_size()
        if not non_blocking:
            c["blocking"] += 1
            return
        if t.is_pinned():
            c["non_blocking_pinned"] += 1
            return
        c["non_blocking_pageable"] += 1
        if len(self._copy_sites) < 100 and self._sync_located < MAX_LOCATE:
            self._sync_located += 1
            _count_at_caller(self._copy_sites)


# ---- helpers ----------------------------------------------------------------------------------------

def _flat_tensors(obj, depth: int = 0) -> list:
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    out: list = []
    if depth > 2:
        return out
    if isinstance(obj, (list, tuple)):
        for o in obj[:16]:
            out.extend(_flat_tensors(o, depth + 1))
    elif isinstance(obj, dict):
        for o in list(obj.values())[:16]:
            out.extend(_flat_tensors(o, depth + 1))
    return out


def graph_saved_bytes(output, exclude_storages: set) -> tuple[int, int, bool]:
    """Bytes of the tensors an autograd graph keeps alive for its backward (each storage once;
    storages in ``exclude_storages`` — parameters, the forward's inputs — not counted), the number
    of graph nodes walked, and whether the walk was complete (it stops at MAX_GRAPH_NODES)."""
    import torch

    seen: set = set()
    storages: set = set()
    total = 0
    stack = [output.grad_fn]
    nodes = 0
    attrs_cache: dict[type, list[str]] = {}
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes += 1
        if nodes > MAX_GRAPH_NODES:
            return total, nodes, False
        names = attrs_cache.get(type(node))
        if names is None:
            names = attrs_cache[type(node)] = [a for a in dir(node) if a.startswith("_saved_")]
        for a in names:
            try:
                v = getattr(node, a)
            except Exception:
                continue
            vals = v if isinstance(v, (list, tuple)) else (v,)
            for x in vals:
                if isinstance(x, torch.Tensor):
                    try:
                        st = x.untyped_storage()
                        ptr = st.data_ptr()
                    except Exception:
                        continue
                    if ptr in exclude_storages or ptr in storages or ptr == 0:
                        continue
                    storages.add(ptr)
                    total += st.nbytes()
        for nxt, _ in node.next_functions:
            if nxt is not None:
                stack.append(nxt)
    return total, nodes, True


__all__ = ["PerfProbe", "graph_saved_bytes", "h2d_target", "SYNC_MSG"]
