"""Checks for sharded training (FSDP2 ``fully_shard``, FSDP1 ``FullyShardedDataParallel``): the
communication a step waits for, FSDP's mixed-precision policy, CPU offload. Pure functions of
Evidence: the distributed probe extension records every collective the step calls (all-gather,
reduce-scatter, all-reduce, broadcast), the time the step's thread spent in it or waiting for it
(``extra.comm_wait_s``, per kind in ``extra.comm``), on the device clock where CUDA events were
recorded (``distributed.comm_device``), and FSDP's configuration (``distributed.fsdp``); see
docs/distributed.md."""
from __future__ import annotations

from diag.checks.api import Severity, check, fmt_bytes, knob_words, median, run_framework

from ._perf import cap_str, capability
from ._util import gib, ms, pct
from ._workers import host_contention

FSDP2_DOCS = "https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html"
FSDP1_DOCS = "https://pytorch.org/docs/stable/fsdp.html"

# sharded.exposed-comm: the communication the step waits for, as a share of the step. torch-tb-profiler
# flags communication above 10% of the step (docs/reference rules: "comm share"); this check counts
# only the exposed part (not hidden behind compute), so 10% of the step is time the job loses outright.
EXPOSED_WARN = 0.10
CONTENDED_WARN = 0.50     # on a contended host (host.contention) a share below 50% is an info: with every core
                          # busy a collective waits for the other rank to be scheduled (the healthy corpus job,
                          # 0.8 ms bare all-gathers, showed 22-32% on the loaded 2-core VM)
SKEW_INFO = 0.10          # a rank waiting >= 10% of the step for the last rank to arrive: said (info)
MIN_STEPS = 3
# an all-gather under 1 MiB is latency-bound: at NVLink/InfiniBand rates (25-450 GB/s) 1 MiB moves in
# 2-40 us, the order of one collective's fixed launch and synchronisation cost (NCCL: ~10-30 us)
SMALL_MESSAGE = 1 << 20
MANY_GATHERS = 16         # all-gathers + reduce-scatters per step from which their count is worth naming (an
                          # 8-block model wrapped per block runs ~24: 8 gathers forward, 8 backward, 8 reductions)
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "barrier", "all_to_all", "other")
KIND_NAMES = {"all_gather": "all-gather", "reduce_scatter": "reduce-scatter", "all_reduce": "all-reduce",
              "broadcast": "broadcast", "barrier": "barrier", "all_to_all": "all-to-all", "other": "other"}
CAUSE_KNOBS = {"small_units": "fsdp.unit-size", "no_prefetch": "fsdp.prefetch", "no_forward_prefetch": "fsdp.prefetch"}
API_NAMES = {"fsdp2": "FSDP2", "fsdp1": "FSDP1", "deepspeed": "DeepSpeed ZeRO"}
OFFLOAD_FIT = 0.85        # CPU offload judged unneeded when the state it moves fits in 85% of the device


def fsdp_config(ev) -> dict | None:
    """The sharded model's configuration as the first rank that recorded one saw it."""
    for r in ev.ranks:
        f = r.distributed.get("fsdp") if r.distributed else None
        if isinstance(f, dict) and f.get("api"):
            return f
    return None


def _multi(ev) -> bool:
    return len(ev.ranks) > 1 or any(r.world_size > 1 for r in ev.ranks)


def rank_comm(r, skip_warmup: int | None = None) -> dict | None:
    """A rank's communication per step, over its timed steps: the median step and exposed wait, and
    per kind the mean calls, exposed seconds and bytes per step; the device clock's exposed wait
    when CUDA events were recorded."""
    steps = r.timed_steps(skip_warmup)
    if not steps:
        return None
    n = len(steps)
    kinds: dict[str, list] = {}
    for s in steps:
        for kind, v in ((s.extra or {}).get("comm") or {}).items():
            if isinstance(v, (list, tuple)) and len(v) >= 3:
                k = kinds.setdefault(kind, [0.0, 0.0, 0.0])
                k[0] += v[0]
                k[1] += v[1]
                k[2] += v[2]
    out = {"n": n, "total_s": median([s.total_s for s in steps]),
           "wait_s": median([float((s.extra or {}).get("comm_wait_s") or 0.0) for s in steps]),
           "kinds": {k: {"calls": v[0] / n, "s": v[1] / n, "bytes": v[2] / n} for k, v in kinds.items()},
           "clock": "host"}
    dev = [d for d in (r.distributed.get("comm_device") or []) if isinstance(d, dict)]
    indices = {s.index for s in steps}
    dev = [d for d in dev if d.get("step") in indices] or dev[1:]
    if len(dev) >= MIN_STEPS:
        out["device_wait_s"] = median([float(d.get("exposed_s") or 0.0) for d in dev])
        out["clock"] = "device"
    return out


