"""Multi-process checks: stragglers, memory imbalance between ranks, the collective backend, ranks
sharing a device. Pure functions of Evidence (one RankEvidence per rank; see docs/distributed.md)."""
from __future__ import annotations

from diag.checks.api import Severity, check, device_phases, median

from ._util import gib, ms, pct
from ._workers import host_contention

DOCS = "https://pytorch.org/docs/stable/notes/ddp.html"
DDP_TUTORIAL = "https://pytorch.org/tutorials/intermediate/ddp_tutorial.html"
BACKENDS = "https://pytorch.org/docs/stable/distributed.html#which-backend-to-use"

# distributed.straggler: a rank's phase, beyond the median of the other ranks, as a share of the
# median step time. TraceML: straggler score >= 0.10 warning, >= 0.20 critical.
STRAGGLER_WARN = 0.10
STRAGGLER_ERROR = 0.20
STRAGGLER_RATIO = 1.25      # and the phase at least 25% longer than on the other ranks
MIN_STEPS = 3               # timed steps per rank needed to judge

# distributed.memory-imbalance: (max - min) / max of per-rank peak memory. TraceML: 20% warn, 30% critical.
SKEW_WARN = 0.20
SKEW_ERROR = 0.30
SKEW_MIN_BYTES = 128 << 20  # differences below 128 MiB are not judged (allocator and library noise)

PHASES = (("data_s", "data wait"), ("forward_s", "forward"), ("backward_s", "backward"),
          ("optimizer_s", "optimizer step"), ("other_s", "other work"))


def _multi(ev) -> bool:
    return len(ev.ranks) > 1 or any(r.world_size > 1 for r in ev.ranks)


def _host(r) -> str:
    return r.host or "unknown host"


def _who(r) -> str:
    return f"rank {r.rank} ({_host(r)})"


def _comm_measured(r) -> bool:
    return bool(r.distributed.get("comm")) or any("comm_wait_s" in s.extra for s in r.steps)


def _sharded_api(ev) -> str | None:
    """``fsdp2`` / ``fsdp1`` when a rank recorded a sharded model (distributed.fsdp), else None."""
    for r in ev.ranks:
        f = r.distributed.get("fsdp") if r.distributed else None
        if isinstance(f, dict) and f.get("api"):
            return str(f["api"])
    return None


def _async_loading(r) -> bool:
    """Does the rank's main DataLoader (the one with most batches) load in worker processes?"""
    if not r.dataloaders:
        return False
    return max(r.dataloaders, key=lambda d: d.batches).num_workers > 0


def rank_phases(r, skip_warmup: int | None = None, device: bool = False) -> dict | None:
    """Medians over a rank's timed steps of each phase, its collective wait and its batch size; with
    ``device``, the phases on the device clock (CUDA events) where the rank recorded a timeline."""
    steps = r.timed_steps(skip_warmup)
    if not steps:
        return None
    dev = device_phases(r, skip_warmup) if device else None
    out = {name: median([getattr(s, name) for s in steps]) for name, _ in PHASES}
    out["total_s"] = median([s.total_s for s in steps])
    if dev is not None:
        out.update({k: dev[k] for k in ("data_s", "forward_s", "backward_s", "optimizer_s", "other_s", "total_s")})
    out["clock"] = "device" if dev is not None else "host"
    out["comm_wait_s"] = median([float(s.extra.get("comm_wait_s", 0.0) or 0.0) for s in steps])
    sizes = [s.samples for s in steps if s.samples]
    out["samples"] = median(sizes) if sizes else None
    out["n"] = len(steps)
    return out


# ---------------------------------------------------------------------------------------------------

@check(id="distributed.straggler", title="One rank holds the others back", severity="warning",
       needs=["ranks.steps", "ranks.host", "ranks.distributed.comm"], tags=["distributed", "performance"],
       docs=DOCS)
