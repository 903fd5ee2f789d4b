"""The live breakdown of a CUDA run's memory, from the caching allocator's statistics and the live
model and optimizer. Pure Python: the probe (:mod:`diag.probe.memory`) reads
``torch.cuda.memory_stats()`` and the byte counts, these functions turn them into Evidence records,
and the checks read them back.

Per step (``RankEvidence.memory["steps"]``, one record per training step for the first 50 steps,
then every 10th step and the last: peaks, retries and OOMs are running totals)::

    {"step": 3, "allocated": ..., "reserved": ..., "peak": ..., "reserved_peak": ...,
     "retries": 0, "ooms": 0, "inactive_split": ...}

``peak`` and ``reserved_peak`` are torch's running maxima since the process started (diag does not
reset them: a script that reads ``torch.cuda.max_memory_allocated()`` itself keeps its numbers).

The breakdown of the peak (``RankEvidence.memory["breakdown"]``), made at the step whose peak rose,
at the optimizer step's end (gradients still present)::

    parameters       parameter + buffer bytes on the device (live model)
    gradients        .grad bytes on the device
    optimizer_state  optimizer.state tensors on the device
    other            allocated now - the three above (the batch, outputs, the loss, caches, workspaces)
    activations      peak - allocated now: what the step needed only transiently (saved activations,
                     backward temporaries, optimizer temporaries)
"""
from __future__ import annotations

from typing import Any

STAT_KEYS = {
    "allocated": "allocated_bytes.all.current",
    "peak": "allocated_bytes.all.peak",
    "reserved": "reserved_bytes.all.current",
    "reserved_peak": "reserved_bytes.all.peak",
    "inactive_split": "inactive_split_bytes.all.current",
    "retries": "num_alloc_retries",
    "ooms": "num_ooms",
}

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "other")

# the same keys as paths into torch.cuda.memory_stats_as_nested_dict()'s dict
NESTED_KEYS = {key: tuple(name.split(".")) for key, name in STAT_KEYS.items()}


def step_record(stats: dict[str, Any], step: int | None = None) -> dict[str, Any] | None:
    """A compact per-step record from ``torch.cuda.memory_stats()``; None when the dict is empty
    (CUDA not initialised, or a CPU run)."""
    if not stats or STAT_KEYS["allocated"] not in stats:
        return None
    rec: dict[str, Any] = {}
    if step is not None:
        rec["step"] = int(step)
    for key, name in STAT_KEYS.items():
        v = stats.get(name)
        rec[key] = int(v) if isinstance(v, (int, float)) else None
    return rec


def step_record_nested(stats: dict[str, Any], step: int | None = None) -> dict[str, Any] | None:
    """:func:`step_record` of ``torch.cuda.memory_stats_as_nested_dict()``: the same record, read
    without the flattening. ``torch.cuda.memory_stats()`` flattens and sorts the allocator's ~150
    counters in Python on every call, the largest part of the memory probe's cost on a CUDA step
    (issue 20: ~340 µs a step on an H200 with the flat read, beside the record's write)."""
    if not stats:
        return None
    rec: dict[str, Any] = {}
    if step is not None:
        rec["step"] = int(step)
    for key, path in NESTED_KEYS.items():
        v: Any = stats
        for part in path:
            v = v.get(part) if isinstance(v, dict) else None
        rec[key] = int(v) if isinstance(v, (int, float)) else None
    if rec["allocated"] is None:
        return None
    return rec


def live_breakdown(rec: dict[str, Any], persistent: dict[str, int]) -> dict[str, Any]:
    """Split ``rec["peak"]`` into the five categories (see the module docstring). ``persistent``:
    ``params``, ``buffers``, ``grads``, ``optimizer_state`` bytes on the device."""
    params = int(persistent.get("params", 0)) + int(persistent.get("buffers", 0))
    grads = int(persistent.get("grads", 0))
    opt = int(persistent.get("optimizer_state", 0))
    allocated = int(rec.get("allocated") or 0)
    peak = int(rec.get("peak") or allocated)
    known = params + grads + opt
    other = max(0, allocated - known)
    activations = max(0, peak - max(allocated, known))
    cats = {"parameters": params, "gradients": grads, "optimizer_state": opt, "activations": activations,
            "other": other}
    return {"step": rec.get("step"), "peak": peak, "allocated": allocated, "reserved": rec.get("reserved"),
            "categories": cats, "source": "allocator"}


def fragmentation(rec: dict[str, Any] | None) -> dict[str, Any] | None:
    """How much more the allocator reserved than the tensors needed, from a step record."""
    if not rec or rec.get("reserved_peak") is None or rec.get("peak") is None:
        return None
    rp, ap = int(rec["reserved_peak"]), int(rec["peak"])
    over = max(0, rp - ap)
    return {"reserved_peak": rp, "allocated_peak": ap, "overhead": over,
            "overhead_fraction": (over / ap) if ap else None,
            "inactive_split": rec.get("inactive_split"), "retries": int(rec.get("retries") or 0),
            "ooms": int(rec.get("ooms") or 0)}


def alloc_conf(env: dict[str, str] | None) -> str:
    env = env or {}
    return ",".join(v for v in (env.get("PYTORCH_CUDA_ALLOC_CONF"), env.get("PYTORCH_ALLOC_CONF")) if v)


def expandable_segments_enabled(env: dict[str, str] | None) -> bool:
    conf = alloc_conf(env).replace(" ", "").lower()
    return "expandable_segments:true" in conf
