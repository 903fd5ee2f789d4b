"""What checks/amp.py needs: GradScaler use (``amp.scaler``) and the CPU's capability (``extras.perf``,
for amp.availability)."""
from __future__ import annotations

from diag.evidence import events as E
from diag.probe.perf._common import _caller_outside_library, _loc_of
from diag.probe.quiet import relocated_warnings


class AmpRecorder:
    def _init_amp(self) -> None:
        self.scaler = {"created": 0, "enabled": None, "scale_calls": 0, "step_calls": 0,
                       "device": None, "init_scale": None, "location": None}

    def _install_amp(self, probe, torch) -> None:
        perf = {}
        try:
            perf["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        except Exception:
            perf["cpu_capability"] = None
        probe.emit(E.SET, path="extras.perf", value=perf)
        self._patch_scaler(torch)

    # ---- GradScaler --------------------------------------------------------------------------------
    def _patch_scaler(self, torch) -> None:
        try:
            from torch.amp.grad_scaler import GradScaler
        except Exception:
            return
        ext = self
        orig_init, orig_scale, orig_step = GradScaler.__init__, GradScaler.scale, GradScaler.step

        def __init__(sc, *args, **kwargs):
            with relocated_warnings():      # torch's warnings name the user's line, not this file
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