def straggler(ctx):
    """Under DDP every rank waits for the slowest one in the gradient all-reduce (under FSDP in each
    unit's all-gather and reduce-scatter), so the step totals come out equal: the straggler shows in
    its own phases, the waiting having been taken out of the others' (``comm_wait_s``). For each rank and
    phase (data wait, forward, backward, optimizer step, other work) the median over the timed
    steps is compared with the median of the other ranks. A rank is a straggler when a phase is at
    least 25% longer there and the difference is >= 10% of the median step time (warning) or >= 20%
    (error), the TraceML straggler-score thresholds. Names the rank, its host and the phase; the
    other ranks' measured collective wait corroborates it. "Other work" is judged only where the
    collective wait was measured (otherwise it contains the wait itself). On a host the job shares with
    other work (``host.contention``), a warning-sized difference is an info: it can be how the host
    scheduled one rank."""
    ev = ctx.evidence
    if not _multi(ev):
        yield ctx.skip("Single-process run: there is no other rank to compare with.")
        return
    if len(ev.ranks) < 2:
        yield ctx.skip(f"Only rank {ev.ranks[0].rank} of {ev.ranks[0].world_size} was observed "
                                  "(merge the other nodes' evidence with --from to compare ranks).")
        return
    phases = {}
    short = []
    on_device = all(device_phases(r) is not None for r in ev.ranks)   # every rank has a device timeline
    for r in ev.ranks:
        p = rank_phases(r, device=on_device)
        if p is None or p["n"] < MIN_STEPS:
            short.append(f"rank {r.rank}: {0 if p is None else p['n']}")
            continue
        phases[r.rank] = p
    if len(phases) < 2:
        yield ctx.skip(f"Too few timed steps to compare ranks ({', '.join(short)}; "
                                  f"{MIN_STEPS} per rank needed).")
        return
    by_rank = {r.rank: r for r in ev.ranks}
    step = median([p["total_s"] for p in phases.values()])
    if step <= 0:
        yield ctx.skip("The measured step time is zero.")
        return
    measured = all(_comm_measured(by_rank[k]) for k in phases)
    judged = [(k, label) for k, label in PHASES if k != "other_s" or measured]
    candidates = []
    worst_score = 0.0
    for rank, p in phases.items():
        others = [q for k, q in phases.items() if k != rank]
        for key, label in judged:
            ref = median([q[key] for q in others])
            adjusted = False
            if key == "data_s" and measured and ref >= STRAGGLER_WARN * step and \
                    all(_async_loading(by_rank[k]) for k in phases if k != rank):
                # The other ranks wait for data too, from background workers that keep producing
                # while their rank waits in the all-reduce: that wait would have been data wait.
                # Every rank is input-bound (dataloader.workers); this one is not holding them back
                # unless its wait exceeds theirs, all-reduce included.
                ref = median([q[key] + q["comm_wait_s"] for q in others])
                adjusted = True
            excess = p[key] - ref
            score = excess / step
            worst_score = max(worst_score, score)
            if score >= STRAGGLER_WARN and p[key] >= STRAGGLER_RATIO * ref:
                candidates.append((score, rank, key, label, p[key], ref, adjusted))
    per_rank = {str(k): {name: round(v[name], 6) for name in ("data_s", "forward_s", "backward_s",
                                                                "optimizer_s", "other_s", "comm_wait_s",
                                                                "total_s")}
                for k, v in sorted(phases.items())}
    if not candidates:
        yield ctx.passed(f"{len(phases)} ranks: no phase is slower on one rank by >= {pct(STRAGGLER_WARN)} of the "
                     f"{ms(step)} step (largest difference {pct(max(worst_score, 0.0))}).",
                     ranks=len(phases), step_s=round(step, 6), max_score=round(max(worst_score, 0.0), 4),
                     comm_wait_measured=measured, title="No straggler among the ranks")
        return
    candidates.sort(reverse=True)
    score, rank, key, label, value, ref, adjusted = candidates[0]
    r = by_rank[rank]
    p = phases[rank]
    others = [q for k, q in phases.items() if k != rank]
    others_wait = median([q["comm_wait_s"] for q in others]) if measured else None
    sev = Severity.ERROR if score >= STRAGGLER_ERROR else Severity.WARNING
    # a host the job shares with other work (the ranks of a CPU job on a busy machine): a warning-sized
    # difference can be the host's scheduling of one rank, not the rank; said as an info (issue 33)
    contention = host_contention(ev) if sev == Severity.WARNING else None
    contended = bool(contention and contention.get("contended"))
    numbers = {"clock": p.get("clock", "host"), "rank": rank, "host": _host(r), "phase": label, "phase_s": round(value, 6),
               "others_phase_s": round(ref, 6), "excess_s": round(value - ref, 6), "step_s": round(step, 6),
               "score": round(score, 4), "ranks": len(phases), "comm_wait_measured": measured}
    against = "of data wait and all-reduce wait together" if adjusted else ""
    msg = (f"Rank {rank} on {_host(r)} is a straggler in its {label}: {ms(value)} per step against "
           f"{ms(ref)} {against + ' ' if against else ''}on the other ranks (+{ms(value - ref)}, "
           f"{pct(score)} of the {ms(step)} step)")
    if others_wait is not None and others_wait > 0:
        explained = min((value - ref) / others_wait, 9.99)
        numbers["others_comm_wait_s"] = round(others_wait, 6)
        numbers["explains_wait"] = round(explained, 3)
        msg += f"; the other ranks wait {ms(others_wait)} per step in collectives for it"
    msg += "."
    bigger = p.get("samples") and all(q.get("samples") for q in others) and \
        p["samples"] > 1.1 * median([q["samples"] for q in others])
    if bigger:
        numbers["samples"] = p["samples"]
        numbers["others_samples"] = median([q["samples"] for q in others])
    also = [f"rank {c[1]} ({c[3]}, {pct(c[0])})" for c in candidates[1:] if c[1] != rank][:3]
    if also:
        numbers["also"] = ", ".join(also)
        msg = msg[:-1] + f"; also slow: {', '.join(also)}."
    fix, snippet = _straggler_fix(key, rank, bigger)
    if contended:
        sev = Severity.INFO
        numbers["host_contention"] = contention
        msg = msg[:-1] + (f"; but the host was contended ({contention['host_cpu_percent']:g}% of "
                          f"{contention['cpus']} CPUs busy, other work using {contention['others_cores']:g} "
                          "cores), and a difference this size can be how the host scheduled one rank.")
        fix = "Measure again on a host the job does not share (or with fewer ranks per host): " + fix
    sharded = _sharded_api(ev)
    if sharded:
        numbers["sharded"] = sharded
        sync = ("FSDP's all-gathers (before each unit's forward and backward) and reduce-scatters make every rank "
                "wait for the slowest one several times a step")
    else:
        sync = "DDP's all-reduce makes every rank wait for the slowest one at every step"
    yield ctx.finding(
        severity=sev, message=msg, evidence={**numbers, "per_rank": per_rank},
        why=f"{sync}, so the whole job "
            f"runs at rank {rank}'s pace; the other {len(phases) - 1} rank(s) idle for the difference.",
        fix=fix, snippet=snippet,
    )


