"""``diag.checks.api``: the public interface for writing a check (built-in or plugin).

Everything a check author needs is here; nothing else in diag is public to checks.

A check is a function of a :class:`Context`, declared once with :func:`check`::

    from diag.checks.api import check, cuda_training, fmt_pct

    @check(id="myorg.tiny-batch", title="Tiny batches", severity="warning", requires=[cuda_training()])
    def tiny_batch(ctx):
        \"\"\"Batches under 8 samples leave a GPU idle.\"\"\"
        batch = ctx.rank.steps[-1].batch if ctx.rank.steps else None
        if batch is None:
            return ctx.skip("No step recorded its batch size.")
        if batch < 8:
            return ctx.finding(f"The batch is {batch} samples.", fix="Raise the batch size.")
        return ctx.passed(f"The batch is {batch} samples.")

The registry fills the id, title and docs link into every finding, runs the check only when its
``requires`` hold (otherwise it reports ``skipped`` with the precondition's reason), turns any
exception (and a check that runs past its time limit) into a ``crashed`` finding, and never lets a
check take diag down. A check may ``return`` one finding, ``return``/``yield`` several, or return
nothing (no finding).

Register it in your package's pyproject.toml; the entry-point name is what ``diag checks`` lists
without importing your package::

    [project.entry-points."diag.checks"]
    "myorg.tiny-batch" = "myorg_diag.checks:tiny_batch"     # or a module: every check in it

Test it with :mod:`diag.testing` (an Evidence builder). ``API_VERSION`` follows semantic versioning:
a new minor adds names, a new major may change them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from diag.evidence import DeviceInfo, Evidence, ModelInfo, RankEvidence, median
from diag.findings import Finding, Location, Severity
from diag.timeline import DataWait, TimelineSummary
from diag.timeline import data_wait as _data_wait
from diag.timeline import device_busy as _device_busy
from diag.timeline import device_phases as _device_phases
from diag.timeline import summarize as _summarize
from diag.units import fmt_bytes, fmt_count, fmt_flops, fmt_hours, fmt_pct, fmt_sci, fmt_seconds

API_VERSION = "1.1"

__all__ = [
    "API_VERSION", "check", "Check", "Context", "Precondition", "Finding", "Severity", "Location",
    "Evidence", "RankEvidence", "ModelInfo", "DeviceInfo", "median",
    "cuda_training", "training", "steps_observed", "gpu_telemetry", "ddp", "multi_rank", "perf_recorded",
    "finished",
    "fmt_bytes", "fmt_seconds", "fmt_pct", "fmt_flops", "fmt_sci", "fmt_hours", "fmt_count",
    "training_sites", "training_models", "device_types", "cuda_device", "location", "peak_flops",
    "flops_summary", "EVIDENCE_SOURCES", "NOT_OBSERVABLE", "evidence_source",
]


# ---- preconditions -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Precondition:
    """Something a check needs from a run. ``test(ctx)`` returns None when it holds, or
    ``(reason, evidence)``: the sentence the ``skipped`` finding says, and the numbers behind it.
    A precondition may leave values on the context for the check (``cuda_training`` sets
    ``ctx.models``)."""
    name: str
    test: Callable[["Context"], "tuple[str, dict] | None"]

    def __call__(self, ctx: "Context") -> "tuple[str, dict] | None":
        return self.test(ctx)


def training_sites(r: RankEvidence) -> list:
    """Forward call sites whose output fed a training step's backward."""
    return [s for s in r.forwards if s.in_step]


def training_models(r: RankEvidence) -> list[ModelInfo]:
    """The models trained in this rank (those called by a training forward)."""
    ids = {s.model for s in training_sites(r)}
    return [m for m in r.models if m.id in ids]


def device_types(models) -> set[str]:
    """{"cuda", "cpu", ...}: the device types the models' parameters live on."""
    return {str(d).split(":")[0] for m in models for d in (m.devices or [])}


