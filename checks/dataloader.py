"""Data pipeline checks: waiting for the DataLoader, worker counts, pinned memory, worker re-spawns,
batches built by hand in the training loop."""
from __future__ import annotations

from diag.checks.api import (check, cuda_training, data_wait, device_types, gpu_timeline, median, training_models,
                             Severity)
from diag.evidence.phases import MIN_STEADY

from ._framework import NAMES, framework_entry, framework_of, words
from ._perf import PERF_MISSING, guide, perf_ran, short_file, training_sites
from ._util import fix_site, loc, ms, pct
from ._workers import (advice, contention_words, fetch_time, holds_as_error, host_contention,  # noqa: F401
                       quartile_low, recommended_workers)

WARN_SHARE = 0.10    # data wait >= 10% of step time: warning (TraceML warns at 10%)
ERROR_SHARE = 0.30   # >= 30%: error (the model idles a third of the time)
HEADROOM = 1.5       # workers sized for 1.5x the measured fetch rate

PIN_DOCS = "https://pytorch.org/tutorials/intermediate/pinmem_nonblock.html"
DATALOADER_DOCS = "https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader"
# Host-to-device bandwidth assumed for the estimate (PCIe 4.0 x16): pinned ~24 GB/s; pageable
# memory goes through a staging copy at roughly half that (NVIDIA, "How to Optimize Data Transfers
# in CUDA C/C++"). Only used to size the finding, never as a measurement.
PINNED_BPS = 24e9
PAGEABLE_BPS = 12e9
PIN_WARN_SHARE = 0.05       # estimated pageable copy time >= 5% of the step: warning
RESPAWN_WARN_SHARE = 0.05   # worker start-up per epoch >= 5% of the epoch: warning
RESPAWN_INFO_SHARE = 0.01
EVAL_MIN_STEPS = 6          # timed evaluation steps needed to judge an evaluation run's data wait
MIN_MAIN_THREAD_GAP_S = 0.0005  # below 0.5 ms between steps nothing can be won back: a DataLoader's own
                                # per-batch cost (iterator, collate, IPC) is of that order   # >= 1%: info
WORKER_START_S = 0.02  # starting DataLoader worker processes, once (persistent_workers=True, as the fix says):
                       # 36-44 ms to the first batch with num_workers=1 or 2 (fork, torch 2.13 CPU, TensorDataset,
                       # 2-core VM, 2026-12-08) against 0.4 ms in the main process; 20 ms leaves a faster
                       # machine its due. A run whose whole steady wait is under it cannot win workers back.


def epoch_start_steps(steps) -> set[int]:
    """Indices of steps that fetched the first batch of a new epoch (their epoch number differs
    from the previous step's)."""
    out, prev = set(), None
    for s in steps:
        if s.epoch is not None and prev is not None and s.epoch != prev:
            out.add(s.index)
        prev = s.epoch
    return out


def data_share(r, exclude_epoch_starts: bool = False) -> tuple[float, float, float, int] | None:
    """(share of step time waiting for data, median data wait, median compute, n steps): the one
    share every check reads, ``RankEvidence.data_wait_share()`` (median over the steady training
    steps). ``exclude_epoch_starts`` is kept for callers of the former helper; the rank decides."""
    d = r.data_wait_share()
    if d is None:
        return None
    return d["share"], d["data_s"], d["compute_s"], d["n"]


def _sum_share(r, exclude_epoch_starts: bool = False) -> tuple[float, float, float, int] | None:
    """The former sum-over-sum share (kept for reference in tests; no check uses it)."""
    steps = r.timed_steps()
    if exclude_epoch_starts:
        starts = epoch_start_steps(r.steps)
        kept = [s for s in steps if s.index not in starts]
        if len(kept) >= 2:
            steps = kept
    if not steps:
        return None
    total = sum(s.total_s for s in steps)
    data = sum(s.data_s for s in steps)
    if total <= 0:
        return None
    n = len(steps)
    return data / total, data / n, (total - data) / n, n


def cpu_only(r) -> bool:
    """The model trains on the CPU (no CUDA training model): DataLoader workers then compete with the
    model's compute for the same cores."""
    models = training_models(r)
    return bool(models) and "cuda" not in device_types(models)


def steady_fetch(loader) -> tuple[float | None, float | None]:
    """(mean wait per batch after each epoch's first, mean first-batch wait) from the loader's own
    counters, or None where they cannot tell."""
    firsts = loader.first_batch_s or []
    rest_n = loader.batches - len(firsts)
    rest = loader.wait_s - sum(firsts)
    steady = rest / rest_n if rest_n > 0 and loader.wait_s > 0 else None
    first = sum(firsts) / len(firsts) if firsts else None
    return steady, first