def _exposed(c: dict) -> float:
    """The exposed wait on the clock that sees it: the device's where it was measured (a CUDA
    collective returns to the host at once; the compute stream is what waits), the host's else."""
    return max(c.get("device_wait_s", 0.0), c["wait_s"]) if c.get("clock") == "device" else c["wait_s"]


def _gbps(nbytes: float, s: float) -> float | None:
    return nbytes / s / 1e9 if s > 0 and nbytes > 0 else None


def _causes(cfg: dict | None, kinds: dict, on_gpu: bool, backend: str | None) -> list[dict]:
    """The likely causes, strongest first: each {cause, text, fix, snippet}."""
    out = []
    api = (cfg or {}).get("api")
    ag = kinds.get("all_gather") or {}
    rs = kinds.get("reduce_scatter") or {}
    calls = ag.get("calls", 0.0) + rs.get("calls", 0.0)
    moved = ag.get("bytes", 0.0) + rs.get("bytes", 0.0)
    mean = moved / calls if calls else 0.0
    units = (cfg or {}).get("units")
    if calls >= MANY_GATHERS and mean < SMALL_MESSAGE:
        text = (f"too small units: {ag.get('calls', 0):.0f} all-gathers and {rs.get('calls', 0):.0f} reduce-scatters per step, "
                f"{mean / 1024:.1f} KiB each on average" + (f", {units} sharded units" if units else "")
                + ": each collective pays a fixed latency that its few bytes do not amortise")
        if api == "deepspeed":
            fix = ("Make ZeRO's collectives larger: raise reduce_bucket_size and stage3_prefetch_bucket_size, and "
                   "stage3_param_persistence_threshold so that small parameters stay whole on every rank "
                   "instead of being gathered one by one (DeepSpeed config, zero_optimization).")
            snippet = ('"zero_optimization": {"stage": 3, "overlap_comm": true, "reduce_bucket_size": 5e8,\n'
                       '                      "stage3_prefetch_bucket_size": 5e8, "stage3_param_persistence_threshold": 1e6}')
        elif api == "fsdp1":
            fix = ("Wrap larger units: give FullyShardedDataParallel an auto_wrap_policy that wraps whole blocks "
                   "(ModuleWrapPolicy({Block}) or size_based_auto_wrap_policy with a larger min_num_params), not every "
                   "layer. Accelerate: fsdp_config's fsdp_transformer_layer_cls_to_wrap / fsdp_min_num_params.")
            snippet = ("from torch.distributed.fsdp.wrap import ModuleWrapPolicy\n"
                       "model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({Block}))   # one unit per block")
        else:
            fix = ("Call fully_shard on whole blocks (each transformer block, then the root), not on every layer: "
                   "one all-gather then brings a block's parameters at once. Accelerate: fsdp_config's "
                   "fsdp_transformer_layer_cls_to_wrap.")
            snippet = "for block in model.blocks:\n    fully_shard(block)\nfully_shard(model)"
        out.append({"cause": "small_units", "text": text, "fix": fix, "snippet": snippet,
                    "mean_bytes": int(mean), "calls_per_step": round(calls, 1)})
    if not on_gpu:
        out.append({"cause": "no_overlap_on_cpu",
                    "text": f"the collectives run on CPU tensors ({backend or 'gloo'}): each one blocks the training "
                            "thread, so none of it can hide behind compute",
                    "fix": "On a CPU job, fewer and larger collectives are the lever (larger units, a larger batch per "
                           "rank to amortise them); FSDP's prefetch and DeepSpeed's overlap_comm overlap communication "
                           "only on GPUs.",
                    "snippet": None})
        return out
    if api == "deepspeed":
        if (cfg or {}).get("overlap_comm") is False:
            out.append({"cause": "no_prefetch", "text": "DeepSpeed's overlap_comm is off: ZeRO's reductions and gathers "
                        "run in line with the backward instead of beside it",
                        "fix": "Turn on overlap_comm in the DeepSpeed config (zero_optimization).",
                        "snippet": '"zero_optimization": {"stage": %s, "overlap_comm": true}' % (cfg.get("zero_stage") or 3)})
    elif api == "fsdp1":
        if not (cfg or {}).get("backward_prefetch") or (cfg or {}).get("backward_prefetch") == "None":
            out.append({"cause": "no_prefetch", "text": "FSDP's backward prefetch is off (backward_prefetch=None): "
                        "each unit's all-gather in the backward starts only when its gradient is needed",
                        "fix": "Prefetch the next unit's parameters during the backward (and the forward).",
                        "snippet": "FSDP(model, backward_prefetch=BackwardPrefetch.BACKWARD_PRE, forward_prefetch=True)"})
        elif not (cfg or {}).get("forward_prefetch"):
            out.append({"cause": "no_forward_prefetch", "text": "forward_prefetch is off: the next unit's all-gather "
                        "is issued only after the current unit's forward (in a CPU-bound loop, too late to overlap)",
                        "fix": "Turn on forward prefetch.", "snippet": "FSDP(model, ..., forward_prefetch=True)"})
    elif api == "fsdp2":
        if (cfg or {}).get("last_unit_reshards"):
            out.append({"cause": "reshard_last", "text": f"the last unit ({cfg.get('last_unit')}) frees its parameters "
                        "after the forward and all-gathers them again at once for the backward",
                        "fix": "Keep the last block's parameters through to its backward.",
                        "snippet": "fully_shard(model.blocks[-1], reshard_after_forward=False)"})
        if not (cfg or {}).get("explicit_forward_prefetch"):
            out.append({"cause": "no_prefetch", "text": "no explicit prefetch: each unit's all-gather is issued when "
                        "its forward starts, which in a CPU-bound loop leaves nothing to overlap it with",
                        "fix": "Prefetch the next block's all-gather while this one computes.",
                        "snippet": "blocks = list(model.blocks)\nfor a, b in zip(blocks, blocks[1:]):\n"
                                   "    a.set_modules_to_forward_prefetch([b])\n    b.set_modules_to_backward_prefetch([a])"})
    if mean >= SMALL_MESSAGE:
        bw = _gbps(moved, ag.get("s", 0.0) + rs.get("s", 0.0))
        out.append({"cause": "bandwidth", "text": f"large messages ({fmt_bytes(mean)} on average) moved at "
                    f"{bw:.1f} GB/s while exposed" if bw else f"large messages ({fmt_bytes(mean)} on average)",
                    "fix": "If that rate is below your interconnect's (NVLink hundreds of GB/s, InfiniBand 25-50 GB/s, "
                           "Ethernet 1-10 GB/s), check NCCL's transport (NCCL_DEBUG=INFO: NET/IB, not Socket); "
                           "a MixedPrecisionPolicy with bf16 params halves the bytes.", "snippet": None})
    return out


