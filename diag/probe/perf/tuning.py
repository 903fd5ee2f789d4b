"""What checks/tuning.py needs: torch.compile calls and compiled models (``extras.compile``), autograd
anomaly detection and profilers left on (``extras.debug``), nn.Module.zero_grad calls
(``extras.module_zero_grad``), optimizer implementations (``extras.optimizers``), and the distinct
input shapes of convolutional models (``extras.input_shapes``, for cudnn.benchmark)."""
from __future__ import annotations

import inspect
import time

from diag.probe.hooks import _never
from diag.probe.perf._common import _caller_outside_library, _loc_of
from diag.probe.quiet import relocated_warnings
from diag.probe.tensors import first_tensor

MAX_SHAPES = 16


class TuningRecorder:
    def _init_tuning(self) -> None:
        self._conv_models: set[int] = set()
        self.input_shapes: dict[str, dict] = {}
        self._shape_sets: dict[int, set] = {}
        self.optimizers: dict[str, dict] = {}
        self.module_zero_grad = {"calls": 0, "set_to_none_false": 0, "s": 0.0, "location": None}
        self.debug = {"steps": 0, "anomaly_steps": 0, "profiler_steps": 0, "anomaly_location": None,
                      "profiler_location": None, "profiler_created": 0}
        self.compile = {"calls": 0, "location": None, "models": []}

    def _install_tuning(self, probe, torch) -> None:
        self._patch_compile(torch)
        self._patch_debug(torch)
        self._patch_module_zero_grad(torch)

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
            with relocated_warnings():
                return orig(*args, **kwargs)

        compile.__wrapped__ = orig
        compile.__doc__ = orig.__doc__
        compile.__name__ = "compile"
        self._patch(torch, "compile", compile)

    # ---- anomaly detection and profilers -------------------------------------------------------------
    def _patch_debug(self, torch) -> None:
        ext = self
        ag = torch.autograd
        # torch.compile's AOTAutograd runs its tracing under detect_anomaly(check_nan=False) (to keep each
        # node's stack): not the script turning anomaly detection on. Taken as such, it set the debug watch
        # for the rest of the run, and the probe's lane never took a step of a model compiled with a cold
        # cache (40 µs a step against 7, a probe.overhead warning)
        in_compile = getattr(getattr(torch, "compiler", None), "is_compiling", None) or _never
        try:
            orig_sda = ag.set_detect_anomaly
            orig_da = ag.detect_anomaly

            class set_detect_anomaly(orig_sda):       # a subclass: isinstance and `with` keep working
                def __init__(self, mode, *args, **kwargs):
                    if mode and not in_compile():
                        ext._located("anomaly_location")
                    with relocated_warnings():
                        super().__init__(mode, *args, **kwargs)

            class detect_anomaly(orig_da):
                def __init__(self, *args, **kwargs):
                    if not in_compile():
                        ext._located("anomaly_location")
                    with relocated_warnings():
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
                    if ext._live() and not in_compile():
                        ext.debug["profiler_created"] += 1
                        ext._located("profiler_location")
                    return orig_init(prof, *args, **kwargs)

                __init__.__wrapped__ = orig_init
                return __init__

            self._patch(owner, "__init__", make(orig_init))

    def _located(self, key: str) -> None:
        self._debug_watch = True    # on_step_end reads the state every step from now on
        lane_off = getattr(getattr(self, "_probe", None), "lane_off", None)
        if lane_off is not None:    # ... the probe's lane included (diag.probe.lane: this is no longer LANE)
            lane_off()
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
    def on_optimizer(self, probe, opt) -> None:
        try:
            self._describe_optimizer(opt)
        except Exception as e:   # reported; the rest of PerfProbe goes on
            probe.report_error("PerfProbe.optimizer", e)

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

    # ---- models ------------------------------------------------------------------------------------
    def _model_tuning(self, module, info) -> None:
        mid = info["id"]
        if any("Conv" in name for name in (info.get("module_types") or {})):
            self._conv_models.add(mid)
        compiled = "compiled" in (info.get("wrappers") or [])
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

    def _input_shape(self, probe, module, args) -> None:
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