def run_batches(ev, loader, steps: int) -> int | None:
    """The batches the loader serves in the script's run: those fetched, when the script ended by itself; when
    it was cut (diag's --steps or --max-time, an interrupt) or still runs, at least a whole epoch
    (len(dataset) / batch_size), or None when the loader cannot tell its epoch (the script's own run goes
    on past what was observed)."""
    fetched = max(loader.batches, steps)
    if ev.run.status in ("completed", "failed", "oom"):     # the script ended by itself: its run is what it is
        return fetched
    if loader.iterable_dataset or not loader.dataset_len or not loader.batch_size:
        return None
    per_epoch = loader.dataset_len // loader.batch_size if loader.drop_last else \
        -(-loader.dataset_len // loader.batch_size)
    return max(fetched, per_epoch)


@check(id="dataloader.workers", title="Training waits for data", severity="warning",
       needs=["ranks.steps", "ranks.dataloaders", "environment.cpu_count"], tags=["data"],
       docs=guide("enable-asynchronous-data-loading-and-augmentation"))
def dataloader_workers(ctx):
    """Share of step time the training steps spend waiting in DataLoader.__next__ for the
    *training* loader (the loader whose batches fed training steps, not evaluation loaders: their
    waits are the evaluation phase's): the median over the steady training steps of data wait / step
    time (RankEvidence.data_wait_share(), the one share every check reads; the warm-up steps out (docs/steps.md), and with
    workers the steps that fetched an epoch's first batch: dataloader.persistent-workers judges those).
    Warning at >= 10% of step time, error at >= 30% when it holds on three steps in four; info with
    fewer than 3 timed steps (a first batch's one-off cost cannot be told from a steady wait), and info when
    the whole run's steady wait (per-step wait x batches; a run diag cut counts a whole epoch at least) is
    under 20 ms, what starting worker processes takes at the least (a short run cannot win them back; its
    share flips with load). Passes when the wait is negligible (under 10%,
    or under 0.5 ms per step: a worker's hand-over costs about that), even with num_workers=0. Recommends a num_workers from the measured per-batch fetch time (f = wait with 0
    workers; f = w x (compute + wait) with w workers), sized for 1.5x the compute rate and capped at
    the usable CPUs minus one, and predicts the step time after it. On a CPU-only run the workers share
    the cores with the model's compute: the cap is half the CPUs, the text says so, the snippet has
    no pin_memory, and a loader already at that cap gets an info (more workers cannot help). Under
    the Hugging Face Trainer or Lightning the fix names their arguments. In an evaluation-only run
    (an evaluation or batch-inference script) the evaluation loader is judged the same way, on the
    evaluation steps: the median share of each evaluation step spent waiting for its batch (skipped
    with fewer than 6 timed evaluation steps: too few to tell the pipeline from the machine's load)."""
    ev = ctx.evidence
    r = ev.primary
    if not r.dataloaders:
        yield ctx.skip("No DataLoader was iterated (see dataloader.main-thread-data for hand-made batching).")
        return
    loader = r.training_loader()    # the loader whose batches fed training steps, not the biggest
    if loader is None and ev.run_kind() == "evaluation":
        yield from _eval_workers(ctx, ev, r)
        return
    if loader is None:
        yield ctx.skip(f"No DataLoader fed the training steps ({len(r.dataloaders)} evaluation DataLoader(s) only).")
        return
    share = data_share(r)
    if share is None:
        yield ctx.skip("No training step was observed.")
        return
    frac, wait, compute, n = share
    cpus = ev.environment.cpu_count
    on_cpu = cpu_only(r)
    fw = framework_of(ev)
    steady, first = steady_fetch(loader)
    numbers = {"data_share": round(frac, 4), "data_wait_per_step_s": round(wait, 6),
               "compute_per_step_s": round(compute, 6), "steps": n, "num_workers": loader.num_workers,
               "cpu_count": cpus, "batch_size": loader.batch_size, "loader_id": loader.id,
               "cpu_training": on_cpu, "framework": fw,
               "wait_per_batch_steady_s": round(steady, 6) if steady is not None else None,
               "first_batch_mean_s": round(first, 6) if first is not None else None}
    dw = data_wait(r)   # on CUDA runs with a device timeline: judged on GPU idle caused by data wait
    numbers.update(dw.evidence())
    if dw.hidden(WARN_SHARE):
        yield ctx.passed(f"The host waited for data {pct(dw.host_share)} of step time, but the wait is hidden: "
                         f"the GPU idled {pct(dw.share)} of the step for it (device clock).", **numbers,
                         title="Data wait hidden behind GPU work")
        return
    if dw.clock == "device":
        frac = dw.share
    if frac < WARN_SHARE or wait < MIN_MAIN_THREAD_GAP_S:
        # under 0.5 ms per step there is nothing workers can win back: handing a batch over from a
        # worker process costs about as much
        yield ctx.passed(f"The model waited for data {pct(frac)} of step time ({ms(wait)} per step, "
                     f"num_workers={loader.num_workers}).", **numbers, title="Data arrives in time")
        if ev.run_kind() == "training+evaluation":   # the evaluation loader's own wait (73% of an eval step)
            yield from _eval_workers(ctx, ev, r, beside_training=True)
        return
    contention = host_contention(ev)
    lead, snippet, _ = words(ev, ctx.id, n=recommended_workers(loader.num_workers, wait, compute, cpus, on_cpu),
                             batch_size=loader.batch_size)   # the knob has the check's id
    a = advice(num_workers=loader.num_workers, wait=wait, compute=compute, cpus=cpus, on_cpu=on_cpu,
               contention=contention, lead=lead, snippet=snippet,
               pin_word="dataloader_pin_memory=True" if fw == "transformers" else "pin_memory=True")
    rec, f, predicted = a["rec"], a["fetch_s"], a["predicted_s"]
    numbers.update(recommended_workers=rec if a["helps"] else None, fetch_per_batch_s=round(f, 6),
                   predicted_step_s=round(predicted, 6) if predicted else None,
                   predicted_speedup=round((wait + compute) / predicted, 2) if predicted else None,
                   host=contention, workers_help=a["helps"])
    if a["helps"]:
        numbers["knob"] = ctx.id
    # an error must hold under load: three steps in four past the line, on a host that was not contended
    shares = [s.data_s / s.total_s for s in r.timed_steps() if s.total_s > 0]
    q1 = quartile_low(shares)
    numbers["data_share_q1"] = round(q1, 4) if q1 is not None else None
    if dw.clock == "device":      # GPU idle for data, on the device clock: not the host's load
        sev = Severity.ERROR if frac >= ERROR_SHARE else Severity.WARNING
    else:
        sev = Severity.ERROR if frac >= ERROR_SHARE and holds_as_error(shares, ERROR_SHARE, contention) \
            else Severity.WARNING
    if a["why_not"] == "at-cap" and on_cpu:
        # the workers already take the cores the model's compute leaves: more cannot help, and the
        # wait measures core contention as much as the pipeline (info, not a warning)
        sev = Severity.INFO
    elif a["why_not"] == "contended":
        sev = Severity.INFO if on_cpu else Severity.WARNING
    few = n < MIN_STEADY
    if few:
        sev = Severity.INFO     # a first batch's one-off cost (worker start, a cold read) weighs as much as the rest
    # the whole run's steady wait against what starting the workers costs: a short run (4 batches of 0.5 ms)
    # loses less to the wait than a worker's start takes, whatever the share says (and its share flips with load)
    batches = run_batches(ev, loader, n)
    at_stake = wait * batches if batches is not None else None
    numbers["run_wait_at_stake_s"] = round(at_stake, 6) if at_stake is not None else None
    short_run = a["helps"] and at_stake is not None and at_stake < WORKER_START_S
    if short_run:
        sev = Severity.INFO
    fix, snippet = a["fix"], a["snippet"]
    site, fl = fix_site(ev, loader)      # the DataLoader(...) call, or the script's own --num-workers flag
    if fl and a["helps"]:
        fix += f" This script has its own flag for it: run it with {fl['flag']} {rec} (defined at line {fl['line']})."
        numbers["script_flag"] = fl["flag"]
    yield ctx.finding(
        severity=sev,
        message=f"The model waited for data {pct(frac)} of step time ({ms(wait)} of {ms(wait + compute)} "
                f"per step over {n} steps) with num_workers={loader.num_workers} on {cpus} CPUs."
                + dw.sentence()
                + (f" During the run {contention_words(contention)}: the wait is the machine's load as much as "
                   "the pipeline's, and a worker count will not help." if a["why_not"] == "contended" else "")
                + (f" Only {n} step(s) were timed: too few to tell a steady wait from the first batches' one-off "
                   "cost; run more steps to confirm." if few else "")
                + (f" Over this run's {batches} batches that is {ms(at_stake or 0.0)} in all, less than "
                   f"starting worker processes takes (~{ms(WORKER_START_S)} or more): in a run this short workers "
                   "cannot pay for themselves; judge a run with more batches." if short_run and not few else ""),
        evidence=numbers,
        why="While the main process fetches and collates the next batch, the model does nothing; "
            "this time is lost on every step.",
        fix=fix, snippet=snippet,
        location=loc(site or loader.location or (framework_entry(ev) if fw else None)),
    )
    if ev.run_kind() == "training+evaluation":
        yield from _eval_workers(ctx, ev, r, beside_training=True)


def _eval_workers(ctx, ev, r, beside_training: bool = False):
    """dataloader.workers for an evaluation-only run: the evaluation loader, judged on the evaluation
    steps (data wait / step, median of the steady ones). ``beside_training``: the evaluation passes of
    a training run, judged after the training loader: at most an info (the evaluation's share of the
    run is in the message), and nothing at all (no pass, no skip) when there is nothing to say."""
    loaders = r.eval_loaders()
    tp = r.eval_throughput()
    if not loaders or tp is None or tp.get("data_share") is None:
        if not beside_training:
            yield ctx.skip("An evaluation run with no evaluation step fed by a DataLoader.")
        return
    timed = sum(1 for s in r.eval_steps if not s.instrumented)
    if beside_training and (timed < EVAL_MIN_STEPS or tp["data_share"] < WARN_SHARE
                            or (tp["phases"] or {}).get("data_s", 0.0) < MIN_MAIN_THREAD_GAP_S):
        return
    if timed < EVAL_MIN_STEPS:
        # a median over a handful of sub-millisecond waits is the machine's load, not the pipeline
        yield ctx.skip(f"Only {timed} evaluation step(s) were timed: too few to judge the evaluation's data "
                       f"wait (needs {EVAL_MIN_STEPS}).")
        return
    loader = max(loaders, key=lambda d: (d.wait_s, d.batches))
    ph = tp["phases"]
    frac, wait = tp["data_share"], ph["data_s"]
    compute = max(ph["total_s"] - wait, 0.0)
    cpus = ev.environment.cpu_count
    on_cpu = not any(str(d).startswith("cuda") for m in r.models for d in m.devices)
    numbers = {"data_share": round(frac, 4), "data_wait_per_step_s": round(wait, 6),
               "compute_per_step_s": round(compute, 6), "steps": tp["steps"], "num_workers": loader.num_workers,
               "cpu_count": cpus, "batch_size": loader.batch_size, "loader_id": loader.id, "cpu_training": on_cpu,
               "evaluation": True}
    if frac < WARN_SHARE or wait < MIN_MAIN_THREAD_GAP_S:
        yield ctx.passed(f"Evaluation waited for data {pct(frac)} of each evaluation step ({ms(wait)} per batch, "
                         f"num_workers={loader.num_workers}).", **numbers, title="Evaluation data arrives in time")
        return
    contention = host_contention(ev)
    rec0 = recommended_workers(loader.num_workers, wait, compute, cpus, on_cpu)
    a = advice(num_workers=loader.num_workers, wait=wait, compute=compute, cpus=cpus, on_cpu=on_cpu,
               contention=contention, evaluation=True,
               lead=f"val_loader = DataLoader(val_set, batch_size={loader.batch_size}, num_workers={rec0}).",
               snippet=f"val_loader = DataLoader(val_set, batch_size={loader.batch_size}, num_workers={rec0})")
    rec, f, predicted = a["rec"], a["fetch_s"], a["predicted_s"]
    numbers.update(recommended_workers=rec if a["helps"] else None, fetch_per_batch_s=round(f, 6),
                   predicted_step_s=round(predicted, 6) if predicted else None, host=contention,
                   workers_help=a["helps"])
    # an error must hold under load (the eval-only ERROR on a busy machine: data 1 ms of a 32 ms step
    # when quiet): three evaluation steps in four past the line, on a host that was not contended
    steps = [x for x in r.eval_steps if not x.instrumented]
    shares = [x.data_s / x.total_s for x in (steps[1:] if len(steps) > 3 else steps) if x.total_s > 0]
    q1 = quartile_low(shares)
    numbers["data_share_q1"] = round(q1, 4) if q1 is not None else None
    sev = Severity.ERROR if frac >= ERROR_SHARE and holds_as_error(shares, ERROR_SHARE, contention) else Severity.WARNING
    if a["why_not"] == "at-cap" and on_cpu or a["why_not"] == "contended" and on_cpu:
        sev = Severity.INFO
    fix, snippet = a["fix"], a["snippet"]
    site, fl = fix_site(ev, loader)
    if fl and a["helps"]:
        fix += f" This script has its own flag for it: run it with {fl['flag']} {rec} (defined at line {fl['line']})."
    share = r.eval_share() if beside_training else None
    if beside_training:
        # the evaluation passes of a training run: an info, sized by the evaluation's share of the run
        sev = Severity.INFO
        numbers.update(eval_share_of_run=round(share["share"], 4) if share else None)
    yield ctx.finding(
        severity=sev, title="Evaluation waits for data",
        message=f"Evaluation waited for data {pct(frac)} of each evaluation step ({ms(wait)} of {ms(wait + compute)} "
                f"per batch over {tp['steps']} batches) with num_workers={loader.num_workers} on {cpus} CPUs."
                + (f" Evaluation takes {pct(share['share'])} of the run's time." if share else "")
                + (f" During the run {contention_words(contention)}: the wait is the machine's load as much as "
                   "the pipeline's, and a worker count will not help." if a["why_not"] == "contended" else ""),
        evidence=numbers,
        why="While the main process loads and collates the next evaluation batch, the model does nothing.",
        fix=fix, snippet=snippet, location=loc(site or loader.location),
    )


def _batch_bytes(r) -> int | None:
    """Bytes of the first tensor input of the main training forward (from its recorded shape)."""
    sizes = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8, "int64": 8,
             "long": 8, "int32": 4, "int": 4, "uint8": 1, "int8": 1, "bool": 1, "int16": 2}
    sites = [s for s in training_sites(r) if s.input_shapes]
    if not sites:
        return None
    s = max(sites, key=lambda x: x.count)
    n = 1
    for d in s.input_shapes[0]:
        n *= int(d)
    return n * sizes.get(s.input_dtypes[0] if s.input_dtypes else "float32", 4)