def _straggler_fix(key: str, rank: int, bigger: bool) -> tuple[str, str | None]:
    if bigger:
        return (f"Rank {rank} gets larger batches than the others: give every rank the same number of samples "
                "per step (DistributedSampler with drop_last=True, equal per-rank batch sizes).",
                "sampler = DistributedSampler(dataset, drop_last=True)\n"
                "loader = DataLoader(dataset, batch_size=per_rank_batch, sampler=sampler, drop_last=True)")
    if key == "data_s":
        return (f"Make rank {rank}'s input pipeline as fast as the others': check the data it reads (its shard's "
                "file sizes, the storage or network on its host), give its DataLoader more workers, and "
                "preprocess or cache expensive samples; DistributedSampler gives every rank the same count.",
                "loader = DataLoader(dataset, batch_size=B, sampler=DistributedSampler(dataset),\n"
                "                    num_workers=8, pin_memory=True, persistent_workers=True)")
    if key in ("forward_s", "backward_s"):
        return (f"Rank {rank} computes more slowly: look for a slower, throttled or shared device on its host "
                "(other processes on the same GPU, thermal or power capping in `diag gpus`), uneven sequence "
                "lengths routed to it, or a CPU-bound rank (OMP_NUM_THREADS, CPU affinity).", None)
    if key == "optimizer_s":
        return (f"Rank {rank}'s optimizer step is slower: every rank should update the same parameters the same "
                "way (no rank-specific parameter groups or extra optimizer work).", None)
    return (f"Rank {rank} does extra work outside forward/backward (logging, evaluation, checkpoint saving or "
            "metrics on one rank only): do it less often, asynchronously, or spread it over every rank.",
            "if step % log_every == 0 and dist.get_rank() == 0:\n    log(metrics)   # keep rank-0-only work rare")


# ---------------------------------------------------------------------------------------------------

