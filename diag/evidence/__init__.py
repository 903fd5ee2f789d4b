"""Evidence: everything diag observed about one run, as typed, versioned JSON.

Checks see nothing else. Evidence is built by folding probe events (:mod:`diag.fold`; the kinds are in
:mod:`diag.evidence.events`), saved to ``evidence.json`` in the run directory as it grows, and loaded
anywhere with :func:`load_evidence` (validated field by field) to re-run the checks without executing
anything.

One module per section, each a dataclass (or a typed :class:`~diag.evidence._schema.Section` for the
JSON-shaped sections written by probe extensions) with types, and units in field names or docs;
docs/evidence.md is generated from them (``python -m diag.evidence.docs``)::

    Evidence                          document.py
      schema_version, diag_version, notes
      run: RunInfo                    run.py
      environment: Environment        environment.py (DeviceInfo)
      ranks: [RankEvidence]           rank.py
        steps, step_stats             steps.py (StepRecord, StepStats)
        dataloaders                   dataloaders.py (DataLoaderInfo)
        models, forwards, optimizers  models.py (ModelInfo, ForwardSite, OptimizerInfo)
        exceptions                    run.py (ExceptionInfo)
        evaluations, framework,       evaluation.py (EvaluationPass, FrameworkInfo, ChildProcess)
        children
        memory                        memory.py (MemorySection, MemoryDevice)
        flops                         flops.py (FlopsSection, FlopsMeasured)
        amp, sync, distributed        amp.py, sync.py, distributed.py
        timeline                      timeline.py (TimelineSection; CUDA runs)
        extras                        extras.py (ExtrasSection)
        probe                         probe.py (ProbeSection)
      gpu: GpuTelemetry               gpu.py
      memory_plan: MemoryPlan         plan.py

This package must not import torch.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Loaded on first use (PEP 562): the probe imports only diag.evidence.events (the event kinds) into the
# user's process, without the 40 ms the whole package takes to import (issue 28).
_EXPORTS = {
    "SchemaError": "_schema", "Section": "_schema", "build": "_schema", "median": "_schema",
    "AmpSection": "amp", "DataLoaderInfo": "dataloaders", "DistributedSection": "distributed",
    "MAX_DEPTH": "document", "MAX_EVIDENCE_BYTES": "document", "READABLE_VERSIONS": "document",
    "SCHEMA_VERSION": "document", "Evidence": "document", "_json_default": "document",
    "load_evidence": "document", "DeviceInfo": "environment", "Environment": "environment",
    "ChildProcess": "evaluation", "EvalStepRecord": "evaluation", "EvalStepStats": "evaluation",
    "EvaluationPass": "evaluation", "FrameworkInfo": "evaluation", "ExtrasSection": "extras",
    "FlopsMeasured": "flops", "FlopsSection": "flops", "GpuTelemetry": "gpu", "MemoryDevice": "memory",
    "MemorySection": "memory", "ForwardSite": "models", "ModelInfo": "models", "OptimizerInfo": "models",
    "MemoryPlan": "plan", "ProbeSection": "probe", "MAX_EXCEPTIONS_KEPT": "rank", "MAX_LIST_SECTION": "rank",
    "MAX_STEPS_KEPT": "rank", "RankEvidence": "rank", "ExceptionInfo": "run", "RunInfo": "run",
    "StepRecord": "steps", "StepStats": "steps", "SyncSection": "sync", "TimelineSection": "timeline",
}
_SUBMODULES = ("_schema", "amp", "dataloaders", "distributed", "docs", "document", "environment", "evaluation",
               "events", "extras", "flops", "gpu", "memory", "models", "phases", "plan", "probe", "rank", "run",
               "steps", "sync", "timeline")

if TYPE_CHECKING:   # what the names are, for type checkers (nothing is imported at run time here)
    from diag.evidence._schema import SchemaError, Section, build, median
    from diag.evidence.amp import AmpSection
    from diag.evidence.dataloaders import DataLoaderInfo
    from diag.evidence.distributed import DistributedSection
    from diag.evidence.document import (
        MAX_DEPTH,
        MAX_EVIDENCE_BYTES,
        READABLE_VERSIONS,
        SCHEMA_VERSION,
        Evidence,
        _json_default,
        load_evidence,
    )
    from diag.evidence.environment import DeviceInfo, Environment
    from diag.evidence.evaluation import ChildProcess, EvalStepRecord, EvalStepStats, EvaluationPass, FrameworkInfo
    from diag.evidence.extras import ExtrasSection
    from diag.evidence.flops import FlopsMeasured, FlopsSection
    from diag.evidence.gpu import GpuTelemetry
    from diag.evidence.memory import MemoryDevice, MemorySection
    from diag.evidence.models import ForwardSite, ModelInfo, OptimizerInfo
    from diag.evidence.plan import MemoryPlan
    from diag.evidence.probe import ProbeSection
    from diag.evidence.rank import MAX_EXCEPTIONS_KEPT, MAX_LIST_SECTION, MAX_STEPS_KEPT, RankEvidence
    from diag.evidence.run import ExceptionInfo, RunInfo
    from diag.evidence.steps import StepRecord, StepStats
    from diag.evidence.sync import SyncSection
    from diag.evidence.timeline import TimelineSection


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is not None:
        value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    elif name == "_median":
        value = __getattr__("median")
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Build a dataclass from an event's or a file's fields (types checked; unknown keys ignored)."""
    from diag.evidence._schema import build

    return build(cls, data, cls.__name__)


__all__ = [
    "SCHEMA_VERSION", "READABLE_VERSIONS", "MAX_DEPTH", "MAX_EVIDENCE_BYTES", "MAX_STEPS_KEPT",
    "MAX_EXCEPTIONS_KEPT", "MAX_LIST_SECTION", "Evidence", "RunInfo", "Environment", "DeviceInfo",
    "RankEvidence", "StepRecord", "StepStats", "DataLoaderInfo", "ModelInfo", "ForwardSite", "OptimizerInfo",
    "ExceptionInfo", "MemorySection", "MemoryDevice", "FlopsSection", "FlopsMeasured", "AmpSection",
    "SyncSection", "DistributedSection", "ExtrasSection", "ProbeSection", "TimelineSection", "GpuTelemetry", "MemoryPlan", "Section",
    "SchemaError", "EvaluationPass", "EvalStepRecord", "EvalStepStats", "FrameworkInfo", "ChildProcess", "load_evidence", "median", "build",
    "_json_default", "_from_dict", "_median",
]