@check(id="dataloader.pin-memory", title="Host-to-GPU copies from pageable memory", severity="warning",
       needs=["ranks.dataloaders", "ranks.models", "ranks.extras.copies", "ranks.steps"], tags=["data", "gpu"],
       docs=PIN_DOCS,
       requires=[cuda_training("pinned memory only speeds up host-to-GPU copies.")])
def dataloader_pin_memory(ctx):
    """CUDA training whose DataLoader does not pin memory, or `.to(device, non_blocking=True)` from
    pageable (unpinned) memory, which silently runs synchronously. Sized by the estimated copy time
    per step (measured host-to-device bytes per step, else the batch's size, at ~12 GB/s pageable vs
    ~24 GB/s pinned over PCIe 4.0): warning when it is >= 5% of the step, info below. On CUDA runs with
    a device timeline whose copy window timed pageable copies, sized instead by the GPU idle time those
    copies measured on the device clock (``evidence.clock: "device"``), pinned copies reported beside.
    Skipped when the model does not train on CUDA."""
    ev = ctx.evidence
    r = ev.primary
    copies = (r.extras or {}).get("copies") or {}
    loaders = [d for d in r.dataloaders if d.batches > 0]
    unpinned = [d for d in loaders if not d.pin_memory]
    pageable_nb = int(copies.get("non_blocking_pageable", 0) or 0)
    ph = r.median_step()
    step_s = ph["total_s"] if ph else None
    csteps = int(copies.get("steps", 0) or 0) if copies.get("watched", True) else 0
    per_step = (copies.get("h2d_bytes", 0) / csteps) if csteps and copies.get("h2d_bytes") else _batch_bytes(r)
    est = per_step / PAGEABLE_BPS if per_step else None
    saving = per_step * (1 / PAGEABLE_BPS - 1 / PINNED_BPS) if per_step else None
    share = est / step_s if est is not None and step_s else None
    numbers = {"loaders_unpinned": len(unpinned), "loaders": len(loaders),
               "non_blocking_pageable_copies": pageable_nb,
               "non_blocking_pinned_copies": copies.get("non_blocking_pinned"),
               "h2d_bytes_per_step": int(per_step) if per_step else None,
               "h2d_bytes_measured": bool(csteps and copies.get("h2d_bytes")),
               "est_pageable_copy_s": round(est, 7) if est is not None else None,
               "est_saving_s": round(saving, 7) if saving is not None else None,
               "copy_share_of_step": round(share, 4) if share is not None else None,
               "step_s": round(step_s, 6) if step_s else None, "clock": "host"}
    # the device clock: copies timed with CUDA events in the copy window (diag.timeline.CopyCost)
    tl = gpu_timeline(r)
    cc = tl.copies if tl is not None else None
    if cc is not None:
        numbers.update(copies_device=cc.as_dict(), gpu_idle_pageable_copy_share=round(cc.pageable_share, 4),
                       gpu_idle_pinned_copy_share=round(cc.pinned_share, 4))
    device = cc is not None and cc.pageable_n > 0
    if not unpinned and not pageable_nb:
        if not loaders and not copies:
            yield ctx.skip("No DataLoader fed the training and host-to-device copies were not "
                                      f"recorded ({PERF_MISSING}).")
            return
        pinned = (f" On the device clock pinned copies take {pct(cc.pinned_share)} of the step."
                  if cc is not None and cc.pinned_n else "")
        yield ctx.passed("Every DataLoader pins its batches and no non_blocking copy came from pageable memory."
                         + pinned, **numbers, title="Copies come from pinned memory")
        return
    if device:
        share = cc.pageable_share
        numbers["clock"] = "device"
    sev = Severity.WARNING if share is None or share >= PIN_WARN_SHARE else Severity.INFO
    parts = []
    if unpinned:
        d = unpinned[0]
        parts.append(f"{len(unpinned)} DataLoader(s) feeding CUDA training do not pin memory"
                     + (f" ({short_file(d.location)})" if d.location else ""))
    sites = copies.get("sites") or []
    if pageable_nb:
        where = f" at {short_file(sites[0])}" if sites else ""
        parts.append(f"{pageable_nb} non_blocking copies (.to(..., non_blocking=True) or .copy_) came from "
                     f"pageable memory{where}, so they ran synchronously")
    size = (f"; about {per_step / (1 << 20):.1f} MiB cross per step, an estimated {ms(est)} "
            f"({pct(share)} of the {ms(step_s)} step) at pageable-copy speed") if share is not None else ""
    if device:
        d = cc.as_dict()["pageable"]
        size = (f"; on the device clock the GPU sat idle {pct(cc.pageable_share)} of the step in pageable copies "
                f"({ms(d['seconds_per_step'])} and {d['bytes_per_step'] / (1 << 20):.1f} MiB per step"
                + (f", {d['gb_per_s']:.1f} GB/s" if d["gb_per_s"] else "") + f"; measured over {cc.steps} steps)")
        if cc.pinned_n:
            size += f", pinned copies {pct(cc.pinned_share)}"
    location = loc(sites[0]) if pageable_nb and sites else loc(unpinned[0].location) if unpinned else None
    fw = framework_of(ev)
    fix, snippet, _ = words(ev, ctx.id)   # the knob has the check's id
    if fw and not unpinned:
        # the framework's loaders are pinned: the pageable copies are the script's own tensors
        fix, snippet = ("Call .pin_memory() on the tensors the script copies with non_blocking=True (a pinned "
                        "buffer reused every step), or copy them without non_blocking.",
                        "x = x.pin_memory()\nx = x.to(device, non_blocking=True)")
    elif fw and pageable_nb:
        fix += " For tensors the script copies itself, call .pin_memory() before the non_blocking copy."
    numbers.update(framework=fw, knob=ctx.id)
    if location is None and fw:
        location = loc(framework_entry(ev))
    yield ctx.finding(
        severity=sev,
        message="; ".join(parts) + size + ".",
        evidence=numbers,
        why="A copy from pageable memory is staged through a pinned buffer by the driver, at about half "
            "the bandwidth, and blocks the CPU; only pinned memory lets non_blocking copies overlap with "
            "compute.",
        fix=fix, snippet=snippet, location=location,
    )