def rank_peak_memory(r) -> tuple[int | None, str]:
    """(peak bytes, what it measures) for one rank: CUDA peak allocated when CUDA was used, else the
    process's peak resident host memory."""
    mem = r.distributed.get("memory") or {}
    peak = mem.get("peak_allocated_bytes")
    if isinstance(peak, (int, float)) and peak > 0:
        return int(peak), "device"
    steps = r.memory.get("steps") if isinstance(r.memory, dict) else None
    if isinstance(steps, list):
        peaks = [s.get("peak") for s in steps if isinstance(s, dict) and isinstance(s.get("peak"), (int, float))]
        if peaks and max(peaks) > 0:
            return int(max(peaks)), "device"
    rss = mem.get("host_peak_rss_bytes")
    if isinstance(rss, (int, float)) and rss > 0:
        return int(rss), "host"
    return None, "none"


@check(id="distributed.memory-imbalance", title="Ranks use unequal memory", severity="warning",
       needs=["ranks.distributed.memory", "ranks.memory.steps"], tags=["distributed", "memory"], docs=DDP_TUTORIAL)
def memory_imbalance(ctx):
    """Per-rank peak memory spread: (max - min) / max of the ranks' peaks (CUDA peak allocated on
    each rank's device; host peak RSS for CPU runs). Warning at >= 20%, error at >= 30% (TraceML's
    rank memory skew thresholds); differences under 128 MiB are not judged. Every rank runs the
    same batch, so the heaviest rank decides the batch size every rank can use."""
    ev = ctx.evidence
    if not _multi(ev):
        yield ctx.skip("Single-process run: there is no other rank to compare with.")
        return
    peaks = {}
    kinds = set()
    for r in ev.ranks:
        peak, kind = rank_peak_memory(r)
        if peak is not None:
            peaks[r.rank] = (peak, kind)
            kinds.add(kind)
    if "device" in kinds:
        peaks = {k: v for k, v in peaks.items() if v[1] == "device"}
        what = "peak device memory allocated"
    else:
        what = "peak host memory (RSS)"
    if len(peaks) < 2:
        yield ctx.skip(f"Per-rank memory was recorded for {len(peaks)} rank(s); two are needed "
                                  "(the distributed probe extension records it).")
        return
    by_rank = {r.rank: r for r in ev.ranks}
    hi_rank = max(peaks, key=lambda k: peaks[k][0])
    lo_rank = min(peaks, key=lambda k: peaks[k][0])
    hi, lo = peaks[hi_rank][0], peaks[lo_rank][0]
    skew = (hi - lo) / hi if hi else 0.0
    others = median([v[0] for k, v in peaks.items() if k != hi_rank])
    numbers = {"rank": hi_rank, "host": _host(by_rank[hi_rank]), "peak_bytes": hi, "min_rank": lo_rank,
               "min_bytes": lo, "others_median_bytes": int(others), "skew": round(skew, 4),
               "measure": what, "ranks": len(peaks)}
    if skew < SKEW_WARN or hi - lo < SKEW_MIN_BYTES:
        yield ctx.passed(f"{len(peaks)} ranks: {what} from {gib(lo)} to {gib(hi)} (spread {pct(skew)}).", **numbers, title="Ranks use similar memory")
        return
    sev = Severity.ERROR if skew >= SKEW_ERROR else Severity.WARNING
    total = (by_rank[hi_rank].distributed.get("memory") or {}).get("total_bytes")
    cap = f" of {gib(total)}" if total and what.startswith("peak device") else ""
    if total:
        numbers["total_bytes"] = total
    msg = (f"{_who(by_rank[hi_rank])} peaks at {gib(hi)}{cap} ({what}), rank {lo_rank} at {gib(lo)}: a spread of "
           f"{pct(skew)} of the largest (median of the other ranks {gib(others)}).")
    if what.startswith("peak device"):
        fix = (f"Find what rank {hi_rank} holds that the others do not: tensors or checkpoints loaded onto one "
               "GPU by every rank (torch.load without map_location, .cuda() before torch.cuda.set_device), "
               "evaluation or metrics gathered on one rank, or uneven batches. Bind each rank to its own device.")
        snippet = ("local_rank = int(os.environ[\"LOCAL_RANK\"])\ntorch.cuda.set_device(local_rank)\n"
                   "state = torch.load(path, map_location=\"cpu\")")
    else:
        fix = (f"Find what rank {hi_rank} holds that the others do not: a dataset, cache or metrics kept by one "
               "rank only, or evaluation run on one rank. Load data per shard and keep rank-specific work small.")
        snippet = None
    yield ctx.finding(severity=sev, message=msg, evidence=numbers,
                  why="Every rank runs the same model and batch size, so the heaviest rank sets the limit: the "
                      "others leave memory unused that a larger batch could have used, and the heaviest one "
                      "runs out first.",
                  fix=fix, snippet=snippet)


