"""Memory checks: out-of-memory diagnosis, headroom, allocator fragmentation, evaluation batch size.

They read ``RankEvidence.memory`` (written by the probe's memory extension: the CUDA allocator's
per-step statistics, the live breakdown of the peak, the state at an OOM, the fake-tensor estimate
and plan), ``Evidence.memory_plan`` (``diag memory``) and ``Evidence.gpu`` (the NVML sampler's
per-device memory series). Shapes: docs/memory.md.
"""
from __future__ import annotations

from diag.checks.api import (accumulation_plan, accumulation_snippet, check, expandable_segments_enabled,
    fragmentation, parse_oom, Severity)

from ._util import TUNING_GUIDE, gib, loc, pct

CUDA_MEMORY_DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"
MEMORY_DOCS = "https://pytorch.org/docs/stable/torch_cuda_memory.html"

HEADROOM_LIMIT = 0.90        # peak above 90% of the device: warning (tb-profiler; TraceML warns at 0.92)
FRAG_OVERHEAD = 0.25         # reserved peak >= 25% above the allocated peak ...
FRAG_MIN_BYTES = 512 << 20   # ... and at least 512 MiB more: fragmentation warning
EVAL_FACTOR = 2              # a fitting eval batch >= 2x the one used: info

EXPANDABLE = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
CATS = (("parameters", "parameters"), ("gradients", "gradients"), ("optimizer_state", "optimizer state"),
        ("activations", "activations"), ("other", "other"))


def _batch_at(r, step: int | None = None) -> int | None:
    for s in reversed(r.steps):
        if s.samples:
            return s.batch              # a micro-batch under gradient accumulation: what memory holds
    cap = _mem(r).get("capture") or {}
    if cap.get("batch"):
        return int(cap["batch"])
    for site in r.forwards:
        if site.in_step and site.input_shapes:
            return site.input_shapes[0][0] if site.input_shapes[0] else None
    for d in r.dataloaders:
        if d.batch_size:
            return d.batch_size
    return None


def _mem(r) -> dict:
    return r.memory if isinstance(r.memory, dict) else {}


def _estimate(ev, r) -> dict | None:
    """The rank's fake-tensor estimate (status ok), else the one inside Evidence.memory_plan."""
    est = _mem(r).get("estimate")
    if isinstance(est, dict) and est.get("status") == "ok":
        return est
    plan = ev.memory_plan if isinstance(ev.memory_plan, dict) else {}
    est = plan.get("estimate")
    if isinstance(est, dict) and est.get("status") == "ok" and plan.get("rank", 0) == r.rank:
        return est
    return None


def _estimate_skip_reason(ev, r) -> str | None:
    est = _mem(r).get("estimate")
    if isinstance(est, dict) and est.get("status") == "skipped":
        return est.get("reason")
    return None


def _cats_text(cats: dict) -> str:
    return ", ".join(f"{label} {gib(cats.get(k, 0))}" for k, label in CATS if cats.get(k))


def _total_memory(ev, r, device: dict | None = None) -> int | None:
    if device and device.get("total"):
        return int(device["total"])
    idx = (device or {}).get("index") or 0
    for d in ev.environment.devices:
        if d.index == idx and d.total_memory:
            return int(d.total_memory)
    return None


# ---------------------------------------------------------------------------------------------------
# memory.oom

@check(id="memory.oom", title="Out of memory", severity="error",
       needs=["ranks.exceptions", "ranks.memory", "memory_plan"], tags=["memory"], docs=CUDA_MEMORY_DOCS)
