"""Probe extensions installed by default, by dotted path "module:Class".

Each extension is a class instantiated with no arguments; see :mod:`diag.probe.context` for the
interface (``Extension`` hooks, called with a ``ProbeContext``). Extensions must be cheap on the hot path and must never raise into the user's code.
Disable one with ``DIAG_PROBE_DISABLE=name1,name2`` (the class name, lower case).

``diag try``'s extension (:mod:`diag.probe.knobapply`: knobs applied from outside the script, steps
tagged by trial arm, losses recorded) is added only when ``DIAG_TRY_KNOBS`` is set (even empty).
"""
from __future__ import annotations

import importlib
import os

DEFAULT_EXTENSIONS: list[str] = [
    "diag.probe.perf:PerfProbe",
    "diag.probe.distributed:DistributedProbe",
    "diag.probe.flops:FlopCounter",
    "diag.probe.memory:MemoryProbe",
    "diag.probe.timeline:TimelineProbe",     # CUDA only: removes itself on a CPU machine
]

TRY_ENV = "DIAG_TRY_KNOBS"
TRY_EXTENSION = "diag.probe.knobapply:KnobApply"


def load_extensions(names: list[str] | None = None) -> list:
    disabled = {n.strip().lower() for n in os.environ.get("DIAG_PROBE_DISABLE", "").split(",") if n.strip()}
    out = []
    specs = list(DEFAULT_EXTENSIONS if names is None else names)
    if names is None and TRY_ENV in os.environ:
        specs.append(TRY_EXTENSION)
    for spec in specs:
        mod_name, _, cls_name = spec.partition(":")
        if cls_name.lower() in disabled:
            continue
        try:
            cls = getattr(importlib.import_module(mod_name), cls_name)
            out.append(cls())
        except Exception as e:  # an extension that cannot load is reported, the run goes on
            out.append(_Broken(spec, e))
    return out


class _Broken:
    def __init__(self, spec: str, error: Exception):
        self.spec = spec
        self.error = error

    def install(self, probe):
        probe.report_error(f"load {self.spec}", self.error)
        probe.disable(self)