def cuda_device(ev: Evidence, models) -> DeviceInfo | None:
    """The CUDA device the models use (from Environment.devices), or None."""
    idx = None
    for m in models:
        for d in m.devices or []:
            d = str(d)
            if d.startswith("cuda"):
                _, _, i = d.partition(":")
                idx = int(i) if i.isdigit() else 0
                break
        if idx is not None:
            break
    if idx is None:
        return None
    for d in ev.environment.devices:
        if d.index == idx and d.type == "cuda":
            return d
    cuda = [d for d in ev.environment.devices if d.type == "cuda"]
    return cuda[0] if cuda else None


def location(d: dict | None) -> Location | None:
    """A Location from an Evidence location record ({file, line, function})."""
    return Location.from_dict(d) if isinstance(d, dict) else None


def peak_flops(device_name: str | None, precision: str = "fp32") -> "tuple[str | None, float | None, str | None]":
    """Look a GPU up by name in diag's catalogue: ``(catalogue id, dense peak FLOP/s per device for
    the precision, note)``; the peak is None (and the note says why) when the catalogue has no figure.
    Judged in diag's process, so a corrected catalogue re-judges saved evidence."""
    from diag.cost.measured import peak_for

    return peak_for(device_name, precision)


def flops_summary(r: RankEvidence) -> "tuple[dict, dict] | None":
    """The recorded FLOP measurement of a rank judged against the catalogue: ``(measured, summary)``
    where ``measured`` is ``r.flops['measured']`` with ``gpu``, ``peak_flops`` and ``peak_note`` looked
    up now from the recorded device name (evidence from older probes that stored a peak keeps it
    when the catalogue has none), and ``summary`` holds step_s, steps_timed, model_flops_per_s,
    mfu, hfu, samples_per_s, tokens_per_s, overhead_ratio. None when no FLOPs were measured.
    The same computation as ``diag cost`` and ``diag compare`` (diag.cost.measured.judge_rank)."""
    from diag.cost.measured import judge_rank

    return judge_rank(r)


def cuda_training(why: str = "the check is about CUDA training.") -> Precondition:
    """The primary rank trains a model on CUDA. Sets ``ctx.models`` to the trained models.
    ``why`` completes "The model trains on cpu: ..." in the skipped finding."""

    def test(ctx: Context):
        r = ctx.rank
        if not training_sites(r):
            return "No training forward was observed.", {}
        models = training_models(r)
        if "cuda" not in device_types(models):
            devs = sorted(device_types(models)) or ["cpu"]
            return f"The model trains on {', '.join(devs)}: {why}", {"devices": devs}
        ctx.models = models
        return None

    return Precondition("cuda_training", test)


def _training(ctx: Context):
    if not training_sites(ctx.rank):
        return "No training forward was observed.", {}
    ctx.models = training_models(ctx.rank)
    return None


training = Precondition("training", _training)


def _steps(ctx: Context):
    if not any(r.step_stats.count > 0 for r in ctx.evidence.ranks):
        return "No training step was observed.", {}
    return None


steps_observed = Precondition("steps_observed", _steps)


def _gpu(ctx: Context):
    gpu = ctx.evidence.gpu
    if not isinstance(gpu, dict) or not gpu.get("devices"):
        return "No GPU telemetry was recorded (no NVIDIA GPU, or NVML unavailable).", {}
    return None


gpu_telemetry = Precondition("gpu_telemetry", _gpu)


def _ddp(ctx: Context):
    if not any(r.distributed.get("ddp") for r in ctx.evidence.ranks if r.distributed):
        return "No DistributedDataParallel model was observed.", {}
    return None


ddp = Precondition("ddp", _ddp)


def _multi(ctx: Context):
    ev = ctx.evidence
    if len(ev.ranks) > 1 or any(r.world_size > 1 for r in ev.ranks):
        return None
    return "This is a single-process run.", {}


multi_rank = Precondition("multi_rank", _multi)


def _perf(ctx: Context):
    r = ctx.rank
    if isinstance(r.extras, dict) and "perf" in r.extras:
        return None
    return ("The perf probe extension (diag.probe.perf) did not record this run "
            "(disabled with DIAG_PROBE_DISABLE, or evidence from an older diag).", {})


