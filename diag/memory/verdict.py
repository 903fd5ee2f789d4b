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


def build_memory_plan(ev, target: dict | None = None) -> dict[str, Any]:
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
