"""The memory plan of a sharded job: what one rank holds under DDP, ZeRO-1/2/3 (DeepSpeed) or FSDP
(FSDP2 ``fully_shard``, FSDP1 FULL_SHARD / SHARD_GRAD_OP / HYBRID_SHARD), from one *unsharded* replay
of the step (:mod:`diag.probe.replay`) and the live model's sizes. Pure Python, no torch.

The division (ZeRO paper, Rajbhandari et al. 2019, arXiv:1910.02054, Figure 1: a model of Ψ parameters
trained with mixed-precision Adam holds 2Ψ + 2Ψ + KΨ bytes, K = 12; ZeRO-1 divides the KΨ optimizer
state by the data-parallel degree N_d, ZeRO-2 the gradients too, ZeRO-3 the parameters too)::

    strategy        parameters   gradients   optimizer state   communication buffers (per rank)
    ddp             P            G           O                 DDP's gradient buckets (G, unless
                                                               gradient_as_bucket_view=True)
    zero1           P            G           O / N             reduce bucket + all-gather bucket
    zero2           P            G / N       O / N             reduce bucket + all-gather bucket
    zero3           P / N        G / N       O / N             reduce bucket + prefetch bucket + one unit
    shard-grad-op   P / N        G / N       O / N             + the unsharded parameters from forward
                                                               to backward (FSDP SHARD_GRAD_OP ~ ZeRO-2)
    fsdp            P / N        G / N       O / N             all-gather: 2 units (the one computing +
                                                               the prefetched next); reduce-scatter: 1 unit
    hybrid          as fsdp with N = the GPUs of one node (HYBRID_SHARD: sharded in the node,
                    replicated across nodes)

P, G, O are the bytes the script holds unsharded (parameters + buffers, gradients, optimizer state);
with ``mixed="bf16"|"fp16"`` (DeepSpeed's bf16/fp16 modes, FSDP's MixedPrecisionPolicy) the
parameters and gradients are 2 bytes each, the optimizer keeps an fp32 master copy (4Ψ more: K = 12
for Adam) and FSDP all-gathers 2-byte copies. Division rounds up (ZeRO pads its flat buffer to a
multiple of N; FSDP2 gives rank 0 ceil(rows/N) rows of every parameter). Activations are not sharded:
a rank's activations are those of its own batch, as the replay measured them.

Per phase of the replayed step (forward, backward, optimizer step) the rank's figure is::

    state divided as above + the phase's transient memory (undivided; the optimizer's temporaries are
    divided like the optimizer state) + that phase's communication buffers

and the rank's peak is the largest phase. The phase peaks come from the replay; the gradients alive at
each phase are those of the replay's peak when it is that phase, else none in the forward with
``zero_grad(set_to_none=True)`` (all otherwise) and the full set in the optimizer step; gradients made
during a backward that is not the replay's peak are counted undivided (an upper bound).
"""
from __future__ import annotations

import math
from typing import Any, Callable

from diag.memory.plan import ALLOCATOR_CACHE_FRACTION, CUDA_CONTEXT_BYTES, allowances, largest_fitting

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "shard-grad-op", "hybrid")
STRATEGY_LABELS = {
    "ddp": "DDP (nothing sharded)",
    "zero1": "DeepSpeed ZeRO-1 (optimizer state sharded)",
    "zero2": "DeepSpeed ZeRO-2 (optimizer state and gradients sharded)",
    "zero3": "DeepSpeed ZeRO-3 (optimizer state, gradients and parameters sharded)",
    "fsdp": "FSDP FULL_SHARD / FSDP2 fully_shard (optimizer state, gradients and parameters sharded)",
    "shard-grad-op": "FSDP SHARD_GRAD_OP (parameters unsharded from forward to backward, ~ ZeRO-2)",
    "hybrid": "FSDP HYBRID_SHARD (fully sharded within a node, replicated across nodes)",
}
ALIASES = {"full_shard": "fsdp", "full-shard": "fsdp", "fsdp2": "fsdp", "fully_shard": "fsdp",
           "shard_grad_op": "shard-grad-op", "hybrid_shard": "hybrid", "hybrid-shard": "hybrid",
           "zero-1": "zero1", "zero-2": "zero2", "zero-3": "zero3", "none": "ddp", "no_shard": "ddp"}