@check(id="sharded.exposed-comm", title="The step waits for communication", severity="warning",
       needs=["ranks.steps", "ranks.distributed.comm", "ranks.distributed.fsdp"],
       tags=["distributed", "performance", "fsdp"], docs=FSDP2_DOCS)
def exposed_comm(ctx):
    """In a sharded run (FSDP2 ``fully_shard``, FSDP1, DeepSpeed ZeRO) each unit's parameters are all-gathered before
    its forward and backward and its gradients reduce-scattered after; the time the step's thread
    (or, on a GPU, the compute stream: CUDA events) waits for them is *exposed* communication.
    Per rank the median exposed wait per step; the smallest over the ranks is the communication
    itself (the last rank to arrive waits least), the rest of a rank's wait is waiting for a later
    rank (named, an info: ``distributed.straggler`` judges the late rank). Warning when the
    communication itself is >= 10% of the step (torch-tb-profiler's communication threshold); on a
    contended host (``host.contention``) a share under 50% is an info, and so is a CPU job whose only
    cause is that gloo's collectives cannot overlap compute (no setting hides them there). Names the likely cause: too
    small units (many all-gathers under 1 MiB), collectives that cannot overlap (CPU tensors), no
    prefetch or the last unit resharding or ``overlap_comm`` off (GPU), large messages at a low rate;
    the fix is in FSDP2's, FSDP1's, Accelerate's or the DeepSpeed config's words."""
    ev = ctx.evidence
    cfg = fsdp_config(ev)
    if cfg is None:
        yield ctx.skip("No sharded model (FSDP2 fully_shard, FSDP1 or a DeepSpeed engine) was seen in this run.")
        return
    if not _multi(ev):
        yield ctx.skip("Single-process run: FSDP shards over one rank and communicates nothing.")
        return
    per = {}
    short = []
    for r in ev.ranks:
        c = rank_comm(r)
        if c is None or c["n"] < MIN_STEPS:
            short.append(f"rank {r.rank}: {0 if c is None else c['n']}")
            continue
        per[r.rank] = c
    if not per:
        yield ctx.skip(f"Too few timed steps ({', '.join(short)}; {MIN_STEPS} per rank needed).")
        return
    step = median([c["total_s"] for c in per.values()])
    if step <= 0:
        yield ctx.skip("The measured step time is zero.")
        return
    waits = {k: _exposed(c) for k, c in per.items()}
    floor_rank = min(waits, key=lambda k: waits[k])
    floor = waits[floor_rank]
    worst_rank = max(waits, key=lambda k: waits[k])
    share = floor / step
    skew = waits[worst_rank] - floor
    kinds = per[floor_rank]["kinds"]
    clock = per[floor_rank]["clock"]
    on_gpu = "cuda" in (cfg.get("devices") or []) or clock == "device"
    backend = next((r.distributed.get("backend") for r in ev.ranks if r.distributed.get("backend")), None)
    by_kind = {k: round(v["s"], 6) for k, v in kinds.items()}
    numbers = {"api": cfg.get("api"), "units": cfg.get("units"), "clock": clock, "step_s": round(step, 6),
               "exposed_s": round(floor, 6), "share": round(share, 4), "ranks": len(per),
               "per_rank_wait_s": {str(k): round(v, 6) for k, v in sorted(waits.items())},
               "exposed_by_kind_s": by_kind, "backend": backend,
               "calls_per_step": {k: round(v["calls"], 1) for k, v in kinds.items()},
               "bytes_per_step": {k: int(v["bytes"]) for k, v in kinds.items()}}
    detail = ", ".join(f"{KIND_NAMES.get(k, k)} {ms(v['s'])} ({v['calls']:.0f} calls, {fmt_bytes(v['bytes'])})"
                       for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]["s"]) if v["calls"])
    late = floor_rank
    skewed = len(per) > 1 and skew / step >= SKEW_INFO
    if skewed:
        numbers.update(waiting_rank=worst_rank, late_rank=late, waiting_for_late_s=round(skew, 6),
                       waiting_share=round(skew / step, 4))
    if share < EXPOSED_WARN:
        if skewed:
            yield ctx.finding(
                severity=Severity.INFO, title="A rank waits in collectives for a later one",
                message=(f"Rank {worst_rank} waits {ms(waits[worst_rank])} per step in {API_NAMES.get(cfg.get('api'), 'the')}'s collectives "
                         f"({pct(waits[worst_rank] / step)} of the {ms(step)} step), {ms(skew)} of it for rank {late}, "
                         f"which arrives last; the communication itself takes {ms(floor)} ({pct(share)}).")
                        + (f" Per step on rank {late}: {detail}." if detail else ""),
                evidence=numbers,
                why="A collective finishes when the last rank joins it: the others' wait is the late rank's extra "
                    "work, not the network (distributed.straggler names the phase).",
                fix=f"Make rank {late} as fast as the others (see distributed.straggler's finding).")
            return
        yield ctx.passed(f"Exposed communication is {ms(floor)} of the {ms(step)} step ({pct(share)}) on the "
                         f"{clock} clock" + (f": {detail}" if detail else "") + ".",
                         title="Communication is mostly hidden or small", **numbers)
        return
    causes = _causes(cfg, kinds, on_gpu, backend)
    first = causes[0] if causes else None
    numbers["causes"] = [c["cause"] for c in causes]
    if first and first.get("mean_bytes") is not None:
        numbers["mean_bytes_per_call"] = first["mean_bytes"]
    ag = kinds.get("all_gather") or {}
    bw = _gbps(ag.get("bytes", 0.0), ag.get("s", 0.0))
    if bw:
        numbers["all_gather_gbps"] = round(bw, 3)
    sev = Severity.WARNING
    contention = host_contention(ev) if share < CONTENDED_WARN else None
    msg = (f"The step waits {ms(floor)} for communication per step: {pct(share)} of the {ms(step)} step on the "
           f"{clock} clock (the least any rank waits)" + (f"; {detail}" if detail else "") + ".")
    if first:
        msg += f" Likely cause: {first['text']}."
    if len(causes) > 1:
        msg += " Also: " + "; ".join(c["text"] for c in causes[1:3]) + "."
    if skewed:
        msg += (f" Rank {worst_rank} waits a further {ms(skew)} per step for rank {late}, which arrives last at the "
                "collectives (distributed.straggler names its slow phase).")
    fix = first["fix"] if first else "Overlap or shrink the communication: larger units, prefetch, bf16 parameters."
    snippet = first["snippet"] if first else None
    framework = run_framework(ev)
    knob = CAUSE_KNOBS.get(first["cause"]) if first else None
    if knob and framework and cfg.get("api") != "deepspeed":
        # the framework built the FSDP wrapping: its setting is the lever, in its words
        fix, snippet, _ = knob_words(knob, framework)
        numbers.update(knob=knob, framework=framework)
    if first and first["cause"] == "no_overlap_on_cpu":
        # a CPU job whose collectives are not many and small: gloo's collectives block the training thread
        # and nothing in FSDP's or DeepSpeed's settings overlaps them on CPU, so the share is what a CPU
        # run of this job costs, not a setting to change (a healthy 2-rank FSDP2 job: 22-35%, a warning
        # on a quiet host and an info on a loaded one before this)
        sev = Severity.INFO
        numbers["actionable"] = False
    if contention and contention.get("contended"):
        sev = Severity.INFO
        numbers["host_contention"] = contention
        msg += (f" The host was contended ({contention['host_cpu_percent']:g}% of {contention['cpus']} CPUs busy): "
                "every collective hands off between processes, so a share this size can be the host's scheduling.")
        fix = "Measure again on a host the job does not share. " + fix
    numbers["bound_gain_s"] = round(max(floor, 0.0), 6)
    yield ctx.finding(
        severity=sev, message=msg, evidence=numbers,
        why=f"Exposed communication adds to every step: hiding or removing it would make the step up to "
            f"{pct(share)} shorter ({ms(floor)} of {ms(step)}: the bound, if all of it overlapped compute).",
        fix=fix, snippet=snippet)