perf_recorded = Precondition("perf_recorded", _perf)


def _finished(ctx: Context):
    if ctx.evidence.run.status == "running":
        return "The run is still going.", {}
    return None


finished = Precondition("finished", _finished)


# ---- what a check can observe ---------------------------------------------------------------------
# Evidence comes from one of two sources (``run.source``). A check declares the ones it can judge
# (``@check(..., sources=[...])``); on evidence from another source the registry reports it
# ``skipped`` with the reason below, or leaves it out when another check answers under its id
# (``replaces=``). Without ``sources``, a check judges probe evidence, and attach evidence too when
# every one of its ``needs`` is GPU telemetry (``gpu.*``: sampled the same way by both).

EVIDENCE_SOURCES = {
    "probe": "observed by the probe inside the script (diag check): steps and their phases, forwards, "
             "optimizers, the allocator, GPU telemetry",
    "attach": "sampled from outside a running job (diag attach): stack samples of the main thread and the "
              "DataLoader workers, GPU telemetry; no step timing",
}
NOT_OBSERVABLE = "not observable by sampling"


def evidence_source(ev: Evidence) -> str:
    """Where the Evidence came from: ``"probe"`` or ``"attach"`` (``run.source``)."""
    return getattr(ev.run, "source", None) or "probe"


def _telemetry_only(needs: Iterable[str]) -> bool:
    needs = list(needs)
    return bool(needs) and all(n == "gpu" or n.startswith("gpu.") for n in needs)


def source_unmet(spec: "Check", ev: Evidence) -> "tuple[str, dict] | None":
    """The registry's first precondition: None when ``spec`` judges evidence from ``ev``'s source,
    else ``(reason, evidence)`` for the ``skipped`` finding."""
    src = evidence_source(ev)
    if src in spec.judges:
        return None
    if src == "attach":
        reads = ", ".join(spec.needs) or "what the probe records"
        return (f"Not observable by sampling (it reads {reads}: diag check records it).",
                {"reason": NOT_OBSERVABLE})
    if tuple(spec.judges) == ("attach",):
        return "Only evidence sampled from a running job (diag attach) has stack samples.", {}
    return (f"It judges evidence from {' or '.join(spec.judges)}, and this evidence comes from {src}.",
            {"evidence_source": src})


# ---- the context ---------------------------------------------------------------------------------

class Context:
    """What a check receives: the Evidence and the ways to say something about it."""

    def __init__(self, spec: "Check", evidence: Evidence):
        self.spec = spec
        self.evidence = evidence
        self.models: list[ModelInfo] = []   # set by cuda_training / training

    @property
    def ev(self) -> Evidence:
        return self.evidence

    @property
    def rank(self) -> RankEvidence:
        """The primary rank (rank 0)."""
        return self.evidence.primary

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def title(self) -> str:
        return self.spec.title

    def finding(self, message: str, severity: "Severity | str | None" = None, *, title: str | None = None,
                evidence: dict[str, Any] | None = None, why: str | None = None, fix: str | None = None,
                snippet: str | None = None, location: "Location | dict | None" = None,
                tags: Iterable[str] = (), id: str | None = None, docs: str | None = None) -> Finding:
        """A finding of this check; ``severity`` defaults to the check's declared severity, ``id`` to the
        check's id (or the id it ``replaces``)."""
        sev = Severity(severity) if isinstance(severity, str) else (severity or Severity(self.spec.severity))
        if isinstance(location, dict):
            location = Location.from_dict(location)
        return Finding(id=id or self.spec.replaces or self.spec.id, severity=sev, title=title or self.spec.title,
                       message=message,
                       evidence=dict(evidence or {}), why=why, fix=fix, snippet=snippet, location=location,
                       docs=docs or self.spec.docs, check=self.spec.id, tags=list(tags))

    def skip(self, reason: str, *, title: str | None = None, **evidence: Any) -> Finding:
        """The check cannot judge this run: ``reason`` says why (one sentence)."""
        return self.finding(reason, Severity.SKIPPED, title=title, evidence=evidence)

    def passed(self, message: str, *, title: str | None = None, **evidence: Any) -> Finding:
        """The check judged the run and found nothing to fix."""
        return self.finding(message, Severity.PASS, title=title, evidence=evidence)


