"""The one place that knows how Evidence and reports are laid out, for `diag compare`.

Everything else in :mod:`diag.compare` works on :class:`RunSample`: per-step samples per metric
(steady state only), a few per-run scalars, the comparability facts and the findings. When the step
model or the Evidence types change, only this module changes.

Inputs it reads:

* a run directory (``.diag/runs/<id>/``: its ``evidence.json``);
* an ``evidence.json``;
* a ``diag check --format json`` report: it embeds a ``compare`` block (:func:`export`) with every
  kept step's phases, so a report saved as a CI artifact is a complete baseline on its own; an
  older report without that block is read through the evidence file it names, when that exists.

Steady state (the same rule on both sides): instrumented steps (FLOP counting, the memory replay's
neighbour) are dropped, then the warm-up: the first 10% of the remaining steps, at least 1 and at
most 20, as long as at least 3 steps remain.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from diag.errors import DiagError

EXPORT_VERSION = 1
PHASES = ("data", "forward", "backward", "optimizer", "other")
STEP_FIELDS = ("total_s",) + tuple(f"{p}_s" for p in PHASES)
MIN_STEADY = 3
# per-step device-clock fields (CUDA runs with a device timeline): the device span of a step, GPU
# busy and idle in it, the idle by cause (diag.timeline.CAUSES) and the device time spent evaluating
DEVICE_FIELDS = ("total_s", "busy_s", "idle_s", "idle_data_s", "idle_h2d_s", "idle_sync_s", "idle_host_s",
                 "eval_s")


@dataclass
class RunSample:
    """One run, reduced to what a comparison needs."""
    source: str                                   # the file or directory it came from
    facts: dict[str, Any]                         # script, batch, world size, device, versions, env
    steps: dict[str, np.ndarray]                  # metric -> steady-state per-step values, step order
    scalars: dict[str, float | None]              # one value per run (memory peaks, MFU, first step)
    findings: list[dict[str, Any]]                # id, severity, title, message, location
    steps_total: int = 0                          # steps the run recorded
    excluded: dict[str, int] = field(default_factory=dict)   # {"warmup": n, "instrumented": n}
    status: str = ""

    @property
    def kind(self) -> str:
        """"training" or "evaluation" (an evaluation-only run: its steps are evaluation steps)."""
        return "evaluation" if self.facts.get("kind") == "evaluation" else "training"

    @property
    def steady(self) -> int:
        return int(self.steps["total_s"].size) if "total_s" in self.steps else 0


# ---- Evidence -> export block (also embedded in the JSON report) ---------------------------------

def export(evidence) -> dict[str, Any]:
    """What `diag compare` needs from one run, as plain JSON (the report's ``compare`` block). An
    evaluation-only run (an evaluation or batch-inference script: ``RankEvidence.run_kind()``) exports
    its evaluation steps instead, as steps whose ``data`` is the batch's wait and host-to-device copy,
    ``forward`` its forwards, ``other`` the rest, and no backward or optimizer; ``facts.kind`` says
    which, and runs of two kinds are not compared."""
    rank = evidence.primary if evidence.ranks else None
    kind = run_kind(rank)
    cols: dict[str, list] = {}
    if kind == "evaluation":
        esteps = list(rank.eval_steps)
        cols["index"] = [s.index for s in esteps]
        parts = {"total_s": lambda s: s.total_s, "data_s": lambda s: s.data_s + s.h2d_s,
                 "forward_s": lambda s: s.forward_s, "backward_s": lambda s: 0.0,
                 "optimizer_s": lambda s: 0.0, "other_s": lambda s: s.other_s}
        for name in STEP_FIELDS:
            cols[name] = [round(float(parts[name](s)), 9) for s in esteps]
        steps: list = esteps
        total = rank.eval_stats.count
    else:
        steps = list(rank.steps) if rank else []
        cols["index"] = [s.index for s in steps]
        for name in STEP_FIELDS:
            cols[name] = [round(float(getattr(s, name)), 9) for s in steps]
        total = rank.step_stats.count if rank else 0
    cols["samples"] = [s.samples for s in steps]
    cols["tokens"] = [s.tokens for s in steps]
    cols["instrumented"] = [bool(s.instrumented) for s in steps]
    facts = _facts(evidence, rank)
    facts["kind"] = kind
    if kind == "evaluation":
        samples = [s.samples for s in steps if s.samples and not s.instrumented]
        facts["batch"] = int(statistics.median(samples)) if samples else None
    out = {"version": EXPORT_VERSION, "rank": rank.rank if rank else 0,
           "facts": facts, "steps": cols, "scalars": _scalars(evidence, rank, kind),
           "steps_total": total}
    device = _device_steps(rank) if rank and kind == "training" else None
    if device:
        out["device"] = device          # only with a device timeline: reports without one are unchanged
    return out


def run_kind(rank) -> str:
    """"evaluation" for an evaluation-only run, else "training" (what compare compares step for step)."""
    try:
        return "evaluation" if rank is not None and rank.run_kind() == "evaluation" else "training"
    except Exception:
        return "training"


def _device_steps(rank) -> dict[str, Any] | None:
    """The device timeline's per-step records as columns (``clock: "device"``), or None without one.
    Idle between two steps is ``sync`` when the loop synchronises every step, else ``host`` (the rule
    of :func:`diag.timeline.summarize`)."""
    from diag.timeline import syncs_every_step

    tl = rank.timeline
    if tl.clock != "device" or not isinstance(tl.steps, list):
        return None
    recs = [s for s in tl.steps if isinstance(s, dict) and isinstance(s.get("index"), int)
            and isinstance(s.get("device_s"), (int, float))]
    if not recs:
        return None
    between = "idle_sync_s" if syncs_every_step(rank) else "idle_host_s"

    def num(v) -> float:
        return float(v) if isinstance(v, (int, float)) and math.isfinite(v) else 0.0

    cols: dict[str, list] = {"index": []}
    cols.update({name: [] for name in DEVICE_FIELDS})
    for r in sorted(recs, key=lambda r: r["index"]):
        idle = r.get("idle") if isinstance(r.get("idle"), dict) else {}
        phases = r.get("phases") if isinstance(r.get("phases"), dict) else {}
        row = {"total_s": num(r["device_s"]), "busy_s": num(r.get("busy_s")), "idle_s": num(r.get("idle_s")),
               "idle_data_s": num(idle.get("data")),
               "idle_h2d_s": num(idle.get("h2d")) + num(idle.get("h2d_pinned")),   # pageable and pinned copies
               "idle_sync_s": 0.0, "idle_host_s": 0.0, "eval_s": num(phases.get("eval"))}
        row[between] = num(idle.get("between"))
        cols["index"].append(r["index"])
        for name in DEVICE_FIELDS:
            cols[name].append(round(row[name], 9))
    return {"clock": "device", "steps": cols}


def _facts(ev, rank) -> dict[str, Any]:
    env = ev.environment
    run = ev.run
    devices = [d.name for d in env.devices] if env.cuda_available and env.devices else []
    samples = [s.samples for s in (rank.steps if rank else []) if s.samples and not s.instrumented]
    world = max([r.world_size for r in ev.ranks] + [len(ev.ranks), 1])
    used = _device_used(rank)
    return {
        "script": run.script, "script_name": Path(run.script).name if run.script else None,
        "args": list(run.args), "launcher": run.launcher,
        "batch": int(statistics.median(samples)) if samples else None,
        "world_size": world,
        "device": used,
        "gpu_models": sorted(set(devices)),
        "torch": env.torch, "cuda": env.cuda, "python": (env.python or "").split(" ")[0] or None,
        "hostname": env.hostname, "cpu_count": env.cpu_count, "torch_num_threads": env.torch_num_threads,
        "env": dict(env.env), "simulated_gpus": run.simulated_gpus, "diag_version": ev.diag_version,
        "status": run.status,
    }


def _device_used(rank) -> str:
    """"cpu", "cuda", "mps", ... from where the models' parameters were."""
    kinds = set()
    for m in (rank.models if rank else []):
        for d in m.devices:
            kinds.add(str(d).split(":")[0])
    kinds.discard("meta")
    if not kinds:
        return "unknown"
    return "+".join(sorted(kinds))


def _scalars(ev, rank, kind: str = "training") -> dict[str, float | None]:
    out: dict[str, float | None] = {"time_to_first_step_s": None, "mfu": None,
                                    "allocator_peak_bytes": None, "device_peak_bytes": None,
                                    "persistent_bytes": None}
    if rank is None:
        return out
    first = [s for s in (rank.eval_steps if kind == "evaluation" else rank.steps) if s.index == 1]
    if first:
        out["time_to_first_step_s"] = round(float(first[0].t), 6)
    # MFU is judged in diag's process from the recorded FLOPs and device name against the catalogue,
    # exactly as the cost.mfu check and diag cost do (the probe records no MFU)
    from diag.cost.measured import judge_rank

    judged = judge_rank(rank)
    mfu = judged[1].get("mfu") if judged else None
    if isinstance(mfu, (int, float)) and math.isfinite(mfu):
        out["mfu"] = float(mfu)
    mem = rank.memory if isinstance(rank.memory, dict) else {}
    peaks = [s.get("peak") for s in mem.get("steps") or [] if isinstance(s, dict) and s.get("peak")]
    rpeaks = [s.get("reserved_peak") for s in mem.get("steps") or []
              if isinstance(s, dict) and s.get("reserved_peak")]
    if peaks:
        out["allocator_peak_bytes"] = float(max(peaks))
    device = [float(max(rpeaks))] if rpeaks else []
    for d in (ev.gpu or {}).get("devices") or []:
        st = d.get("stats") or {}
        v = st.get("run_mem_max") or st.get("mem_used_max")
        if isinstance(v, (int, float)) and v > 0 and not (ev.gpu or {}).get("simulated"):
            device.append(float(v))
    if device:
        out["device_peak_bytes"] = max(device)
    pers = mem.get("persistent") or {}
    parts = [pers.get(k) for k in ("params", "buffers", "grads", "optimizer_state")]
    if any(isinstance(p, (int, float)) for p in parts):
        out["persistent_bytes"] = float(sum(p for p in parts if isinstance(p, (int, float))))
    return out


# ---- loading ---------------------------------------------------------------------------------------

def load(path: str | Path, *, select=(), ignore=()) -> RunSample:
    """A run directory, an evidence.json or a JSON report -> RunSample (DiagError on bad input)."""
    p = Path(path)
    if not p.exists():
        raise DiagError(f"{str(p)!r} does not exist (give a run directory, an evidence.json or a "
                        "report from diag check --format json)")
    if p.is_dir():
        if (p / "evidence.json").is_file():
            return from_evidence_file(p / "evidence.json", select=select, ignore=ignore)
        raise DiagError(f"{str(p)!r} is a directory with no evidence.json in it")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise DiagError(f"cannot read {str(p)!r}: {e}") from None
    except json.JSONDecodeError as e:
        raise DiagError(f"{str(p)!r} is not valid JSON (line {e.lineno}: {e.msg}); it may be truncated") from None
    if not isinstance(data, dict):
        raise DiagError(f"{str(p)!r} is neither an evidence file nor a diag JSON report")
    if "ranks" in data and "run" in data:
        return from_evidence_file(p, select=select, ignore=ignore)
    if "findings" in data and "tool" in data:
        return from_report(data, str(p), select=select, ignore=ignore)
    if "$schema" in data or "runs" in data:
        raise DiagError(f"{str(p)!r} is a SARIF file; compare needs a JSON report (diag check --format "
                        "json), an evidence.json or a run directory")
    raise DiagError(f"{str(p)!r} is neither an evidence file nor a diag JSON report")


def from_evidence_file(path: Path, *, select=(), ignore=()) -> RunSample:
    from diag.evidence import load_evidence
    from diag.registry import Registry

    ev = load_evidence(path)
    findings = [f.to_dict() for f in Registry.discover().select(select, ignore).run(ev)]
    return from_export(export(ev), str(path), findings)


def from_evidence(ev, findings, source: str) -> RunSample:
    """For `diag check --baseline`: the run just judged, in memory."""
    return from_export(export(ev), source, [f.to_dict() for f in findings])


def from_report(data: dict, source: str, *, select=(), ignore=()) -> RunSample:
    block = data.get("compare")
    findings = [f for f in data.get("findings") or [] if isinstance(f, dict)]
    if isinstance(block, dict):
        if not isinstance(block.get("version"), int) or block["version"] > EXPORT_VERSION:
            raise DiagError(f"the report {source!r} was written by a newer diag (compare block version "
                            f"{block.get('version')}); upgrade diag to read it")
        return from_export(block, source, findings)
    ev_path = (data.get("run") or {}).get("evidence")
    if ev_path and Path(ev_path).is_file():
        from diag.evidence import load_evidence

        return from_export(export(load_evidence(ev_path)), source, findings)
    raise DiagError(f"the report {source!r} has no per-step data (it predates diag compare) and its "
                    "evidence file is not here; save the baseline with this diag's --format json")


def from_export(block: dict, source: str, findings: list[dict]) -> RunSample:
    try:
        cols = block["steps"]
        n = len(cols["index"])
        rows = [{k: cols[k][i] for k in cols} for i in range(n)]
    except (KeyError, TypeError, IndexError) as e:
        raise DiagError(f"{source!r}: the per-step data is malformed ({e})") from None
    rows.sort(key=lambda r: r["index"])
    timed = [r for r in rows if not r.get("instrumented")]
    instrumented = n - len(timed)
    warm = warmup_count(len(timed))
    steady = timed[warm:]
    steps: dict[str, np.ndarray] = {}
    for name in STEP_FIELDS:
        steps[name] = np.array([float(r.get(name) or 0.0) for r in steady])
    tot = steps["total_s"]
    with np.errstate(divide="ignore", invalid="ignore"):
        steps["data_share"] = np.where(tot > 0, steps["data_s"] / tot, np.nan)
        for unit in ("samples", "tokens"):
            vals = np.array([float(r.get(unit) or np.nan) for r in steady])
            if np.isfinite(vals).sum() >= max(1, len(steady) // 2):
                steps[f"{unit}_per_s"] = np.where(tot > 0, vals / tot, np.nan)
    _device_from_export(block.get("device"), {r["index"] for r in steady}, steps, source)
    scalars = dict(block.get("scalars") or {})
    facts = dict(block.get("facts") or {})
    return RunSample(source=source, facts=facts, steps=steps, scalars=scalars, findings=findings,
                     steps_total=int(block.get("steps_total") or n),
                     excluded={"warmup": warm, "instrumented": instrumented},
                     status=str(facts.get("status") or ""))


def _device_from_export(device: Any, steady_index: set, steps: dict[str, np.ndarray], source: str) -> None:
    """Adds ``device.<field>`` per-step arrays (device clock) for the timeline steps that are in the
    host steady state (warm-up and instrumented steps excluded the same way on both clocks)."""
    if not isinstance(device, dict) or device.get("clock") != "device":
        return
    try:
        cols = device["steps"]
        n = len(cols["index"])
        rows = [{k: cols[k][i] for k in cols} for i in range(n)]
    except (KeyError, TypeError, IndexError) as e:
        raise DiagError(f"{source!r}: the per-step device timeline is malformed ({e})") from None
    rows = sorted((r for r in rows if r.get("index") in steady_index), key=lambda r: r["index"])
    if not rows:
        return
    for name in DEVICE_FIELDS:
        steps[f"device.{name}"] = np.array([float(r.get(name) or 0.0) for r in rows])


def warmup_count(n: int) -> int:
    """Warm-up steps dropped from ``n`` timed steps (the same rule for every run)."""
    if n <= MIN_STEADY:
        return 0
    w = min(20, max(1, math.ceil(0.1 * n)))
    return min(w, n - MIN_STEADY)