def _training_on_cuda(ev, cfg) -> bool:
    return "cuda" in (cfg.get("devices") or []) or any(
        str(d).startswith("cuda") for r in ev.ranks for m in r.models for d in (m.devices or []))


def _gpu(ev):
    devs = [d for d in ev.environment.devices or [] if getattr(d, "type", "cuda") == "cuda"]
    return devs[0] if devs else None


@check(id="sharded.mixed-precision", title="FSDP without a mixed-precision policy", severity="warning",
       needs=["ranks.distributed.fsdp", "environment.devices"], tags=["distributed", "fsdp", "amp"], docs=FSDP2_DOCS)
def mixed_precision(ctx):
    """A sharded model whose parameters are fp32 and whose FSDP has no mixed-precision policy
    (FSDP2 ``MixedPrecisionPolicy``, FSDP1 ``MixedPrecision``, DeepSpeed ``bf16``) on a GPU with bf16 (compute
    capability >= 8.0): every all-gather and reduce-scatter moves fp32, twice the bytes of bf16,
    and the unsharded parameters take twice the memory. Warning when the exposed communication is
    >= 10% of the step (halving its bytes is then worth it), info below. Skipped on CPU runs (bf16
    there saves bytes but the collectives are not the GPU's) and without bf16 support."""
    ev = ctx.evidence
    cfg = fsdp_config(ev)
    if cfg is None:
        yield ctx.skip("No sharded model (FSDP2 fully_shard, FSDP1 or a DeepSpeed engine) was seen in this run.")
        return
    if not _training_on_cuda(ev, cfg):
        yield ctx.skip("The sharded model trains on the CPU: the mixed-precision policy is judged on GPUs only.")
        return
    dev = _gpu(ev)
    cap = capability(dev) if dev is not None else None
    if cap is None or cap < (8, 0):
        yield ctx.skip(f"The GPU (compute capability {cap_str(cap)}) has no bf16 tensor cores (8.0 and later).")
        return
    dtypes = set(cfg.get("param_dtypes") or [])
    if cfg.get("mixed_precision") or dtypes - {"float32"}:
        yield ctx.passed("FSDP gathers and reduces in reduced precision "
                         f"({cfg.get('mixed_precision') or ', '.join(sorted(dtypes))}).",
                         title="FSDP has a mixed-precision policy", api=cfg.get("api"))
        return
    share = None
    waits, steps = [], []
    for r in ev.ranks:
        c = rank_comm(r)
        if c and c["n"] >= MIN_STEPS:
            waits.append(_exposed(c))
            steps.append(c["total_s"])
    if waits and median(steps) > 0:
        share = min(waits) / median(steps)
    sev = Severity.WARNING if share is not None and share >= EXPOSED_WARN else Severity.INFO
    numbers = {"api": cfg.get("api"), "param_bytes": cfg.get("param_bytes"), "device": dev.name,
               "capability": cap_str(cap), "exposed_comm_share": round(share, 4) if share is not None else None}
    if cfg.get("api") == "deepspeed":
        fix = "Turn on bf16 in the DeepSpeed config: ZeRO then keeps bf16 parameters and gradients (fp32 master weights)."
        snippet = '"bf16": {"enabled": true}'
    elif cfg.get("api") == "fsdp1":
        fix = "Give FSDP a MixedPrecision policy (bf16 parameters, reductions and buffers)."
        snippet = ("from torch.distributed.fsdp import MixedPrecision\n"
                   "FSDP(model, mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16,"
                   " buffer_dtype=torch.bfloat16))")
    else:
        fix = "Pass a MixedPrecisionPolicy to every fully_shard call (bf16 parameters; fp32 reductions if you prefer)."
        snippet = ("from torch.distributed.fsdp import MixedPrecisionPolicy\n"
                   "mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)\n"
                   "for block in model.blocks:\n    fully_shard(block, mp_policy=mp)\nfully_shard(model, mp_policy=mp)")
    if cfg.get("api") != "deepspeed":
        fix += " Accelerate: mixed_precision: bf16 in the config (fsdp_config applies it to FSDP)."
    share_txt = f"; exposed communication is {pct(share)} of the step" if share is not None else ""
    yield ctx.finding(
        severity=sev,
        message=(f"The {API_NAMES.get(cfg.get('api'), cfg.get('api'))} model's {gib(cfg.get('param_bytes') or 0)} of fp32 parameters are "
                 f"all-gathered and their gradients reduce-scattered in fp32 on {dev.name} (compute capability "
                 f"{cap_str(cap)}, bf16-capable){share_txt}."),
        evidence=numbers,
        why="bf16 halves the bytes of every all-gather and reduce-scatter and the memory of the unsharded "
            "parameters, and runs the matmuls on tensor cores; FSDP keeps an fp32 copy of the sharded parameters "
            "for the optimizer either way. The gain rests on the bytes halving; the time saved is at most half the "
            "exposed communication plus what bf16 compute saves (amp.unused prices that part).",
        fix=fix, snippet=snippet)