# ---- the decorator -------------------------------------------------------------------------------

def check(id: str, title: str, severity: str = "warning", *, requires: Iterable[Precondition] = (),
          needs: Iterable[str] = (), tags: Iterable[str] = (), docs: str | None = None,
          description: str | None = None, sources: Iterable[str] | None = None,
          replaces: str | None = None) -> Callable[[Callable], "Check"]:
    """Declare a check: ``id`` (dotted, unique), ``title`` (short), the ``severity`` it reports when
    it fires, the preconditions it ``requires``, and a ``docs`` link. The description shown by
    ``diag checks`` is the function's docstring. The decorated object can still be called with an
    Evidence (``my_check(ev)`` returns its findings, as the registry would).

    ``sources``: the kinds of Evidence it can judge (keys of :data:`EVIDENCE_SOURCES`; see there for
    the default). ``replaces``: the id of a check this one stands in for on its ``sources`` (a
    variant of ``dataloader.workers`` for sampled evidence): its findings carry that id, and the
    registry leaves the other check out on those sources (and this one out on the others)."""
    Severity(severity)  # an unknown severity is an error at import time, not at run time
    if sources is not None:
        sources = list(sources)
        unknown = [x for x in sources if x not in EVIDENCE_SOURCES]
        if unknown or not sources:
            raise ValueError(f"check {id!r}: sources must be among {sorted(EVIDENCE_SOURCES)}, got {sources}")

    def deco(func: Callable) -> Check:
        return Check(id=id, title=title, func=func, severity=severity, needs=list(needs), tags=list(tags),
                     description=(description or (func.__doc__ or "")).strip(), docs=docs,
                     requires=list(requires), takes_context=True, module=func.__module__,
                     sources=sources, replaces=replaces)

    return deco


@dataclass
class Check:
    """A declared check (what the registry holds). Built by :func:`check`."""
    id: str
    title: str
    func: Callable
    severity: str = "warning"          # the default severity when it fires
    needs: list[str] = field(default_factory=list)   # what it reads from Evidence (documentation)
    tags: list[str] = field(default_factory=list)
    description: str = ""              # what it looks for, with thresholds (shown by `diag checks`)
    docs: str | None = None            # source of the rule
    source: str = "builtin"            # the entry point / distribution it came from
    requires: list[Precondition] = field(default_factory=list)
    takes_context: bool = False        # False: a legacy check, a function of the Evidence
    module: str | None = None
    sources: list[str] | None = None   # the evidence sources it judges (None: see `judges`)
    replaces: str | None = None        # the check id it stands in for on its sources

    @property
    def judges(self) -> tuple[str, ...]:
        """The evidence sources this check judges: the declared ``sources``; by default probe evidence,
        and attach evidence too when every ``needs`` is GPU telemetry."""
        if self.sources:
            return tuple(self.sources)
        return ("probe", "attach") if _telemetry_only(self.needs) else ("probe",)

    @property
    def __diag_check__(self) -> "Check":
        return self

    def to_dict(self) -> dict:
        return {
            "id": self.id, "title": self.title, "severity": self.severity, "needs": self.needs,
            "tags": self.tags, "description": self.description, "docs": self.docs,
            "source": self.source, "requires": [p.name for p in self.requires],
            "judges": list(self.judges), "replaces": self.replaces,
        }

    def __call__(self, evidence: Evidence) -> list[Finding]:
        from diag.registry import run_one
        return run_one(self, evidence, timeout=None)


# ---- domain helpers ------------------------------------------------------------------------------
# Pure functions over Evidence that the built-in checks share with diag's reports (the memory planner,
# the cost engine, the GPU views). Offered here so that a check never reaches into diag's internals;
# stable within an API major version, but more specialised than the names above.