# DeepSpeed's defaults (deepspeed/runtime/zero/config.py; the "zero_optimization" section of the
# DeepSpeed configuration docs), in elements
DS_REDUCE_BUCKET = 500_000_000            # reduce_bucket_size
DS_ALLGATHER_BUCKET = 500_000_000         # allgather_bucket_size (stages 1 and 2)
DS_PREFETCH_BUCKET = 50_000_000           # stage3_prefetch_bucket_size
FSDP_GATHERED_UNITS = 2                   # the unit computing + the next one prefetched
MAX_WORLD = 65536

# module classes that are layers, not the repeated blocks FSDP wraps one by one
_LEAF_CLASSES = {"Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "Embedding",
                 "LayerNorm", "RMSNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "GroupNorm", "Dropout",
                 "ReLU", "GELU", "SiLU", "Tanh", "Sigmoid", "Softmax", "Identity", "ModuleList", "Sequential",
                 "ModuleDict", "MultiheadAttention", "NonDynamicallyQuantizableLinear", "Flatten",
                 "MaxPool2d", "AvgPool2d", "AdaptiveAvgPool2d", "LeakyReLU", "Mish", "Hardswish",
                 "EmbeddingBag", "LSTM", "GRU", "RNN"}


def normalise_strategy(name: str) -> str:
    key = str(name).strip().lower()
    key = ALIASES.get(key, key)
    if key not in STRATEGIES:
        raise ValueError(f"unknown sharding strategy {name!r} (choose one of: {', '.join(STRATEGIES)})")
    return key


def divisors(strategy: str, world: int, gpus_per_node: int = 8) -> dict[str, int]:
    """How many ranks share each kind of state (1: every rank holds it all)."""
    n = max(1, int(world))
    if strategy == "hybrid":
        n = max(1, min(n, int(gpus_per_node)))
    return {
        "ddp": {"parameters": 1, "gradients": 1, "optimizer_state": 1},
        "zero1": {"parameters": 1, "gradients": 1, "optimizer_state": n},
        "zero2": {"parameters": 1, "gradients": n, "optimizer_state": n},
    }.get(strategy, {"parameters": n, "gradients": n, "optimizer_state": n})


def _div(x: float, n: int) -> int:
    return int(math.ceil(x / n)) if n > 1 else int(x)


# ---------------------------------------------------------------------------------------------------
# what the unsharded run holds

