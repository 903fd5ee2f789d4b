"""Fold probe events into Evidence. Pure Python, no torch: runs in diag's own process.

The event kinds and their fields are listed in :mod:`diag.evidence.events` (shared with the probe).
``set``/``append``/``merge`` address a typed rank section (memory, flops, amp, sync, distributed,
extras) by a dotted path; a value that reaches a typed key is checked against its type, and a value
of the wrong type is recorded as a probe error instead of entering the evidence.
"""
from __future__ import annotations

from typing import Any

from diag.evidence import (MAX_EXCEPTIONS_KEPT, MAX_LIST_SECTION, MAX_STEPS_KEPT, ChildProcess, DataLoaderInfo,
                           EvalStepRecord, EvaluationPass, FrameworkInfo,
                           Environment, Evidence, ExceptionInfo, ForwardSite, ModelInfo, OptimizerInfo,
                           RankEvidence, SchemaError, Section, StepRecord, _from_dict, build)
from diag.evidence import events as E
from diag.evidence._schema import resolve_hints
from diag.evidence.probe import fold_sampling

SECTIONS = E.SECTIONS


def _replace_by_id(items: list, obj, attr: str = "id") -> None:
    key = getattr(obj, attr)
    for i, existing in enumerate(items):
        if getattr(existing, attr) == key:
            items[i] = obj
            return
    items.append(obj)


def fold(ev: Evidence, event: dict[str, Any]) -> None:
    """Apply one event to the evidence (in place). Unknown kinds are kept under extras; an event whose
    fields have the wrong types is recorded in ``extras.probe_errors`` (the run goes on)."""
    try:
        _fold(ev, event)
    except (SchemaError, TypeError, ValueError, AttributeError) as e:
        r = ev.rank(_rank_of(event))
        errs = r.extras.setdefault("probe_errors", [])
        if len(errs) < 50:
            errs.append({"where": f"fold {event.get('kind')!s:.40}", "error": f"{type(e).__name__}: {e}"[:500],
                         "traceback": None})


def _rank_of(event: dict) -> int:
    try:
        return int(event.get("rank", 0) or 0)
    except (TypeError, ValueError):
        return 0


def _fold(ev: Evidence, event: dict[str, Any]) -> None:
    kind = event.get("kind")
    rank_no = _rank_of(event)
    r = ev.rank(rank_no)
    data = {k: v for k, v in event.items() if k not in ("kind", "rank")}
    t = data.pop("t", None)

    if kind == E.STEP:
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
    elif kind == E.FORWARD_COUNTS:
        _apply_counts(r, data.get("counts", {}))
    elif kind == E.FORWARD_SITE:
        site = _from_dict(ForwardSite, data)
        _replace_by_id(r.forwards, site, "key")
    elif kind == E.MODEL:
        _replace_by_id(r.models, _from_dict(ModelInfo, data))
    elif kind == E.DATALOADER:
        _replace_by_id(r.dataloaders, _from_dict(DataLoaderInfo, data))
    elif kind == E.OPTIMIZER:
        _replace_by_id(r.optimizers, _from_dict(OptimizerInfo, data))
    elif kind == E.EVALUATION:
        r.evaluations.append(_from_dict(EvaluationPass, data))
        if len(r.evaluations) > MAX_LIST_SECTION:
            del r.evaluations[0]
    elif kind == E.EVAL_STEP:
        counts = data.pop("forward_counts", None)
        if counts:
            _apply_counts(r, counts)
        es = _from_dict(EvalStepRecord, data)
        es.t = t or 0.0
        r.eval_steps.append(es)
        if len(r.eval_steps) > MAX_STEPS_KEPT:
            del r.eval_steps[: len(r.eval_steps) - MAX_STEPS_KEPT]
        st = r.eval_stats
        st.count += 1
        if not es.instrumented:
            st.timed += 1
            st.total_s += es.total_s
            st.data_s += es.data_s
            st.h2d_s += es.h2d_s
            st.forward_s += es.forward_s
            st.other_s += es.other_s
            st.forwards += es.forwards
            st.samples += es.samples or 0
            st.tokens += es.tokens or 0
        st.host_syncs += es.host_syncs
        st.steps_with_syncs += 1 if es.host_syncs else 0
    elif kind == E.EVAL_SYNCS:
        sites = data.get("sites")
        if isinstance(sites, list):
            r.eval_stats.sync_sites = [dict(x) for x in sites[:10] if isinstance(x, dict)]
    elif kind == E.FRAMEWORK:
        r.framework = _from_dict(FrameworkInfo, data)
    elif kind == E.CHILD:
        _replace_by_id(r.children, _from_dict(ChildProcess, data), "pid")
    elif kind == E.EXCEPTION:
        exc = _from_dict(ExceptionInfo, data)
        exc.t = t
        r.exceptions.append(exc)
        if len(r.exceptions) > MAX_EXCEPTIONS_KEPT:
            del r.exceptions[0]
    elif kind == E.ENV:
        env = _from_dict(Environment, data)
        if rank_no == 0 or not ev.environment.torch:
            ev.environment = env
        r.host = env.hostname or r.host
    elif kind == E.START:
        r.pid = data.get("pid")
        r.host = data.get("host") or r.host
        r.local_rank = int(data.get("local_rank", 0) or 0)
        r.world_size = int(data.get("world_size", 1) or 1)
        r.started_at = data.get("started_at")
        r.status = "running"
    elif kind == E.END:
        r.status = data.get("status") or "completed"
        r.exit_code = data.get("exit_code")
        if data.get("reason"):
            r.extras["end_reason"] = data["reason"]
    elif kind in E.SECTION_EVENTS:
        _apply_section(r, kind, data)
    elif kind == E.PROBE_SAMPLING:
        fold_sampling(r.probe, data)
    elif kind == E.PROBE_ERROR:
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


def _typed(container: Any, key: str, value: Any, path: str) -> Any:
    """``value`` checked (and built) against the declared type of ``key`` in a typed section."""
    if isinstance(container, Section):
        hints = resolve_hints(type(container))
        if key in hints:
            return build(hints[key], value, path)
    return value


def _child(container: dict, key: str, path: str) -> dict:
    """The object at ``key`` (created empty, typed when the section declares it)."""
    cur = container.get(key)
    if isinstance(cur, dict):
        return cur
    new = _typed(container, key, {}, path)
    container[key] = new if isinstance(new, dict) else {}
    return container[key]


def _apply_section(r: RankEvidence, kind: str, data: dict) -> None:
    path = str(data.get("path", ""))
    parts = path.split(".")
    if not parts or parts[0] not in SECTIONS:
        return
    target: Any = getattr(r, parts[0])
    for depth, p in enumerate(parts[1:-1], start=2):
        target = _child(target, p, ".".join(parts[:depth]))
    value = data.get("value")
    if len(parts) == 1:
        if kind == E.MERGE and isinstance(value, dict):
            for k, v in value.items():
                target[k] = _typed(target, k, v, f"{path}.{k}")
        return
    last = parts[-1]
    if kind == E.SET:
        target[last] = _typed(target, last, value, path)
    elif kind == E.APPEND:
        lst = target.get(last)
        if not isinstance(lst, list):
            lst = target[last] = []
        lst.append(value)
        limit = int(data.get("limit") or MAX_LIST_SECTION)
        if len(lst) > limit:
            del lst[: len(lst) - limit]
    elif kind == E.MERGE:
        d = _child(target, last, path)
        if isinstance(value, dict):
            for k, v in value.items():
                d[k] = _typed(d, k, v, f"{path}.{k}")