from diag.cost.formulas import DEFAULT_MFU_LLM, DEFAULT_MFU_OTHER, TYPICAL_MFU  # noqa: E402
from diag.gpu.series import (  # noqa: E402
    NVML_PERIOD_S,
    dev_name,
    gpu_section,
    has_devices,
    label,
    mean,
    no_gpu_reason,
    percentile,
    run_devices,
    steady_values,
    steady_windows,
    training_window,
    window_values,
)
from diag.memory.breakdown import expandable_segments_enabled, fragmentation  # noqa: E402
from diag.memory.oom import parse_oom  # noqa: E402
from diag.memory.plan import accumulation_plan, accumulation_snippet  # noqa: E402

__all__ += [
    "DEFAULT_MFU_LLM", "DEFAULT_MFU_OTHER", "TYPICAL_MFU", "dev_name", "gpu_section", "has_devices", "label",
    "mean", "no_gpu_reason", "percentile", "run_devices", "training_window", "window_values",
    "NVML_PERIOD_S", "steady_windows", "steady_values",
    "expandable_segments_enabled", "fragmentation", "parse_oom", "accumulation_plan", "accumulation_snippet",
]


# ---- the device clock (CUDA runs with a device timeline; docs/timeline.md) --------------------------

def data_wait(r: RankEvidence) -> DataWait:
    """The share of step time lost waiting for data and the clock it was judged on: ``"device"``
    (GPU idle caused by data wait, from ``r.timeline``) when the run has a device timeline, else
    ``"host"`` (the DataLoader wait on the host clock). ``.hidden(threshold)`` says the host waited
    while the GPU did not idle for it; ``.evidence()`` and ``.sentence()`` give the numbers."""
    return _data_wait(r)


def gpu_timeline(r: RankEvidence) -> TimelineSummary | None:
    """GPU busy/idle of a rank on the device clock, idle attributed by cause (None: no device
    timeline, i.e. a CPU run or the timeline switched off)."""
    return _summarize(r)


def device_busy(r: RankEvidence) -> "tuple[float, float, int] | None":
    """(median GPU busy seconds per step, median device span per step, steps), or None without a
    device timeline."""
    return _device_busy(r)


def device_phases(r: RankEvidence, skip_warmup: "int | None" = None) -> "dict | None":
    """A rank's median phases on the device clock (``data_s`` is GPU idle waiting for data), in the
    shape of the host phases (``total_s``, ``data_s``, ``forward_s``, ``backward_s``, ``optimizer_s``,
    ``other_s``, ``n``), over the same steady steps as the host phases (``skip_warmup``: that many
    first steps instead of the warm-up rule, docs/steps.md); None without a device timeline."""
    return _device_phases(r, skip_warmup)


__all__ += ["DataWait", "TimelineSummary", "data_wait", "gpu_timeline", "device_busy", "device_phases"]


# ---- the knob catalogue (diag/knobs.py): fixes that are settings, in each framework's words ----------

from diag.knobs import FRAMEWORK_NAMES, KNOBS  # noqa: E402
from diag.knobs import words as _knob_words  # noqa: E402


def knob_words(knob_id: str, framework: "str | None" = None, **values: Any) -> "tuple[str, str | None, bool]":
    """``(fix, snippet, lever)``: how a user of ``framework`` (``"transformers"``, ``"lightning"``,
    ``"accelerate"``; None for plain PyTorch) turns the knob ``knob_id`` (``amp.bf16``,
    ``dataloader.workers``, ...), templates filled from ``values`` (``n=4``). ``lever`` is False when
    the framework has no setting for it."""
    return _knob_words(knob_id, framework, **values)


def run_framework(ev: Evidence) -> "str | None":
    """The framework that drove the training loop (``transformers``, ``lightning``, ``accelerate``),
    as any rank recorded it; None for a plain PyTorch loop."""
    for r in ev.ranks:
        fw = getattr(r, "framework", None)
        if fw is not None and fw.name:
            return fw.name
    return None


__all__ += ["KNOBS", "FRAMEWORK_NAMES", "knob_words", "run_framework"]