# ---------------------------------------------------------------------------------------------------

def _backend_for(dist: dict, device_type: str) -> str | None:
    """The backend the process group uses for a device type ('cpu:gloo,cuda:nccl' or 'gloo')."""
    cfg = dist.get("backend_config") or dist.get("backend")
    if not cfg:
        return None
    cfg = str(cfg)
    if ":" not in cfg:
        return cfg
    for part in cfg.split(","):
        dev, _, be = part.partition(":")
        if dev.strip() == device_type:
            return be.strip()
    return None


def _model_device_types(r) -> set[str]:
    types = set()
    for m in (r.distributed.get("ddp") or {}).get("models", []) or []:
        if m.get("device"):
            types.add(str(m["device"]).split(":")[0])
    fsdp = r.distributed.get("fsdp") or {}
    types.update(str(d) for d in fsdp.get("devices") or [] if d)
    if not types:
        for m in r.models:
            if m.wrappers and ("DistributedDataParallel" in m.wrappers or "FullyShardedDataParallel" in m.wrappers):
                types.update(str(d).split(":")[0] for d in m.devices or [])
    return types


@check(id="distributed.backend", title="Collective backend", severity="warning",
       needs=["ranks.distributed", "ranks.models", "environment.cuda_available"], tags=["distributed"],
       docs=BACKENDS)
def backend(ctx):
    """The process group's backend suits the tensors: NCCL for CUDA tensors (gloo moves them through
    host memory, several times slower); a torch build with NCCL where CUDA is used by several
    processes; a process group at all when several processes train (without one every rank trains
    its own unsynchronised copy)."""
    ev = ctx.evidence
    if not _multi(ev):
        yield ctx.skip("Single-process run: no collective backend in use.")
        return
    ranks = [r for r in ev.ranks if r.distributed]
    if not ranks:
        yield ctx.skip("The distributed probe extension recorded nothing (disabled, or evidence "
                                  "from an older diag).")
        return
    inited = [r for r in ranks if r.distributed.get("initialized")]
    stepped = sum(max(r.step_stats.count, len(r.steps)) for r in ev.ranks)
    if not inited:
        if not any("initialized" in r.distributed for r in ranks) or stepped == 0:
            yield ctx.skip("No training step was observed, so the process group was not inspected.")
            return
        world = max(r.world_size for r in ev.ranks)
        yield ctx.finding(
            severity=Severity.WARNING, title="Several processes but no process group",
            message=f"{world} processes trained ({stepped} steps) but none initialised torch.distributed: "
                    "every rank trains its own copy of the model and nothing is synchronised.",
            evidence={"world_size": world, "steps": stepped},
            why="Without init_process_group and DDP, N processes do N times the work for one model's worth "
                "of learning, and each saves a different model.",
            fix="Initialise the process group and wrap the model in DistributedDataParallel.",
            snippet="dist.init_process_group(\"nccl\" if torch.cuda.is_available() else \"gloo\")\n"
                    "model = DDP(model.to(local_rank), device_ids=[local_rank])")
        return
    d = inited[0].distributed
    avail = d.get("available") or {}
    dev_types = set()
    for r in ev.ranks:
        dev_types |= _model_device_types(r)
    numbers = {"backend": d.get("backend"), "backend_config": d.get("backend_config"),
               "nccl_available": avail.get("nccl"), "device_types": ", ".join(sorted(dev_types)) or None,
               "world_size": d.get("world_size")}
    cuda_backend = _backend_for(d, "cuda")
    if "cuda" in dev_types and cuda_backend == "gloo":
        nccl = bool(avail.get("nccl"))
        yield ctx.finding(
            severity=Severity.ERROR if nccl else Severity.WARNING,
            title="gloo carries CUDA tensors",
            message=f"The process group uses gloo for CUDA tensors (backend '{d.get('backend_config') or d.get('backend')}') "
                    f"across {d.get('world_size')} ranks" + ("" if nccl else "; this torch build has no NCCL") + ".",
            evidence=numbers,
            why="gloo copies every gradient bucket through host memory; NCCL all-reduces between GPUs "
                "directly (NVLink, InfiniBand) and is the backend PyTorch recommends for CUDA.",
            fix="Use the nccl backend for GPU training" + ("." if nccl else
                 ": install a CUDA build of torch with NCCL (Linux)."),
            snippet="dist.init_process_group(backend=\"nccl\")   # or \"cpu:gloo,cuda:nccl\" for both")
        return
    if "cuda" in dev_types and not avail.get("nccl"):
        yield ctx.finding(
            severity=Severity.WARNING, title="NCCL is not available",
            message=f"CUDA tensors are trained on {d.get('world_size')} ranks but this torch build has no NCCL "
                    f"(backend '{d.get('backend')}').",
            evidence=numbers,
            why="Without NCCL, GPU collectives go through slower paths.",
            fix="Install a CUDA build of torch that includes NCCL (the Linux wheels from pytorch.org do).")
        return
    if ev.environment.cuda_available and "cuda" not in dev_types and dev_types == {"cpu"}:
        yield ctx.finding(
            severity=Severity.INFO, title="GPUs present, models on the CPU",
            message=f"{d.get('world_size')} ranks train on the CPU with '{d.get('backend')}' while this machine "
                    f"has {ev.environment.device_count} CUDA device(s).",
            evidence=numbers,
            fix="If the GPUs are meant for this job, move each rank's model to its GPU and use nccl.",
            snippet="torch.cuda.set_device(local_rank)\nmodel = DDP(model.cuda(), device_ids=[local_rank])")
        return
    yield ctx.passed(f"Backend '{d.get('backend_config') or d.get('backend')}' on {d.get('world_size')} ranks for "
                 f"{', '.join(sorted(dev_types)) or 'unknown'} tensors.", **numbers, title="Collective backend suits the tensors")


