"""``Evidence.memory_plan``: the memory plan assembled from a rank's ``memory.estimate`` and the
target device: the verdict diag judges from what the probe recorded. Pure Python, no torch.
Its text rendering is :mod:`diag.report.memory`.

Shape (documented in docs/memory.md)::

    {"status": "ok" | "skipped" | "none", "reason": str | None,
     "target": {"name", "memory", "source", "capability"} | None,
     "rank": 0,
     "verdict": {"target_batch", "observed_batch", "fits", "peak_device", "usable", "max_batch",
                 "max_eval_batch", "eval_batch", "accumulation"},
     "estimate": {...the rank's memory.estimate...},
     "live": {"breakdown", "device", "oom"}}
"""
from __future__ import annotations

from typing import Any


def eval_batch_observed(rank) -> int | None:
    """Batch size of the evaluation forwards that ran without building a graph."""
    best = None
    for s in rank.forwards:
        if s.training or (s.grad_enabled and not s.inference_mode):
            continue
        if s.input_shapes and s.input_shapes[0]:
            b = int(s.input_shapes[0][0])
            best = b if best is None else max(best, b)
    return best


def build_memory_plan(ev, target: dict | None = None, shard: dict | None = None) -> dict[str, Any]:
    """``shard``: ``{"strategy", "world", "gpus_per_node", "mixed", "unit_params", "buckets"}`` (``diag
    memory --shard``) adds the per-rank plan under ``sharded`` (:mod:`diag.memory.sharded`); without it a
    run whose evidence shows sharding (FSDP, DeepSpeed) is planned as it ran."""
    plan = _build(ev, target)
    add_sharded(plan, ev, shard)
    return plan


def _build(ev, target: dict | None) -> dict[str, Any]:
    r = ev.primary
    mem = r.memory if isinstance(r.memory, dict) else {}
    est = mem.get("estimate")
    live = {k: mem.get(k) for k in ("breakdown", "device", "oom") if mem.get(k) is not None}
    plan: dict[str, Any] = {"status": "none", "reason": None, "target": target, "rank": r.rank,
                            "verdict": None, "estimate": est, "live": live}
    if not est:
        status = ev.run.status
        if r.step_stats.count == 0 and status in ("failed", "oom", "killed"):
            plan["reason"] = f"the script {status} before its first training step, so no batch was captured"
        elif r.step_stats.count == 0:
            plan["reason"] = "no training step was observed (no forward, backward and optimizer step)"
        else:
            plan["reason"] = "the replay did not run"
        return plan
    if est.get("status") == "skipped":
        plan["status"] = "skipped"
        plan["reason"] = est.get("reason")
        return plan
    plan["status"] = "ok"
    at = est.get("at_target") or {}
    ev_part = est.get("eval") or {}
    acc = est.get("accumulation")
    plan["verdict"] = {
        "observed_batch": est.get("observed_batch"), "target_batch": est.get("target_batch"),
        "fits": at.get("fits"), "peak_allocated": at.get("allocated"), "peak_device": at.get("device"),
        "capacity": est.get("capacity"), "usable": est.get("usable"), "max_batch": est.get("max_batch"),
        "max_eval_batch": ev_part.get("max_batch"), "eval_batch": eval_batch_observed(r),
        "accumulation": acc,
    }
    return plan


def add_sharded(plan: dict, ev, shard: dict | None) -> None:
    """Add ``plan["sharded"]``: the plan of one rank of a sharded job (asked with ``shard``, or inferred
    from a run that was sharded). A plan that cannot be made says why (status ``skipped``)."""
    from diag.memory.sharded import (
        base_from_estimate,
        base_from_record,
        infer_sharding,
        largest_unit,
        make_sharded_plan,
    )

    inferred = infer_sharding(ev) if ev.ranks else None
    if shard is None:
        if inferred is None:
            return
        shard = {"strategy": inferred["strategy"], "world": inferred["world"], "mixed": inferred.get("mixed"),
                 "unit_params": inferred.get("unit_params"), "buckets": inferred.get("buckets")}
    asked = shard is not None and not (inferred is not None and shard.get("strategy") == inferred["strategy"]
                                       and shard.get("world") == inferred["world"]
                                       and shard.get("unit_params") == inferred.get("unit_params"))
    r = ev.primary
    mem = r.memory if isinstance(r.memory, dict) else {}
    pers = mem.get("persistent") or {}
    model = None
    if r.models:
        m = max(r.models, key=lambda m: m.params_total)
        model = {"cls": m.cls, "params_total": m.params_total, "params_trainable": m.params_trainable,
                 "module_types": dict(m.module_types), "layer_shapes": list(m.layer_shapes)}
    out: dict[str, Any] = {"status": "skipped", "reason": None, "asked": True, "inferred": inferred}
    est = plan.get("estimate") or {}
    replayed = plan["status"] == "ok" and bool(est.get("points") or est.get("at_target"))
    rep = est.get("replay") or {}
    tgt = plan.get("target") or {}
    try:
        if replayed:
            base = base_from_estimate(est, pers, model, rep.get("zero_grad_set_to_none"))
        elif inferred is not None and inferred.get("record"):
            base = base_from_record(inferred["record"], pers, int(inferred.get("world") or 1))
        else:
            why = plan.get("reason") or "the replay did not run"
            raise ValueError(f"no unsharded replay to divide ({why})" if inferred is None else
                             "the run is sharded and its sharded model's sizes were not recorded; run the script "
                             "unsharded on one process (diag memory --script ... --shard "
                             f"{shard['strategy']} --world {shard.get('world') or 'N'}) to plan it")
        if shard.get("unit_params"):
            unit, unit_src = int(shard["unit_params"]), ("--unit-params" if asked else "the run's largest FSDP unit")
        else:
            unit, unit_src = largest_unit(model, base["psi"])
        batch = int(est.get("target_batch") or est.get("observed_batch") or (mem.get("capture") or {}).get("batch") or 1)
        sp = make_sharded_plan(
            base, shard["strategy"], shard.get("world"), batch,
            capacity=est.get("capacity") or tgt.get("memory") or (mem.get("device") or {}).get("total"),
            headroom=est.get("headroom") or 0.10, gpus_per_node=int(shard.get("gpus_per_node") or 8),
            mixed=shard.get("mixed"), unit_params=unit, unit_source=unit_src, facts=est.get("facts"),
            capability=est.get("capability") or tgt.get("capability"), buckets=shard.get("buckets"))
    except ValueError as e:
        out["reason"] = str(e)
        plan["sharded"] = out
        return
    out.update(sp)
    out["status"] = "ok"
    out["asked"] = asked
    plan["sharded"] = out