def largest_unit(model: dict | None, psi: int) -> tuple[int, str]:
    """(parameters of the largest FSDP unit, how it was found). The repeated block class (the one an
    auto-wrap policy wraps: a class with two or more instances that is not a layer) divides the
    model; the whole model is one unit when there is none (fully_shard on the root alone)."""
    if not model:
        return psi, "the whole model (no module structure recorded): give --unit-params"
    types = model.get("module_types") or {}
    cls = model.get("cls")
    blocks = [(n, c) for c, n in types.items() if n >= 2 and c not in _LEAF_CLASSES and c != cls]
    largest_layer = 0
    for s in model.get("layer_shapes") or []:
        try:
            largest_layer = max(largest_layer, int(s.get("in", 0)) * int(s.get("out", 0)))
        except (TypeError, ValueError):
            continue
    if blocks:
        n, c = max(blocks)
        unit = max(psi // n, largest_layer)
        return unit, (f"the model divided by its {n} {c} blocks (one unit per block, as an auto-wrap policy "
                      "or fully_shard per block makes them); give --unit-params for another wrapping")
    return psi, "the whole model (no repeated block found): give --unit-params for your wrapping"


def base_from_record(record: dict, persistent: dict | None, world: int) -> dict[str, Any]:
    """The unsharded figures of a run that was sharded, without a replay: the sharded model's own
    sizes (``distributed.fsdp``: parameters and their bytes, unsharded) and the bytes the probe counted
    (``memory.persistent``: the full sizes of FSDP2's DTensors, the local flat shards of FSDP1), scaled
    to the whole model. No phases: the plan has no activations."""
    psi = int(record.get("params") or 0)
    p_full = int(record.get("param_bytes") or 0)
    if psi <= 0 or p_full <= 0:
        raise ValueError("the sharded model's size was not recorded")
    pers = persistent or {}
    seen = int(pers.get("params", 0))
    scale = 1.0
    if seen and world > 1 and abs(seen * world - p_full) <= 0.02 * p_full:
        scale = float(world)                  # the probe counted local shards
    elif seen and abs(seen - p_full) > 0.02 * p_full:
        scale = p_full / seen
    grads = int(pers.get("grads", 0) * scale) or p_full
    opt = int(pers.get("optimizer_state", 0) * scale)
    buffers = int(pers.get("buffers", 0))
    return {"params": p_full + buffers, "grads": grads, "optimizer_state": opt, "psi": psi,
            "param_elem_bytes": p_full / psi, "phases": {}, "set_to_none": True, "batches": []}


def base_from_estimate(est: dict, persistent: dict | None = None, model: dict | None = None,
                       zero_grad_set_to_none: bool | None = None) -> dict[str, Any]:
    """The unsharded figures the sharded plan divides: state bytes, Ψ, and per phase an affine fit
    (in the batch) of the replay's transient memory."""
    pts = sorted((p for p in est.get("points") or [] if p.get("mode", "train") == "train"
                  and p.get("accumulation", 1) == 1), key=lambda p: p["batch"])
    if not pts and est.get("at_target"):
        pts = [est["at_target"]]
    if not pts:
        raise ValueError("the estimate holds no replayed training step")
    cat0 = pts[0].get("categories") or {}
    pers = persistent or {}
    params = int(pers.get("params", 0)) + int(pers.get("buffers", 0)) or int(cat0.get("parameters", 0))
    grads = int(pers.get("grads", 0)) or max(int((p.get("categories") or {}).get("gradients", 0)) for p in pts) \
        or params
    opt = int(pers.get("optimizer_state", 0)) or max(int((p.get("categories") or {}).get("optimizer_state", 0))
                                                     for p in pts)
    # the replay rounds every tensor up to 512-byte blocks: its categories, not the live figures,
    # are what its phase peaks are made of
    r_params = int(cat0.get("parameters", params))
    r_opt = max(int((p.get("categories") or {}).get("optimizer_state", 0)) for p in pts) or opt
    r_grads = max(int((p.get("categories") or {}).get("gradients", 0)) for p in pts) or grads
    psi = int((model or {}).get("params_trainable") or (model or {}).get("params_total") or 0) or params // 4
    set_to_none = True if zero_grad_set_to_none is None else bool(zero_grad_set_to_none)

    def transient(p: dict, phase: str) -> tuple[float, float]:
        """(transient bytes, gradient bytes counted as state) of one phase at one point."""
        peak = (p.get("phase_peaks") or {}).get(phase)
        if peak is None:
            return 0.0, 0.0
        if phase == p.get("peak_phase"):
            c = p.get("categories") or {}
            g = float(c.get("gradients", 0))
            return float(p["peak"]) - c.get("parameters", 0) - c.get("optimizer_state", 0) - g, g
        g = 0.0 if phase == "forward" and set_to_none else (0.0 if phase == "backward" and set_to_none
                                                            else float(r_grads))
        if phase == "optimizer":
            g = float(r_grads)
        return max(0.0, float(peak) - r_params - r_opt - g), g

    phases: dict[str, dict] = {}
    for ph in ("forward", "backward", "optimizer"):
        vals = [(p["batch"], *transient(p, ph)) for p in pts if ph in (p.get("phase_peaks") or {})]
        if not vals:
            continue
        (b0, t0, g0), (b1, t1, g1) = vals[0], vals[-1]
        if ph == "optimizer":
            slope, icpt, how = 0.0, max(t0, t1), "constant (the optimizer's temporaries)"
        elif b1 > b0:
            slope = max(0.0, (t1 - t0) / (b1 - b0))
            icpt = max(0.0, t1 - slope * b1)
            how = f"linear in the batch (replays at {b0} and {b1})"
        else:
            slope, icpt, how = t1 / max(1, b1), 0.0, f"proportional to the batch (one replay, at {b1})"
        phases[ph] = {"slope": slope, "intercept": icpt, "grads_in_state": max(g0, g1) / max(1, r_grads)
                      if r_grads else 0.0, "fit": how,
                      # the replayed batches themselves: used as they are, the fit only between them
                      "points": {str(b): [t, (g / r_grads) if r_grads else 0.0] for b, t, g in vals}}
    return {"params": params, "grads": grads, "optimizer_state": opt, "psi": psi,
            "param_elem_bytes": params / psi if psi else 4.0, "phases": phases,
            "set_to_none": set_to_none, "batches": [p["batch"] for p in pts]}


# ---------------------------------------------------------------------------------------------------
# one rank

def rank_figures(base: dict, strategy: str, world: int, batch: int, *, gpus_per_node: int = 8,
                 mixed: str | None = None, unit_params: int | None = None, facts: dict | None = None,
                 capability=None, buckets: dict | None = None) -> dict[str, Any]:
    """What one rank holds at ``batch`` samples per rank: the state, the peak by phase, the
    communication buffers and the allowances (bytes)."""
    psi = int(base["psi"]) or 1
    div = divisors(strategy, world, gpus_per_node)
    n_shard = div["parameters"] if strategy not in ("zero1", "zero2") else div["optimizer_state"]
    p_full, g_full, o_full = float(base["params"]), float(base["grads"]), float(base["optimizer_state"])
    elem = float(base.get("param_elem_bytes") or 4.0)
    mixed_copies = 0.0
    if mixed in ("bf16", "fp16") and strategy in ("zero1", "zero2", "zero3"):
        # DeepSpeed's 16-bit modes: 2-byte weights and gradients, an fp32 master copy in the optimizer
        master = 4.0 * psi
        o_full = o_full + master
        mixed_copies = _div(master, divisors(strategy, world, gpus_per_node)["optimizer_state"])
        p_full, g_full = 2.0 * psi + max(0.0, p_full - elem * psi), 2.0 * psi
        elem = 2.0
    cdt = 2.0 if mixed in ("bf16", "fp16") else elem       # the dtype the collectives move
    unit = int(unit_params or psi)
    b = dict(buckets or {})
    reduce_b = min(int(b.get("reduce_bucket_size", DS_REDUCE_BUCKET)), psi) * cdt
    gather_b = min(int(b.get("allgather_bucket_size", DS_ALLGATHER_BUCKET)), psi) * cdt
    prefetch_b = min(int(b.get("stage3_prefetch_bucket_size", DS_PREFETCH_BUCKET)), psi) * cdt
    state = {"parameters": _div(p_full, div["parameters"]), "gradients": _div(g_full, div["gradients"]),
             "optimizer_state": _div(o_full, div["optimizer_state"])}
    comm: dict[str, dict[str, int]] = {"forward": {}, "backward": {}, "optimizer": {}}
    many = world > 1
    if strategy == "ddp" and many and (facts or {}).get("ddp_grad_bytes", g_full):
        comm["backward"]["ddp_buckets"] = int(g_full)
    elif strategy in ("zero1", "zero2") and many:
        comm["backward"]["reduce_bucket"] = int(reduce_b)
        comm["optimizer"]["allgather_bucket"] = int(gather_b)
    elif strategy == "zero3" and many:
        comm["forward"]["prefetch_bucket"] = int(prefetch_b)
        comm["forward"]["gathered_unit"] = int(unit * cdt)
        comm["backward"].update(comm["forward"])
        comm["backward"]["reduce_bucket"] = int(reduce_b)
    elif strategy in ("fsdp", "hybrid") and n_shard > 1:
        comm["forward"]["all_gather"] = int(FSDP_GATHERED_UNITS * unit * cdt)
        comm["backward"]["all_gather"] = int(FSDP_GATHERED_UNITS * unit * cdt)
        comm["backward"]["reduce_scatter"] = int(unit * cdt)
    elif strategy == "shard-grad-op" and n_shard > 1:
        comm["forward"]["unsharded_parameters"] = int(psi * cdt)
        comm["backward"]["unsharded_parameters"] = int(psi * cdt)
        comm["backward"]["reduce_scatter"] = int(unit * cdt)
    phases: dict[str, dict] = {}
    for ph, fit in (base.get("phases") or {}).items():
        trans, g_frac = _transient(fit, batch)
        if ph == "optimizer":
            trans = trans / div["optimizer_state"]      # foreach temporaries of the (sharded) parameters
        g_state = state["gradients"] * g_frac
        total = state["parameters"] + state["optimizer_state"] + g_state + trans + sum(comm[ph].values())
        phases[ph] = {"state": int(state["parameters"] + state["optimizer_state"] + g_state),
                      "transient": int(trans), "comm": int(sum(comm[ph].values())), "total": int(total)}
    if not phases:
        # no replay (a sharded run cannot be replayed): the state and the buffers, no activations
        c = max((sum(v.values()) for v in comm.values()), default=0)
        phases["state"] = {"state": int(sum(state.values())), "transient": 0, "comm": int(c),
                           "total": int(sum(state.values()) + c)}
    peak_phase = max(phases, key=lambda k: phases[k]["total"])
    peak = phases[peak_phase]["total"]
    al = allowances({"peak": peak, "mode": "train"}, {k: v for k, v in (facts or {}).items()
                                                       if k != "ddp_grad_bytes"}, capability)
    allocated = peak + sum(v for k, v in al.items() if k not in ("allocator_cache", "cuda_context"))
    device = allocated + al["allocator_cache"] + al["cuda_context"]
    return {"batch": int(batch), "world": int(world), "shard_group": n_shard, "divisors": div,
            "state": state, "state_total": sum(state.values()), "mixed_copies": int(mixed_copies),
            "comm": {k: v for k, v in comm.items() if v}, "comm_peak": max(sum(v.values()) for v in comm.values()),
            "activations_included": bool(base.get("phases")),
            "phases": phases, "peak_phase": peak_phase, "peak": int(peak), "allowances": al,
            "allocated": int(allocated), "device": int(device)}


def _transient(fit: dict, batch: int) -> tuple[float, float]:
    """(transient bytes, share of the gradients counted as state) of one phase at ``batch``: the
    replay's own figure at a replayed batch, else the straight line through the two replayed batches
    nearest to it (the affine fit over all of them when the points are not kept)."""
    pts = {int(b): v for b, v in (fit.get("points") or {}).items()}
    if batch in pts:
        return float(pts[batch][0]), float(pts[batch][1])
    g = float(fit.get("grads_in_state", 1.0))
    if len(pts) >= 2 and fit.get("slope", 0.0) > 0:
        (b0, v0), (b1, v1) = sorted(sorted(pts.items(), key=lambda kv: abs(kv[0] - batch))[:2])
        slope = max(0.0, (v1[0] - v0[0]) / (b1 - b0))
        return max(0.0, v0[0] + slope * (batch - b0)), max(float(v0[1]), float(v1[1]))
    return fit["intercept"] + fit["slope"] * batch, g


def make_sharded_plan(base: dict, strategy: str, world: int | None, batch: int, *, capacity: int | None = None,
                      headroom: float = 0.10, gpus_per_node: int = 8, mixed: str | None = None,
                      unit_params: int | None = None, unit_source: str | None = None,
                      facts: dict | None = None, capability=None, buckets: dict | None = None) -> dict[str, Any]:
    """The ``sharded`` part of ``Evidence.memory_plan``: the rank at ``world`` (or at the world size
    needed when ``world`` is None and there is a capacity), the largest per-rank batch that fits,
    the smallest world size that fits, and how each rank's figure compares with one unsharded GPU."""
    strategy = normalise_strategy(strategy)
    usable = int(capacity * (1 - headroom)) if capacity else None
    kw = dict(gpus_per_node=gpus_per_node, mixed=mixed, unit_params=unit_params, facts=facts,
              capability=capability, buckets=buckets)

    def at(n: int, b: int) -> dict:
        return rank_figures(base, strategy, n, b, **kw)

    notes: list[str] = []
    needed = None
    needed_reason = None
    if usable is not None:
        needed, needed_reason = world_needed(lambda n: at(n, batch)["device"] <= usable, strategy, gpus_per_node)
    if world is None:
        if needed is None:
            raise ValueError("give --world N: " + (needed_reason or "no target device to find the world size for"))
        world = needed
        notes.append(f"no --world given: planned at the smallest world size that fits ({world})")
    rank = at(world, batch)
    single = at(1, batch) if strategy != "ddp" else rank
    out: dict[str, Any] = {
        "strategy": strategy, "label": STRATEGY_LABELS[strategy], "world": int(world),
        "gpus_per_node": int(gpus_per_node), "mixed_precision": mixed, "batch_per_rank": int(batch),
        "global_batch": int(batch) * int(world),
        "unit_params": int(unit_params or base["psi"]), "unit_source": unit_source,
        "psi": int(base["psi"]), "unsharded": {"params": int(base["params"]), "grads": int(base["grads"]),
                                               "optimizer_state": int(base["optimizer_state"])},
        "rank": rank, "one_gpu": {"device": single["device"], "allocated": single["allocated"], "state": single["state"]},
        "capacity": capacity, "headroom": headroom, "usable": usable, "fits": None, "max_batch": None,
        "world_needed": needed, "world_needed_reason": needed_reason,
        "fits_one_gpu": (single["device"] <= usable) if usable is not None else None,
        "phase_fits": {k: v["fit"] for k, v in (base.get("phases") or {}).items()},
        "buckets": {"reduce_bucket_size": int((buckets or {}).get("reduce_bucket_size", DS_REDUCE_BUCKET)),
                    "allgather_bucket_size": int((buckets or {}).get("allgather_bucket_size", DS_ALLGATHER_BUCKET)),
                    "stage3_prefetch_bucket_size": int((buckets or {}).get("stage3_prefetch_bucket_size",
                                                                           DS_PREFETCH_BUCKET))}
        if strategy.startswith("zero") else None,
        "constants": {"cuda_context": CUDA_CONTEXT_BYTES, "allocator_cache_fraction": ALLOCATOR_CACHE_FRACTION,
                      "fsdp_gathered_units": FSDP_GATHERED_UNITS},
        "notes": notes,
    }
    if not rank["activations_included"]:
        notes.append("activations are not included (the run was sharded, and a sharded model cannot be "
                     "replayed): the figures are what each rank holds before its batch, a lower bound")
    if usable is not None and not rank["activations_included"]:
        out["fits"] = rank["device"] <= usable
    elif usable is not None:
        out["fits"] = rank["device"] <= usable
        res = largest_fitting(lambda b: at(world, b)["device"] <= usable, batch, limit=1 << 24)
        out["max_batch"] = res["max"]
        if res["max"] == 0:
            notes.append(f"not even one sample per rank fits at world size {world}: what each rank holds "
                         "before any activation exceeds the device")
    if mixed and strategy in ("fsdp", "hybrid", "shard-grad-op"):
        notes.append(f"FSDP with a {mixed} MixedPrecisionPolicy keeps the sharded parameters, gradients and "
                     f"optimizer state in their own dtype; only the gathered copies are {mixed}")
    return out


def world_needed(fits: Callable[[int], bool], strategy: str, gpus_per_node: int = 8) -> tuple[int | None, str | None]:
    """The smallest world size at which a rank fits (None and why, when no world size does: the
    strategy keeps something whole on every rank)."""
    if strategy == "ddp":
        return (1, None) if fits(1) else (None, "DDP keeps the whole model, its gradients and optimizer state "
                                          "on every rank: more ranks never make it fit; shard it (fsdp, zero3)")
    if not fits(MAX_WORLD):
        what = {"zero1": "ZeRO-1 keeps the parameters and gradients whole on every rank",
                "zero2": "ZeRO-2 keeps the parameters whole on every rank",
                "hybrid": f"HYBRID_SHARD shards within a node only ({gpus_per_node} GPUs)",
                "shard-grad-op": "SHARD_GRAD_OP holds the unsharded parameters from forward to backward"
                }.get(strategy, "the activations of one rank's batch and the gathered units alone exceed "
                                "the device")
        return None, f"no world size fits: {what}"
    lo, hi = 0, 1
    while not fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return hi, None


# ---------------------------------------------------------------------------------------------------
# a sharded run, recognised from its evidence

FSDP_MARKERS = ("FullyShardedDataParallel", "FSDP")


def infer_sharding(ev) -> dict[str, Any] | None:
    """The sharding a run used, from its evidence: the distributed probe's ``distributed.fsdp`` record
    (FSDP2, FSDP1 or a DeepSpeed engine: diag/probe/fsdp.py) or another ``sharding``/``strategy``
    record when there is one, else the model's classes (FSDP2's ``FSDP<Module>``, FSDP1's
    FullyShardedDataParallel wrapper, DeepSpeed's engine). None for an unsharded run.

    Returns ``{"strategy", "world", "source", "record"?, "unit_params"?, "mixed"?, "buckets"?}``."""
    for r in ev.ranks:
        d = r.distributed if isinstance(r.distributed, dict) else {}
        for key in ("fsdp", "sharding", "strategy", "zero"):
            rec = d.get(key)
            if isinstance(rec, dict) and rec:
                return _from_record(rec, key, ev)
            if isinstance(rec, str) and rec:
                try:
                    return {"strategy": normalise_strategy(rec), "world": _world(ev), "source": f"distributed.{key}"}
                except ValueError:
                    pass
    for r in ev.ranks:
        for m in r.models:
            names = list(m.wrappers or []) + [m.cls] + list((m.module_types or {}).keys())
            if any(n.startswith("DeepSpeed") for n in names):
                return {"strategy": "zero3", "world": _world(ev), "source": "a DeepSpeed engine wraps the model "
                        "(stage not recorded: ZeRO-3 assumed)"}
            if any(n == "FullyShardedDataParallel" or (n.startswith("FSDP") and len(n) > 4) for n in names):
                return {"strategy": "fsdp", "world": _world(ev),
                        "source": "the model is wrapped by FSDP (" + ", ".join(
                            sorted({n for n in names if n.startswith("FSDP") or n.startswith("FullySharded")}))[:120]
                        + "); FULL_SHARD assumed"}
    return None


_FSDP1_STRATEGIES = {"FULL_SHARD": "fsdp", "SHARD_GRAD_OP": "shard-grad-op", "HYBRID_SHARD": "hybrid",
                     "_HYBRID_SHARD_ZERO2": "hybrid", "NO_SHARD": "ddp"}


def _from_record(rec: dict, key: str, ev) -> dict[str, Any]:
    api = str(rec.get("api") or "")
    out: dict[str, Any] = {"world": int(rec.get("shard_world") or 0) or _world(ev), "source": f"distributed.{key}",
                           "record": {k: rec.get(k) for k in ("api", "units", "params", "param_bytes", "zero_stage",
                                                              "sharding_strategy", "shard_world")}}
    name = rec.get("strategy") or rec.get("kind") or rec.get("name")
    stage = rec.get("zero_stage") if rec.get("zero_stage") is not None else rec.get("stage")
    if api == "deepspeed" or (stage is not None and not name):
        s = int(stage or 0)
        out["strategy"] = f"zero{s}" if s in (1, 2, 3) else "ddp"
        out["source"] += f" (DeepSpeed ZeRO stage {s})"
        out["buckets"] = {k: int(float(rec[k])) for k in ("reduce_bucket_size", "allgather_bucket_size",
                                                          "stage3_prefetch_bucket_size")
                          if isinstance(rec.get(k), (int, float)) and rec.get(k)}
    elif api == "fsdp1" or rec.get("sharding_strategy"):
        strat = str(rec.get("sharding_strategy") or "FULL_SHARD").split(".")[-1]
        out["strategy"] = _FSDP1_STRATEGIES.get(strat, "fsdp")
        out["source"] += f" (FSDP1 {strat})"
    elif api == "fsdp2":
        units = [u for u in rec.get("unit_list") or [] if not u.get("root")]
        keeps = units and not any(u.get("reshard_after_forward") for u in units)
        out["strategy"] = "shard-grad-op" if keeps else "fsdp"
        out["source"] += " (FSDP2 fully_shard" + (", reshard_after_forward=False on every unit)" if keeps else ")")
    else:
        try:
            out["strategy"] = normalise_strategy(str(name)) if name else "fsdp"
        except ValueError:
            out["strategy"] = "fsdp"
    sizes = [int(u.get("numel") or 0) for u in rec.get("unit_list") or []]
    if sizes and max(sizes) > 0:
        out["unit_params"] = max(sizes)
    mp = rec.get("mixed_precision") or {}
    if isinstance(mp, dict):
        text = " ".join(str(v) for v in mp.values()).lower()
        if mp.get("bf16") is True or "bfloat16" in text:
            out["mixed"] = "bf16"
        elif mp.get("fp16") is True or "float16" in text:
            out["mixed"] = "fp16"
    return out


def _world(ev) -> int:
    sizes = [r.world_size for r in ev.ranks if r.world_size]
    return max(sizes) if sizes else max(1, len(ev.ranks))