# ---------------------------------------------------------------------------------------------------

def _rank_device(r) -> str | None:
    mem = r.distributed.get("memory") or {}
    dev = mem.get("device")
    if dev and str(dev).startswith("cuda"):
        return str(dev)
    for m in (r.distributed.get("ddp") or {}).get("models", []) or []:
        if m.get("device") and str(m["device"]).startswith("cuda"):
            return str(m["device"])
    return None


@check(id="distributed.device-placement", title="Ranks share a GPU", severity="error",
       needs=["ranks.distributed.memory.device", "ranks.host"], tags=["distributed"], docs=DDP_TUTORIAL)
def device_placement(ctx):
    """Two ranks on the same host train on the same CUDA device (usually every rank on cuda:0
    because torch.cuda.set_device(local_rank) or device_ids=[local_rank] is missing): they share
    one GPU's memory and compute while the other GPUs idle."""
    ev = ctx.evidence
    if not _multi(ev):
        yield ctx.skip("Single-process run.")
        return
    devs = {}
    for r in ev.ranks:
        d = _rank_device(r)
        if d:
            # the physical GPU when known; else the device as this rank numbers it, which depends on
            # its CUDA_VISIBLE_DEVICES
            uuid = (r.distributed.get("memory") or {}).get("device_uuid")
            visible = (r.distributed.get("launcher") or {}).get("cuda_visible_devices")
            key = uuid or (f"{d} (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else d)
            devs.setdefault((r.host, d, key), []).append(r.rank)
    if not devs:
        yield ctx.skip("No rank trained on a CUDA device.")
        return
    shared = {k: v for k, v in devs.items() if len(v) > 1}
    if not shared:
        yield ctx.passed(f"{sum(len(v) for v in devs.values())} ranks on {len(devs)} distinct (host, GPU) pairs.", title="Each rank has its own GPU")
        return
    (host, dev, _), ranks = max(shared.items(), key=lambda kv: len(kv[1]))
    yield ctx.finding(
        severity=Severity.ERROR,
        message=f"Ranks {', '.join(map(str, sorted(ranks)))} on {host or 'one host'} all train on {dev}.",
        evidence={"host": host, "device": dev, "ranks": ", ".join(map(str, sorted(ranks))),
                  "shared_groups": len(shared)},
        why="The ranks split one GPU's memory and compute while the host's other GPUs stay idle.",
        fix="Bind each rank to the GPU of its LOCAL_RANK before creating the model or any CUDA tensor.",
        snippet="local_rank = int(os.environ[\"LOCAL_RANK\"])\ntorch.cuda.set_device(local_rank)\n"
                "model = DDP(model.to(local_rank), device_ids=[local_rank])")
