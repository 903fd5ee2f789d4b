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

Steady state (the same rule on both sides, and the one every check and view uses:
:func:`diag.evidence.phases.steady_steps`): instrumented steps (FLOP counting, the memory replay's
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
from diag.evidence import phases as _ph

EXPORT_VERSION = 1
PHASES = _ph.TRAINING_NAMES          # ("data", "forward", "backward", "optimizer", "other")
STEP_FIELDS = _ph.STEP_FIELDS
MIN_STEADY = _ph.MIN_STEADY
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
    if not p.is_file():
        raise DiagError(f"{str(p)!r} is not a regular file (a device, a pipe or a socket); give a run "
                        "directory, an evidence.json or a report from diag check --format json")
    from diag.evidence.document import MAX_EVIDENCE_BYTES

    try:
        if p.stat().st_size > MAX_EVIDENCE_BYTES:
            raise DiagError(f"{str(p)!r} is larger than diag reads ({MAX_EVIDENCE_BYTES >> 20} MiB): it was "
                            "not written by diag")
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise DiagError(f"cannot read {str(p)!r}: {getattr(e, 'strerror', None) or e}") from None
    except json.JSONDecodeError as e:
        raise DiagError(f"{str(p)!r} is not valid JSON (line {e.lineno}: {e.msg}); it may be truncated") from None
    except RecursionError:
        raise DiagError(f"{str(p)!r} is nested too deeply to be a diag report or evidence file") from None
    except ValueError as e:    # an integer of thousands of digits
        raise DiagError(f"{str(p)!r} is not a diag report or evidence file ({e})") from None
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
    raw = data.get("findings")
    if not isinstance(raw, list):
        raise DiagError(f"the report {source!r} is malformed: its findings are {type(raw).__name__}, not a list")
    findings = _clean_findings(raw, source)
    if block is not None and not isinstance(block, dict):
        raise DiagError(f"the report {source!r} is malformed: its compare block is {type(block).__name__}, "
                        "not an object")
    if isinstance(block, dict):
        if not isinstance(block.get("version"), int) or block["version"] > EXPORT_VERSION:
            raise DiagError(f"the report {source!r} was written by a newer diag (compare block version "
                            f"{block.get('version')}); upgrade diag to read it")
        return from_export(block, source, findings)
    run = data.get("run")
    ev_path = run.get("evidence") if isinstance(run, dict) else None
    if isinstance(ev_path, str) and ev_path and Path(ev_path).is_file():
        from diag.evidence import load_evidence

        return from_export(export(load_evidence(ev_path)), source, findings)
    raise DiagError(f"the report {source!r} has no per-step data (it predates diag compare) and its "
                    "evidence file is not here; save the baseline with this diag's --format json")


# what a compare block's facts may hold: anything else is a malformed (or crafted) report
_FACT_TYPES = {"script": str, "script_name": str, "launcher": str, "device": str, "torch": str, "cuda": str,
               "python": str, "hostname": str, "diag_version": str, "status": str, "kind": str,
               "simulated_gpus": (str, bool), "batch": int, "world_size": int, "cpu_count": int,
               "torch_num_threads": int, "args": list, "gpu_models": list, "env": dict}


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _malformed(source: str, what: str) -> DiagError:
    return DiagError(f"{source!r} is malformed: {what}; save the baseline again with diag check --format json")


def _clean_facts(facts: Any, source: str) -> dict[str, Any]:
    if facts is None:
        return {}
    if not isinstance(facts, dict):
        raise _malformed(source, f"its facts are {type(facts).__name__}, not an object")
    out = {}
    for k, v in facts.items():
        want = _FACT_TYPES.get(k)
        if v is None or want is None:
            out[k] = v if v is None or isinstance(v, (str, int, float, bool)) else str(v)
            continue
        if isinstance(v, bool) and want is int or not isinstance(v, want):
            raise _malformed(source, f"the fact {k!r} is {type(v).__name__}")
        if k in ("args", "gpu_models"):
            v = [str(x) for x in v if isinstance(x, (str, int, float))]
        elif k == "env":
            v = {str(a): str(b) for a, b in v.items() if isinstance(b, (str, int, float, bool))}
        out[k] = v
    return out


def _clean_findings(raw: list, source: str) -> list[dict]:
    out = []
    for f in raw:
        if not isinstance(f, dict) or not isinstance(f.get("id"), str):
            continue
        g = {k: (v if v is None or isinstance(v, (str, int, float, bool)) else str(v))
             for k, v in f.items() if k not in ("location", "evidence")}
        loc = f.get("location")
        if isinstance(loc, dict) and isinstance(loc.get("file"), str):
            line = loc.get("line")
            g["location"] = {"file": loc["file"], "line": line if isinstance(line, int) and not isinstance(line, bool)
                             else None, "function": loc.get("function") if isinstance(loc.get("function"), str) else None}
        out.append(g)
    return out


def from_export(block: dict, source: str, findings: list[dict]) -> RunSample:
    """A compare block -> RunSample. Every value is checked: per-step values must be finite numbers
    (a NaN step would make any comparison pass), the columns of equal length, the facts of their types;
    anything else is one DiagError naming the file."""
    if not isinstance(block, dict):
        raise _malformed(source, "its per-step data is not an object")
    try:
        cols = block["steps"]
        if not isinstance(cols, dict):
            raise TypeError("steps is not an object")
        n = len(cols["index"])
        for k, col in cols.items():
            if not isinstance(col, list) or len(col) != n:
                raise TypeError(f"the column {k!r} is not a list of {n} values")
        rows = [{k: cols[k][i] for k in cols} for i in range(n)]
    except (KeyError, TypeError, IndexError) as e:
        raise DiagError(f"{source!r}: the per-step data is malformed ({e})") from None
    for r in rows:
        if not isinstance(r["index"], int) or isinstance(r["index"], bool):
            raise _malformed(source, f"a step index is {r['index']!r}, not a whole number")
        for name in STEP_FIELDS:
            v = r.get(name)
            if v is not None and not (_finite(v) and v >= 0):
                raise _malformed(source, f"step {r['index']} has {name} = {v!r}, not a finite number of seconds")
        for unit in ("samples", "tokens"):
            v = r.get(unit)
            if v is not None and not (_finite(v) and v >= 0):
                raise _malformed(source, f"step {r['index']} has {unit} = {v!r}")
    if len({r["index"] for r in rows}) != len(rows):
        raise _malformed(source, "a step index appears twice")
    rows.sort(key=lambda r: r["index"])
    timed = [r for r in rows if not r.get("instrumented")]
    instrumented = n - len(timed)
    steady = _ph.steady_steps(rows)
    warm = len(timed) - len(steady)
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
    raw_scalars = block.get("scalars") or {}
    if not isinstance(raw_scalars, dict):
        raise _malformed(source, f"its scalars are {type(raw_scalars).__name__}, not an object")
    scalars = {}
    for k, v in raw_scalars.items():
        if v is not None and not _finite(v):
            raise _malformed(source, f"the value {k!r} is {v!r}, not a finite number")
        scalars[str(k)] = v
    facts = _clean_facts(block.get("facts"), source)
    total = block.get("steps_total")
    if total is not None and not (isinstance(total, int) and not isinstance(total, bool) and total >= 0):
        raise _malformed(source, f"steps_total is {total!r}")
    return RunSample(source=source, facts=facts, steps=steps, scalars=scalars, findings=findings,
                     steps_total=int(total or n),
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
    for r in rows:
        for name in DEVICE_FIELDS:
            v = r.get(name)
            if v is not None and not _finite(v):
                raise _malformed(source, f"the device timeline has {name} = {v!r}, not a finite number")
    rows = sorted((r for r in rows if isinstance(r.get("index"), int) and r["index"] in steady_index),
                  key=lambda r: r["index"])
    if not rows:
        return
    for name in DEVICE_FIELDS:
        steps[f"device.{name}"] = np.array([float(r.get(name) or 0.0) for r in rows])


def warmup_count(n: int) -> int:
    """Warm-up steps dropped from ``n`` timed steps (the same rule for every run and every reader:
    :func:`diag.evidence.phases.warmup_count`)."""
    return _ph.warmup_count(n)