_OPT_STATES = {"Adam": 2, "AdamW": 2, "NAdam": 2, "RAdam": 2, "Adamax": 2, "Adagrad": 1, "RMSprop": 1,
               "SGD": 1, "Adafactor": 1}   # optimizer-state tensors per parameter (SGD: momentum, counted)


@check(id="sharded.cpu-offload", title="CPU offload on a job that fits without it", severity="warning",
       needs=["ranks.distributed.fsdp", "ranks.distributed.memory", "ranks.optimizers", "environment.devices"],
       tags=["distributed", "fsdp", "memory"], docs=FSDP2_DOCS)
def cpu_offload(ctx):
    """FSDP offloads parameters (and gradients, optimizer state) to the CPU (FSDP2
    ``CPUOffloadPolicy``, FSDP1 ``CPUOffload(offload_params=True)``, DeepSpeed ``offload_param`` /
    ``offload_optimizer``): every step then copies
    parameters to the GPU and gradients back, and the optimizer steps on the CPU. Warning when the
    state it moves would fit on the device: this rank's sharded parameters, gradients and optimizer
    state (parameter bytes x (2 + optimizer-state tensors) / shard world size) plus the peak the
    device reached with offload on, under 85% of the device's memory. Skipped on CPU runs."""
    ev = ctx.evidence
    cfg = fsdp_config(ev)
    if cfg is None:
        yield ctx.skip("No sharded model (FSDP2 fully_shard, FSDP1 or a DeepSpeed engine) was seen in this run.")
        return
    if not cfg.get("offload"):
        yield ctx.passed("FSDP keeps parameters on the device (no CPU offload).", title="No CPU offload", api=cfg.get("api"))
        return
    dev = _gpu(ev)
    if dev is None or not ev.environment.cuda_available:
        yield ctx.skip("CPU offload was configured but the run has no GPU: there is nothing to offload from.")
        return
    total = dev.total_memory
    peaks = []
    for r in ev.ranks:
        mem = r.distributed.get("memory") or {}
        p = mem.get("peak_allocated_bytes")
        if isinstance(p, (int, float)) and p > 0:
            peaks.append(int(p))
        total = total or mem.get("total_bytes")
    if not peaks or not total:
        yield ctx.skip("The per-rank device peak (or the device's memory) was not recorded.")
        return
    opt = ev.primary.optimizers[0].cls if ev.primary.optimizers else None
    states = _OPT_STATES.get(opt or "", 2)
    world = cfg.get("shard_world") or max(r.world_size for r in ev.ranks) or 1
    state_bytes = int((cfg.get("param_bytes") or 0) * (2 + states) / max(int(world), 1))
    need = max(peaks) + state_bytes
    numbers = {"api": cfg.get("api"), "offload": cfg.get("offload"), "param_bytes": cfg.get("param_bytes"),
               "optimizer": opt, "optimizer_states": states, "shard_world": world, "moved_state_bytes": state_bytes,
               "peak_bytes": max(peaks), "estimate_bytes": need, "device_bytes": int(total), "device": dev.name}
    if need > OFFLOAD_FIT * total:
        yield ctx.passed(f"Without offload this rank would need about {gib(need)} of {gib(total)}: offload is "
                         "what makes it fit.", title="CPU offload is needed", **numbers)
        return
    if cfg.get("api") == "deepspeed":
        snippet = '"zero_optimization": {"offload_param": {"device": "none"}, "offload_optimizer": {"device": "none"}}'
    elif cfg.get("api") == "fsdp1":
        snippet = "FSDP(model, cpu_offload=CPUOffload(offload_params=False))   # or leave cpu_offload unset"
    else:
        snippet = "fully_shard(module)   # no offload_policy=CPUOffloadPolicy()"
    fix = "Turn CPU offload off" + (" in the DeepSpeed config (zero_optimization)." if cfg.get("api") == "deepspeed"
                                    else " (Accelerate: fsdp_offload_params: false in fsdp_config).")
    framework = run_framework(ev)
    if framework and cfg.get("api") != "deepspeed":
        fix, snippet, _ = knob_words("fsdp.cpu-offload", framework)
        numbers.update(knob="fsdp.cpu-offload", framework=framework)
    yield ctx.finding(
        severity=Severity.WARNING,
        message=(f"FSDP offloads to the CPU, but this rank's sharded parameters, gradients and {opt or 'optimizer'} state "
                 f"({gib(state_bytes)}) plus its measured peak ({gib(max(peaks))}) come to about {gib(need)}, "
                 f"{pct(need / total)} of {dev.name}'s {gib(total)}."),
        evidence=numbers,
        why="Offload copies every unit's parameters host-to-device before use and gradients back after, and runs "
            "the optimizer step on the CPU: time the step pays only to save memory this job does not need. The "
            "estimate counts fp32 state as the model holds it; activations are inside the measured peak.",
        fix=fix, snippet=snippet)
