"""Fold probe events into Evidence. Pure Python, no torch: runs in diag's own process.

Event kinds (each carries ``t`` seconds since the probe started, and ``rank``):

``start``          pid, host, local_rank, world_size, started_at
``env``            Environment fields (replaces environment; emitted at start, after step 2, at exit)
``model``          ModelInfo fields (first top-level forward of a module)
``forward_site``   ForwardSite fields (new combination of model, call site and mode)
``forward_counts`` {counts: {site_key: total}} (at the end of a run; during it they ride on ``step``)
``step``           StepRecord fields (+ ``forward_counts``: {site_key: total} for sites called since the last step)
``dataloader``     DataLoaderInfo fields (cumulative; replaces the earlier record with that id)
``optimizer``      OptimizerInfo fields (cumulative)
``exception``      ExceptionInfo fields
``end``            status, exit_code, reason, steps
``probe_error``    where, error, traceback (a probe hook failed; the run went on)
``set``            {path: "memory.estimate", value: ...}: set a key in a rank section
``append``         {path: "memory.samples", value: ..., limit: N}: append to a list in a rank section
``merge``          {path: "memory", value: {...}}: update a dict in a rank section

Sections addressable by ``set``/``append``/``merge``: memory, flops, amp, sync, distributed, extras.
"""
from __future__ import annotations

from typing import Any

from diag.evidence import (MAX_EXCEPTIONS_KEPT, MAX_LIST_SECTION, MAX_STEPS_KEPT, DataLoaderInfo,
                           Environment, Evidence, ExceptionInfo, ForwardSite, ModelInfo, OptimizerInfo,
                           RankEvidence, StepRecord, _from_dict)

SECTIONS = ("memory", "flops", "amp", "sync", "distributed", "extras")


def _replace_by_id(items: list, obj, attr: str = "id") -> None:
    key = getattr(obj, attr)
    for i, existing in enumerate(items):
        if getattr(existing, attr) == key:
            items[i] = obj
            return
    items.append(obj)


def fold(ev: Evidence, event: dict[str, Any]) -> None:
    """Apply one event to the evidence (in place). Unknown kinds are kept under extras."""
    kind = event.get("kind")
    rank_no = int(event.get("rank", 0) or 0)
    r = ev.rank(rank_no)
    data = {k: v for k, v in event.items() if k not in ("kind", "rank")}
    t = data.pop("t", None)

    if kind == "step":
        counts = data.pop("forward_counts", None)
        if counts:
            _apply_counts(r, counts)
        step = _from_dict(StepRecord, data)
        step.t = t or 0.0
        r.steps.append(step)
        if len(r.steps) > MAX_STEPS_KEPT:
            del r.steps[: len(r.steps) - MAX_STEPS_KEPT]
        st = r.step_stats
        st.count += 1
        if not step.instrumented:
            st.timed += 1
            st.total_s += step.total_s
            st.data_s += step.data_s
            st.forward_s += step.forward_s
            st.backward_s += step.backward_s
            st.optimizer_s += step.optimizer_s
            st.other_s += step.other_s
        st.samples += step.samples or 0
        st.tokens += step.tokens or 0
        r.backward_calls += step.n_backward
    elif kind == "forward_counts":
        _apply_counts(r, data.get("counts", {}))
    elif kind == "forward_site":
        site = _from_dict(ForwardSite, data)
        _replace_by_id(r.forwards, site, "key")
    elif kind == "model":
        _replace_by_id(r.models, _from_dict(ModelInfo, data))
    elif kind == "dataloader":
        _replace_by_id(r.dataloaders, _from_dict(DataLoaderInfo, data))
    elif kind == "optimizer":
        _replace_by_id(r.optimizers, _from_dict(OptimizerInfo, data))
    elif kind == "exception":
        exc = _from_dict(ExceptionInfo, data)
        exc.t = t
        r.exceptions.append(exc)
        if len(r.exceptions) > MAX_EXCEPTIONS_KEPT:
            del r.exceptions[0]
    elif kind == "env":
        env = _from_dict(Environment, data)
        if rank_no == 0 or not ev.environment.torch:
            ev.environment = env
        r.host = env.hostname or r.host
    elif kind == "start":
        r.pid = data.get("pid")
        r.host = data.get("host") or r.host
        r.local_rank = int(data.get("local_rank", 0) or 0)
        r.world_size = int(data.get("world_size", 1) or 1)
        r.started_at = data.get("started_at")
        r.status = "running"
    elif kind == "end":
        r.status = data.get("status") or "completed"
        r.exit_code = data.get("exit_code")
        if data.get("reason"):
            r.extras["end_reason"] = data["reason"]
    elif kind in ("set", "append", "merge"):
        _apply_section(r, kind, data)
    elif kind == "probe_error":
        errs = r.extras.setdefault("probe_errors", [])
        if len(errs) < 50:
            errs.append({"where": data.get("where"), "error": data.get("error"),
                         "traceback": data.get("traceback")})
    else:
        other = r.extras.setdefault("events", {})
        lst = other.setdefault(str(kind), [])
        if len(lst) < 100:
            lst.append(data)


def _apply_counts(r: RankEvidence, counts: dict) -> None:
    for site in r.forwards:
        if site.key in counts:
            site.count = counts[site.key]


def _apply_section(r: RankEvidence, kind: str, data: dict) -> None:
    path = str(data.get("path", ""))
    parts = path.split(".")
    if not parts or parts[0] not in SECTIONS:
        return
    target: Any = getattr(r, parts[0])
    for p in parts[1:-1]:
        target = target.setdefault(p, {})
    value = data.get("value")
    if len(parts) == 1:
        if kind == "merge" and isinstance(value, dict):
            target.update(value)
        return
    last = parts[-1]
    if kind == "set":
        target[last] = value
    elif kind == "append":
        lst = target.setdefault(last, [])
        lst.append(value)
        limit = int(data.get("limit") or MAX_LIST_SECTION)
        if len(lst) > limit:
            del lst[: len(lst) - limit]
    elif kind == "merge":
        d = target.setdefault(last, {})
        if isinstance(value, dict):
            d.update(value)