@check(id="dataloader.persistent-workers", title="DataLoader workers re-spawned every epoch",
       severity="warning", needs=["ranks.dataloaders.first_batch_s", "ranks.steps"], tags=["data"],
       docs=DATALOADER_DOCS)
def dataloader_persistent_workers(ctx):
    """A DataLoader with num_workers > 0 and persistent_workers=False starts its worker processes
    again at every epoch: the first batch of each epoch after the first waits for the start-up.
    Measured per epoch from the first-batch latency minus the steady per-batch wait, as a share of
    the epoch's time (batches per epoch x median step): warning at >= 5%, info at >= 1%.
    Skipped when no loader has workers or fewer than two epochs were seen."""
    ev = ctx.evidence
    r = ev.primary
    if not r.dataloaders:
        yield ctx.skip("No DataLoader was iterated.")
        return
    workers = [d for d in r.dataloaders if d.num_workers > 0]
    if not workers:
        yield ctx.skip("No DataLoader uses worker processes (num_workers=0): nothing is re-spawned.")
        return
    non_persistent = [d for d in workers if not d.persistent_workers]
    if not non_persistent:
        yield ctx.passed(f"{len(workers)} DataLoader(s) with workers keep them alive between epochs.", title="Workers persist across epochs")
        return
    multi = [d for d in non_persistent if d.epochs >= 2 and len(d.first_batch_s) >= 2]
    if not multi:
        d = non_persistent[0]
        yield ctx.skip(f"The DataLoader with {d.num_workers} workers was iterated for {d.epochs} "
                                  "epoch(s): the re-spawn cost shows from the second epoch (run longer).",
                      epochs=d.epochs)
        return
    ph = r.median_step()
    step_s = ph["total_s"] if ph else None
    worst = None
    for d in multi:
        steady, _ = steady_fetch(d)
        later = d.first_batch_s[1:]
        cost = max(median(later) - (steady or 0.0), 0.0)
        per_epoch_batches = d.batches / max(d.epochs, 1)
        epoch_s = per_epoch_batches * step_s if step_s else None
        share = cost / epoch_s if epoch_s else None
        rec = (d, cost, share, epoch_s, steady, per_epoch_batches)
        if worst is None or (share or 0) > (worst[2] or 0):
            worst = rec
    d, cost, share, epoch_s, steady, per_epoch = worst
    numbers = {"num_workers": d.num_workers, "epochs": d.epochs, "first_batch_s": d.first_batch_s[:20],
               "respawn_cost_per_epoch_s": round(cost, 6),
               "steady_wait_per_batch_s": round(steady, 6) if steady is not None else None,
               "batches_per_epoch": round(per_epoch, 1),
               "epoch_s": round(epoch_s, 4) if epoch_s else None,
               "share_of_epoch": round(share, 4) if share is not None else None}
    if share is None:
        yield ctx.skip("No training step time to compare the re-spawn cost with.", **numbers)
        return
    if share < RESPAWN_INFO_SHARE:
        yield ctx.passed(f"Starting {d.num_workers} workers costs {ms(cost)} per epoch, {pct(share)} of an epoch.",
                     **numbers, title="Worker start-up is negligible")
        return
    sev = Severity.WARNING if share >= RESPAWN_WARN_SHARE else Severity.INFO
    fw = framework_of(ev)
    fix, snippet, _ = words(ev, ctx.id, n=d.num_workers, batch_size=d.batch_size)   # the knob has the check's id
    numbers.update(framework=fw, knob=ctx.id)
    yield ctx.finding(
        severity=sev,
        message=f"The DataLoader re-spawns its {d.num_workers} workers every epoch: the first batch of epochs "
                f"2-{d.epochs} waited {ms(median(d.first_batch_s[1:]))} against {ms(steady or 0.0)} for a "
                f"steady batch, {ms(cost)} lost per epoch ({pct(share)} of a {ms(epoch_s)} epoch).",
        evidence=numbers,
        why="Without persistent_workers, every new iterator (every epoch) forks the workers again, "
            "re-imports and re-builds their state, and the model waits for the first batch.",
        fix=fix, snippet=snippet, location=loc(d.location or (framework_entry(ev) if fw else None)),
    )