def memory_oom(ctx):
    """The run died of an out-of-memory error. Says when (step), at what batch size, what the
    message said (requested / capacity / free / allocated / reserved but unallocated), where the
    memory went (the last live breakdown on CUDA: parameters, gradients, optimizer state,
    activations, other) and what to change, with numbers: the largest batch that fits this device
    and the micro-batch x accumulation steps that keep the effective batch (from the fake-tensor
    replay diag runs after a CUDA OOM), else a linear estimate from the breakdown;
    `expandable_segments` when reserved-but-unallocated memory could have served the request."""
    ev = ctx.evidence
    hits = [(r, e) for r in ev.ranks for e in r.exceptions if e.is_oom]
    if not hits:
        yield ctx.passed("The run did not run out of memory.", title="No out-of-memory error")
        return
    r, exc = hits[0]
    mem = _mem(r)
    oomrec = mem.get("oom") or {}
    nums = dict(parse_oom(exc.message))
    # the failing step's batch (the probe reads it from the failing forward's inputs), else the last
    # batch seen: a job whose batches grow dies on a larger one than its earlier steps took
    failing_batch = oomrec.get("batch")
    batch = failing_batch or _batch_at(r, exc.step)
    breakdown = oomrec.get("breakdown") or mem.get("breakdown")
    est = _estimate(ev, r)
    stats = oomrec.get("stats") or {}
    capacity = nums.get("capacity") or oomrec.get("total") or (est or {}).get("capacity")

    parts = []
    if "requested" in nums:
        parts.append(f"it asked for {gib(nums['requested'])}")
    if capacity:
        parts.append(f"the device holds {gib(capacity)}")
    if "free" in nums:
        parts.append(f"{gib(nums['free'])} was free")
    if "allocated" in nums:
        parts.append(f"PyTorch had {gib(nums['allocated'])} allocated")
    elif stats.get("allocated") is not None:
        parts.append(f"PyTorch had {gib(stats['allocated'])} allocated")
    if "reserved_unallocated" in nums:
        parts.append(f"{gib(nums['reserved_unallocated'])} reserved but unallocated")
    step_no = oomrec.get("step") or ((exc.step or 0) + 1)
    when = f"at step {step_no}" if r.step_stats.count else "in the first step"
    msg = f"The script ran out of memory {when}"
    if batch:
        # the failing step's own batch when the probe saw it; else (the allocation failed before the
        # step's forward, or older evidence) the batch of the steps before, said as such
        msg += f" with batch size {batch}" if failing_batch or not r.step_stats.count else \
            f" (the steps before it took batch size {batch})"
    if parts:
        msg += ": " + ", ".join(parts)
    msg += "."
    if breakdown and breakdown.get("categories"):
        msg += f" Its peak so far ({gib(breakdown.get('peak'))}) was {_cats_text(breakdown['categories'])}."

    fixes: list[str] = []
    snippet = None
    evidence = {**{k: v for k, v in nums.items()}, "batch_size": batch, "step": step_no, "rank": r.rank,
                "message": exc.message[:2000]}
    frag = nums.get("reserved_unallocated", 0)
    if frag and nums.get("requested") and frag >= nums["requested"]:
        if expandable_segments_enabled(ev.environment.env):
            fixes.append(f"{gib(frag)} was reserved but not in one piece even with expandable segments: "
                         "keep tensor shapes steady (pad variable lengths to a few buckets)")
        else:
            fixes.append(f"fragmentation: {gib(frag)} was reserved but unallocated, more than the "
                         f"{gib(nums['requested'])} requested; set {EXPANDABLE}")
    plan_fix = False
    if est and batch:
        mb = est.get("max_batch")
        acc = est.get("accumulation")
        evidence.update(estimated_max_batch=mb, estimate_capacity=est.get("capacity"))
        if mb and mb < batch:
            plan = acc if acc and acc.get("effective_batch") == batch else accumulation_plan(batch, mb)
            if plan and plan.get("steps", 1) > 1:
                fixes.append(f"the largest batch that fits ({gib(est.get('capacity'))}, 10% headroom) is {mb}, "
                             f"estimated by replaying the step on fake tensors: use micro-batch "
                             f"{plan['micro_batch']} x {plan['steps']} gradient-accumulation steps to keep the "
                             f"effective batch {batch}")
                snippet = plan.get("snippet") or accumulation_snippet(plan)
                evidence["accumulation"] = {k: plan[k] for k in ("micro_batch", "steps", "effective_batch")}
                plan_fix = True
        elif mb and mb >= batch:
            at = est.get("at_target") or {}
            extra = []
            outside = nums.get("process_in_use", 0) - nums.get("reserved", nums.get("process_in_use", 0))
            if outside > 0:
                extra.append(f"{gib(outside)} of this process's memory was outside PyTorch's allocator "
                             "(CUDA context, other libraries)")
            if capacity and nums.get("process_in_use") and nums.get("free") is not None and \
                    nums["process_in_use"] + nums["free"] < 0.95 * capacity:
                extra.append(f"other processes held {gib(capacity - nums['process_in_use'] - nums['free'])} "
                             "of the device")
            fixes.append(f"replaying one step of this model on fake tensors estimates {gib(at.get('device'))} at "
                         f"batch {batch} (up to {mb} fits {gib(est.get('capacity'))} with 10% headroom), so the "
                         "OOM comes from what one step does not explain: " +
                         ("; ".join(extra) + "; or " if extra else "") +
                         "memory kept across steps (a list of losses or outputs that still hold their graphs: "
                         "append loss.item(), not loss), a growing cache, or fragmentation")
            evidence["estimated_peak_at_batch"] = at.get("device")
            plan_fix = True
        elif mb == 0:
            fixes.append("even batch 1 does not fit (estimated): parameters, gradients and optimizer state "
                         "alone exceed the device; use bf16 weights, an 8-bit or sharded optimizer (FSDP), "
                         "or a larger GPU")
            plan_fix = True
    elif not est:
        reason = _estimate_skip_reason(ev, r)
        if reason:
            evidence["estimate_skipped"] = reason
    if not plan_fix and batch and batch > 1 and breakdown and capacity:
        cats = breakdown.get("categories", {})
        act = cats.get("activations", 0)
        fixed = breakdown.get("peak", 0) - act
        per_sample = act / batch if batch else 0
        budget = capacity * 0.9 - fixed
        if per_sample > 0 and budget > 0:
            fit = int(budget // per_sample)
            if 1 <= fit < batch:
                plan = accumulation_plan(batch, fit)
                if plan:
                    fixes.append(f"at about {gib(per_sample)} of activations per sample, roughly {fit} samples "
                                 f"fit (linear estimate from the measured peak): micro-batch "
                                 f"{plan['micro_batch']} x {plan['steps']} accumulation steps keeps batch {batch}")
                    snippet = accumulation_snippet(plan)
                    evidence["linear_fit_batch"] = fit
                    plan_fix = True
    if not plan_fix and batch and batch > 1:
        fixes.append(f"halve the micro-batch to {batch // 2} and accumulate gradients over 2 steps (same "
                     "effective batch); `diag memory --script ... --gpu ...` estimates the largest batch that fits")
        snippet = accumulation_snippet(accumulation_plan(batch, batch // 2) or
                                       {"micro_batch": batch // 2, "steps": 2, "effective_batch": batch,
                                        "exact": True})
    if breakdown:
        evidence["breakdown"] = breakdown.get("categories")
        cats = breakdown.get("categories", {})
        if cats.get("optimizer_state", 0) > 0.4 * max(1, breakdown.get("peak", 1)):
            fixes.append(f"the optimizer state is {gib(cats['optimizer_state'])}: a fused/foreach-free or "
                         "8-bit optimizer, or sharding it (ZeRO/FSDP), frees most of it")
    fixes.append("use mixed precision (torch.autocast with bfloat16) and activation checkpointing "
                 "(torch.utils.checkpoint) for the largest blocks")
    yield ctx.finding(
        severity=Severity.ERROR,
        message=msg, evidence=evidence,
        why="The step's peak (weights, gradients, optimizer state and the activations of the batch) "
            "exceeded what the device could give.",
        fix="Try, in order: " + "; ".join(fixes) + ".",
        snippet=snippet,
        location=loc(exc.location),
    )


# ---------------------------------------------------------------------------------------------------
# memory.headroom

def _allocator_usage(ev) -> dict | None:
    best = None
    for r in ev.ranks:
        mem = _mem(r)
        steps = mem.get("steps") or []
        if not steps:
            continue
        dev = mem.get("device") or {}
        total = _total_memory(ev, r, dev)
        if not total:
            continue
        reserved = max((s.get("reserved_peak") or 0) for s in steps)
        allocated = max((s.get("peak") or 0) for s in steps)
        ratio = reserved / total
        if best is None or ratio > best["ratio"]:
            best = {"ratio": ratio, "reserved_peak": reserved, "allocated_peak": allocated, "total": total,
                    "rank": r.rank, "device": dev.get("name"), "source": "allocator"}
    return best


def _nvml_usage(ev) -> dict | None:
    g = ev.gpu if isinstance(ev.gpu, dict) else {}
    devs = g.get("devices") or []
    best = None
    for d in devs:
        if not isinstance(d, dict):
            continue
        if d.get("used_by_run") is False:
            continue
        total = d.get("memory_total")
        stats = d.get("stats") or {}
        used = stats.get("run_mem_max") if isinstance(stats.get("run_mem_max"), (int, float)) else None
        what = "held by the run's processes"
        if used is None and d.get("used_by_run") is True or (used is None and len(devs) == 1):
            used = stats.get("mem_used_max") if isinstance(stats.get("mem_used_max"), (int, float)) else None
            what = "used on the device (all processes)"
        if not isinstance(total, (int, float)) or not total or used is None:
            continue
        ratio = used / total
        if best is None or ratio > best["ratio"]:
            best = {"ratio": ratio, "used": int(used), "total": int(total), "device": d.get("name"),
                    "index": d.get("index"), "what": what, "source": "nvml",
                    "simulated": bool(g.get("simulated") or d.get("simulated"))}
    return best


@check(id="memory.headroom", title="GPU memory headroom", severity="warning",
       needs=["ranks.memory", "gpu.devices", "memory_plan"], tags=["memory"], docs=MEMORY_DOCS)
def memory_headroom(ctx):
    """The step's memory peak is above 90% of the device (tb-profiler's line; TraceML warns at 92%):
    a longer sequence, a bigger batch or a fragmented cache away from an OOM. Judged on the CUDA
    allocator's reserved peak (torch.cuda.max_memory_reserved) and on the NVML memory series of the
    GPUs the run used (which include the CUDA context and other processes), whichever is higher;
    without either, on the fake-tensor estimate for the target device (marked estimated)."""
    ev = ctx.evidence
    alloc = _allocator_usage(ev)
    nvml = _nvml_usage(ev)
    sources = [s for s in (alloc, nvml) if s]
    if sources:
        worst = max(sources, key=lambda s: s["ratio"])
        sim = " (simulated GPU values)" if worst.get("simulated") else ""
        if worst["source"] == "allocator":
            what = (f"PyTorch's allocator reserved up to {gib(worst['reserved_peak'])} of the "
                    f"{gib(worst['total'])} on {worst.get('device') or 'the GPU'} ({pct(worst['ratio'])}; "
                    f"{gib(worst['allocated_peak'])} allocated at the peak)")
        else:
            what = (f"NVML saw up to {gib(worst['used'])} {worst['what']} of the {gib(worst['total'])} on "
                    f"GPU {worst.get('index')} {worst.get('device') or ''}".rstrip() + f" ({pct(worst['ratio'])})")
        evidence = {"ratio": round(worst["ratio"], 4), "limit": HEADROOM_LIMIT, "source": worst["source"],
                    "allocator": alloc, "nvml": nvml}
        if worst["ratio"] <= HEADROOM_LIMIT:
            yield ctx.passed(what[0].upper() + what[1:] + sim +
                         f": below the {pct(HEADROOM_LIMIT)} line.", **evidence)
            return
        yield ctx.finding(
            severity=Severity.WARNING, title="GPU memory is nearly full",
            message=what[0].upper() + what[1:] + sim + f", above {pct(HEADROOM_LIMIT)}.",
            evidence=evidence,
            why="With less than 10% free, a longer input, a larger batch or a fragmented cache ends in an OOM; "
                "near the limit the allocator also frees its cache and retries, which synchronises the GPU.",
            fix="Leave headroom: lower the batch (keep the effective batch with gradient accumulation), use "
                f"bf16 autocast or activation checkpointing; set {EXPANDABLE} to reduce fragmentation. "
                "`diag memory --script train.py --gpu <name>` prints the largest batch that fits with 10% free.",
            snippet="import os\nos.environ.setdefault('PYTORCH_CUDA_ALLOC_CONF', 'expandable_segments:True')  "
                    "# before torch touches CUDA",
        )
        return
    r = ev.primary
    est = _estimate(ev, r)
    if est and est.get("capacity") and est.get("at_target"):
        at = est["at_target"]
        ratio = at["device"] / est["capacity"]
        evidence = {"ratio": round(ratio, 4), "limit": HEADROOM_LIMIT, "source": "estimate",
                    "estimated_device_peak": at["device"], "capacity": est["capacity"], "batch": at["batch"]}
        what = (f"the estimated peak at batch {at['batch']} is {gib(at['device'])} of "
                f"{gib(est['capacity'])} ({pct(ratio)}, fake-tensor replay with allowances)")
        if ratio <= HEADROOM_LIMIT:
            yield ctx.passed(what[0].upper() + what[1:] + f": below the {pct(HEADROOM_LIMIT)} line.", **evidence, title="GPU memory headroom (estimated)")
            return
        mb = est.get("max_batch")
        yield ctx.finding(
            severity=Severity.WARNING, title="Estimated GPU memory nearly full",
            message=what[0].upper() + what[1:] + f", above {pct(HEADROOM_LIMIT)}.", evidence=evidence,
            why="Less than 10% free leaves no room for longer inputs or allocator fragmentation.",
            fix=(f"Use batch {mb} or less (the largest that fits with 10% free), or keep the effective batch "
                 "with gradient accumulation." if mb else "Lower the batch or use gradient accumulation."),
        )
        return
    yield ctx.skip("No CUDA allocator statistics, no GPU memory samples and no memory estimate for a target "
                  "device (a CPU run: `diag memory --script ... --gpu NAME` estimates it).")


# ---------------------------------------------------------------------------------------------------
# memory.fragmentation

@check(id="memory.fragmentation", title="Allocator fragmentation", severity="warning",
       needs=["ranks.memory", "ranks.exceptions", "environment.env"], tags=["memory"], docs=CUDA_MEMORY_DOCS)
def memory_fragmentation(ctx):
    """The CUDA caching allocator needed much more than the tensors did: allocation retries (the
    allocator freed its whole cache and tried again: a device synchronisation, and a step from an
    OOM), or a reserved peak at least 25% and 512 MiB above the allocated peak. The fix is
    `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` (segments grow in place instead of leaving
    odd-sized holes), unless it is already set. Skipped without allocator statistics (CPU runs)."""
    ev = ctx.evidence
    worst = None
    for r in ev.ranks:
        steps = _mem(r).get("steps") or []
        if not steps:
            continue
        last = max(steps, key=lambda s: (s.get("reserved_peak") or 0, s.get("step") or 0))
        rec = dict(last)
        rec["retries"] = max(int(s.get("retries") or 0) for s in steps)
        fr = fragmentation(rec)
        if fr is None:
            continue
        fr["rank"] = r.rank
        score = (fr["retries"] > 0, fr["overhead_fraction"] or 0)
        if worst is None or score > worst[0]:
            worst = (score, fr)
    expandable = expandable_segments_enabled(ev.environment.env)
    if worst is None:
        for r in ev.ranks:
            for e in r.exceptions:
                nums = parse_oom(e.message) if e.is_oom else {}
                if nums.get("reserved_unallocated") and nums.get("requested") and \
                        nums["reserved_unallocated"] >= nums["requested"]:
                    yield ctx.finding(
                        severity=Severity.WARNING, title="Fragmented GPU memory",
                        message=f"At the OOM {gib(nums['reserved_unallocated'])} was reserved by PyTorch but "
                                f"unallocated, more than the {gib(nums['requested'])} requested: free memory "
                                "existed, in pieces too small.",
                        evidence={**nums, "expandable_segments": expandable, "source": "oom message"},
                        fix=_frag_fix(expandable), snippet=_FRAG_SNIPPET, location=loc(e.location))
                    return
        yield ctx.skip("No CUDA allocator statistics (the run did not use CUDA).")
        return
    fr = worst[1]
    over = fr["overhead"]
    frac = fr["overhead_fraction"] or 0
    evidence = {**fr, "expandable_segments": expandable, "limit_fraction": FRAG_OVERHEAD,
                "limit_bytes": FRAG_MIN_BYTES}
    bad_ratio = frac >= FRAG_OVERHEAD and over >= FRAG_MIN_BYTES
    if fr["retries"] == 0 and not bad_ratio:
        yield ctx.passed(f"The allocator reserved {gib(fr['reserved_peak'])} for a {gib(fr['allocated_peak'])} peak "
                     f"({pct(frac)} more) with no allocation retries.", **evidence)
        return
    parts = []
    if fr["retries"]:
        parts.append(f"the allocator ran out of cached blocks and retried {fr['retries']} time(s) "
                     "(each retry frees the whole cache and synchronises the device)")
    if bad_ratio:
        parts.append(f"it reserved {gib(fr['reserved_peak'])} for a {gib(fr['allocated_peak'])} peak of live "
                     f"tensors ({gib(over)}, {pct(frac)} more)")
    yield ctx.finding(
        severity=Severity.WARNING if not expandable else Severity.INFO,
        title="Fragmented GPU memory",
        message=("On rank %d, " % fr["rank"] if ev.multi_rank else "") + "; ".join(parts) + ".",
        evidence=evidence,
        why="Blocks of odd sizes freed between steps (varying shapes, a growing cache) leave holes the "
            "caching allocator cannot reuse: reserved memory grows past what the tensors need, and the "
            "next large request fails or forces a cache flush.",
        fix=_frag_fix(expandable), snippet=_FRAG_SNIPPET,
    )


_FRAG_SNIPPET = ("# in the shell, before starting the script:\nexport PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"
                 "# or at the very top of train.py, before torch uses CUDA:\nimport os\n"
                 "os.environ.setdefault('PYTORCH_CUDA_ALLOC_CONF', 'expandable_segments:True')")


def _frag_fix(expandable: bool) -> str:
    if expandable:
        return ("expandable_segments is already on: keep tensor shapes steady (pad variable-length inputs to a "
                "few bucket sizes) and avoid calling torch.cuda.empty_cache() in the loop.")
    return (f"Set {EXPANDABLE}: segments then grow in place instead of leaving odd-sized holes; also keep "
            "tensor shapes steady (pad variable-length inputs to a few bucket sizes).")


# ---------------------------------------------------------------------------------------------------
# memory.eval-batch

@check(id="memory.eval-batch", title="Evaluation batch size", severity="info",
       needs=["ranks.forwards", "ranks.memory", "memory_plan"], tags=["memory", "eval"],
       docs=TUNING_GUIDE + "#disable-gradient-calculation-for-validation-or-inference")
def memory_eval_batch(ctx):
    """Evaluation (forwards under no_grad or inference_mode) runs at the training batch size or
    smaller although the fake-tensor estimate says a batch at least 2x larger fits: without a
    backward there are no saved activations and no gradients, so far more samples fit per forward
    (the seed article's "optimal eval batch size", found by bisection on the estimate instead of
    trial OOMs). Needs the estimate (`diag memory`, or `DIAG_MEMORY_ESTIMATE=1` with a CUDA device
    or DIAG_MEMORY_CAPACITY). In an evaluation-only run the estimate replays the evaluation forward
    itself (`mode: "eval"`)."""
    ev = ctx.evidence
    r = ev.primary
    sites = [s for s in r.forwards if not s.training and (not s.grad_enabled or s.inference_mode)
             and s.input_shapes and s.input_shapes[0]]
    if not sites:
        yield ctx.skip("No evaluation forward under no_grad or inference_mode was observed.")
        return
    est = _estimate(ev, r)
    evp = (est or {}).get("eval") or {}
    if not est or evp.get("max_batch") is None:
        reason = _estimate_skip_reason(ev, r)
        yield ctx.skip(f"The memory estimate could not be made ({reason})." if reason else
                      "The largest evaluation batch was not estimated for a target device: run `diag memory "
                      "--script ... --gpu NAME` (or set DIAG_MEMORY_ESTIMATE=1 on a CUDA run).")
        return
    site = max(sites, key=lambda s: s.count)
    eval_b = int(site.input_shapes[0][0])
    # an evaluation-only run has no training batch (its estimate replayed the evaluation forward)
    train_b = None if est.get("mode") == "eval" or r.step_stats.count == 0 else _batch_at(r)
    max_eval = int(evp["max_batch"])
    device = est.get("capacity_source") or "the target device"
    evidence = {"eval_batch": eval_b, "train_batch": train_b, "max_eval_batch": max_eval,
                "capacity": est.get("capacity"), "forwards": site.count, "site": site.key}
    if train_b and eval_b > train_b:
        yield ctx.passed(f"Evaluation already runs at batch {eval_b}, above the training batch {train_b} "
                     f"(up to {max_eval} fits).", **evidence)
        return
    if max_eval < EVAL_FACTOR * eval_b:
        yield ctx.passed(f"Evaluation runs at batch {eval_b}; the largest that fits is {max_eval}.", **evidence)
        return
    suggest = 1 << (max_eval.bit_length() - 1)
    where = f" at {loc(site.location)}" if site.location else ""
    yield ctx.finding(
        severity=Severity.INFO, title="Evaluation batch could be much larger",
        message=f"Evaluation{where} runs at batch {eval_b}" +
                (f" (the training batch is {train_b})" if train_b else "") +
                f", but up to {max_eval:,} fits under inference_mode on {device} "
                f"({max_eval / eval_b:.0f}x; estimated by replaying the forward on fake tensors).",
        evidence=evidence,
        why="Evaluation keeps no activations for a backward, no gradients and no optimizer temporaries: "
            "larger batches mean fewer, better-filled kernel launches and fewer Python round trips.",
        fix=f"Give the evaluation DataLoader batch_size={suggest} (the largest power of two that fits with "
            "10% headroom) and run it under torch.inference_mode().",
        snippet=f"val_loader = DataLoader(val_set, batch_size={suggest}, shuffle=False)\nmodel.eval()\n"
                "with torch.inference_mode():\n    for x, y in val_loader:\n        out = model(x)",
        location=loc(site.location),
    )