@check(id="dataloader.main-thread-data", title="Batches built in the training loop", severity="warning",
       needs=["ranks.steps.extra.pre_forward_s", "ranks.dataloaders"], tags=["data"],
       docs=guide("enable-asynchronous-data-loading-and-augmentation"))
def dataloader_main_thread_data(ctx):
    """Time between the end of one step and the first training forward of the next that is neither
    DataLoader wait nor evaluation: the main thread building or moving the batch (indexing a dataset
    by hand, torch.stack of samples, tokenising, augmenting, `.to(device)`), while the model waits.
    Median share of step time over the timed steps: warning at >= 10%, error at >= 30% when it holds on
    three steps in four; gaps under 0.5 ms pass whatever the share (a DataLoader's own per-batch cost
    is of that order). Each step's gap is taken less the probe's own time in that step (``probe_s``: a
    lower bound of the script's own work there). With fewer than 3 timed steps a finding is info at
    most: a one-off in the first steps (a first batch read from a cold disk, a lazy import) cannot be
    told from a steady cost."""
    ev = ctx.evidence
    r = ev.primary
    steps = r.timed_steps()
    if not steps:
        yield ctx.skip("No training step was observed.")
        return
    pairs = [(s, s.extra.get("pre_forward_s")) for s in steps if isinstance(s.extra, dict)]
    pairs = [(s, max(g - (s.probe_s or 0.0), 0.0)) for s, g in pairs if isinstance(g, (int, float))]
    gaps = [g for _, g in pairs]
    if not gaps:
        reason = PERF_MISSING if not perf_ran(r) else "no step recorded the time before its first forward"
        yield ctx.skip(f"The time before each step's forward was not measured: {reason}.")
        return
    gap = median(gaps)
    total = median([s.total_s for s in steps])
    share = gap / total if total > 0 else 0.0
    loaders = [d for d in r.dataloaders if d.batches > 0]
    other = median([s.other_s for s in steps])
    numbers = {"pre_forward_share": round(share, 4), "pre_forward_s": round(gap, 6), "step_s": round(total, 6),
               "other_share": round(other / total, 4) if total > 0 else None, "steps": len(gaps),
               "dataloader": bool(loaders)}
    dw = data_wait(r)   # device clock: the GPU idle of data, copies and the code between steps
    tl = dw.summary
    if tl is not None:
        dev_share = sum(tl.causes.get(k, 0.0) for k in ("data", "h2d", "h2d_pinned", "host", "sync"))
        numbers.update(dw.evidence(), gpu_idle_main_thread_share=round(dev_share, 4))
        if share >= WARN_SHARE and dev_share < WARN_SHARE:
            yield ctx.passed(f"{pct(share)} of step time ({ms(gap)}) passes between a step's end and the next forward "
                             f"on the host, but it is hidden: the GPU idled {pct(dev_share)} of the step outside its "
                             "kernels (device clock).", **numbers, title="Main-thread work hidden behind GPU work")
            return
    if share < WARN_SHARE or gap < MIN_MAIN_THREAD_GAP_S:
        yield ctx.passed(f"{pct(share)} of step time ({ms(gap)}) passes between a step's end and the next "
                     "forward outside the DataLoader.", **numbers, title="Little work between steps")
        return
    # an error must hold on the run's own spread (three steps in four past the line), not on one median
    shares = [g / s.total_s for s, g in pairs if s.total_s > 0]
    sev = Severity.ERROR if share >= ERROR_SHARE and holds_as_error(shares, ERROR_SHARE, None) else Severity.WARNING
    few = len(gaps) < MIN_STEADY
    if few:
        sev = Severity.INFO
    site = max(training_sites(r), key=lambda s: s.count, default=None)
    where = f" before the forward at {short_file(site.location)}" if site and site.location else ""
    fw = framework_of(ev)
    if fw is not None:
        # the gap is inside the framework's loop (its hooks, logging, input preparation between the
        # batch and the model), not the script's batch code: said as such, info at most
        numbers["framework"] = fw
        yield ctx.finding(
            severity=Severity.INFO, title="Framework overhead between batch and forward",
            message=f"{pct(share)} of step time ({ms(gap)} of {ms(total)}) passes between the DataLoader and "
                    f"the forward inside {NAMES.get(fw, fw)}'s training loop (its own per-step work: callbacks, "
                    "logging, moving the batch), not in the script's code.",
            evidence=numbers,
            why="A framework runs hooks and bookkeeping around every step; on very short steps that is a "
                "visible share, and it shrinks relative to the step as the model or batch grows.",
            fix="Nothing in the script builds batches here. If the share matters, make steps longer (a larger "
                "batch) or reduce per-step logging and callbacks.",
            location=loc(framework_entry(ev)))
        return
    if loaders:
        msg = (f"{pct(share)} of step time ({ms(gap)} of {ms(total)}) goes to work in the main thread "
               f"between the DataLoader and the forward{where} (moving, augmenting or reshaping batches).")
        fix = ("Move per-batch work into the Dataset/collate_fn so DataLoader workers do it in parallel, "
               "or onto the GPU; copy with pin_memory=True and non_blocking=True.")
        snippet = ("def collate(samples):\n    x, y = default_collate(samples)\n    return augment(x), y   # runs in the workers\n"
                   "loader = DataLoader(ds, batch_size=B, num_workers=4, collate_fn=collate, pin_memory=True)")
    else:
        msg = (f"{pct(share)} of step time ({ms(gap)} of {ms(total)}) is spent in the main thread between "
               f"steps{where}, with no DataLoader: the batch is built by hand while the model waits.")
        fix = ("Put the per-sample work in a torch.utils.data.Dataset and iterate a DataLoader with "
               "num_workers > 0, so batches are prepared in parallel with training.")
        snippet = ("class MyData(torch.utils.data.Dataset):\n    def __len__(self): return len(items)\n"
                   "    def __getitem__(self, i): return load(items[i])\n"
                   "loader = DataLoader(MyData(), batch_size=B, shuffle=True, num_workers=4,\n"
                   "                    pin_memory=True, persistent_workers=True)\n"
                   "for x, y in loader:\n    ...")
    if few:
        msg += (f" Only {len(gaps)} step(s) were timed: too few to tell a steady cost from the first steps' "
                "one-off work; run more steps to confirm.")
    yield ctx.finding(severity=sev, message=msg, evidence=numbers,
                  why="The model (and the GPU) idles while the main thread prepares the next batch; "
                      "worker processes overlap that work with training.",
                  fix=fix, snippet=snippet, location=loc(site.location) if site else None)
