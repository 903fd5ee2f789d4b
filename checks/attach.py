"""Checks over evidence sampled from outside a running job (``diag attach``, ``run.source == "attach"``).

Stack samples give shares of time per phase, not timings, so these checks judge shares with their
confidence (the number of samples). Three kinds:

* ``run.hung`` and ``attach.phases``: new ids, for attached evidence only (``sources=["attach"]``: the
  registry reports them skipped on the probe's evidence).
* Attach variants of the usual ids (``dataloader.workers``, ``sync.host-device``,
  ``gpu.low-utilization``, ``distributed.straggler``): each is registered under an ``attach.*`` id and
  declared with ``replaces=`` the usual id, so on attached evidence it answers under the usual id in
  place of the probe's check, and on the probe's evidence the probe's check answers.

Every other check that reads what only the probe records is reported ``skipped`` "Not observable by
sampling" by the registry itself (see ``sources`` in diag.checks.api), for ``diag attach`` and
``diag check --from`` alike.

The attach section of a rank (``rank.extras["attach"]``) is documented in docs/attach.md.
"""
from __future__ import annotations

import math

from diag.checks.api import Location, Severity, check, fmt_pct as pct

from ._workers import advice, contention_words, host_contention, recommended_workers

DOCS = "docs/attach.md"
DATA_WARN = 0.25        # share of main-thread samples waiting for the DataLoader
DATA_INFO = 0.10
SYNC_WARN = 0.10        # share of samples on lines that synchronise with the GPU
SYNC_INFO = 0.02
WORKERS_SATURATED = 0.80   # busy share / CPU fraction of a worker
WORKERS_IDLE = 0.30
GPU_LOW_UTIL = 50.0     # mean % over the window on the devices the job uses
STRAGGLER_GAP = 0.20    # the others wait this much more (share of samples) than the odd rank


def _att(rank) -> dict:
    return (rank.extras or {}).get("attach") or {}


def _share(main: dict, *phases: str) -> float:
    ph = main.get("phases") or {}
    return sum(float((ph.get(p) or {}).get("share", 0.0)) for p in phases)


def _margin(share: float, n: int) -> float:
    """Half-width of a 95% interval for a share estimated from n samples (normal approximation)."""
    if n <= 0:
        return 1.0
    return 1.96 * math.sqrt(max(share * (1 - share), 0.25 / n) / n)


def _loc(d: dict | None) -> Location | None:
    if not d:
        return None
    return Location(file=d.get("file") or "?", line=d.get("line"), function=d.get("function"))


def _where(d: dict | None) -> str:
    if not d:
        return "an unknown line"
    code = f" `{d['code']}`" if d.get("code") else ""
    return f"{d.get('file', '?').rsplit('/', 1)[-1]}:{d.get('line')}{code}"


def _uses_cuda(ev) -> bool:
    """The sampled job holds a GPU (NVML saw one of its processes on a device): else a CPU run."""
    g = ev.gpu
    procs = (g.processes if g is not None else None) or {}
    return bool(procs.get("gpu")) or any(d.get("used_by_run") for d in ((g.devices if g is not None else None) or []))


def _label(ev, r) -> str:
    return f"rank {r.rank}" if ev.multi_rank else f"PID {_att(r).get('pid', r.pid)}"


# A process that waits (a lock, a queue, a collective) uses almost no CPU; one that spends the whole
# window in one call of its own (a busy loop, a long decode) uses its core, or what a loaded machine
# leaves of it: 2 cores shared by 5 busy processes give each ~40%, so the line is drawn well below 50%.
BUSY_CPU_PERCENT = 20.0


def _busy_in_one_call(r, s) -> bool:
    """The main thread showed one stack for the whole window (``s``: its ``stuck`` record) while the
    process computed: a long call or a busy loop, not a wait."""
    return ((_att(r).get("cpu_percent") or 0) >= BUSY_CPU_PERCENT
            and s.get("phase") in ("forward", "backward", "optimizer", "evaluation", "data", "other"))


def _unjudged(ev, r, main: dict) -> str | None:
    """Why a rank's main thread gives nothing to judge a share on (no sample; one stack for the whole
    window while the process waited: run.hung says where), else None. A busy one-line window (a slow
    ``__getitem__`` on a short window) is judged like any other, its shares being the whole window's."""
    if not int(main.get("samples") or 0):
        return f"No sample of {_label(ev, r)}'s main thread was taken."
    if main.get("stuck") and not _busy_in_one_call(r, main["stuck"]):
        return f"{_label(ev, r)}: no moving main thread to judge (see run.hung)."
    return None


# ---- new ids ------------------------------------------------------------------------------------------

@check(id="run.hung", title="The job is stuck", severity="error", needs=["ranks.extras.attach.main"],
       tags=["run", "attach"], docs=DOCS, sources=["attach"])
def run_hung(ctx):
    """The main thread of a sampled process showed the same stack for the whole window (every sample,
    1 in 100 excepted unless it shows another training phase; not a ``sleep``): the job is stuck there (a lock, a blocking
    queue get, a collective that another rank never joins). Error, with the line, what it waits on
    and for how long at least. Warning when the stack moved but no step-like cycle (data -> forward ->
    backward -> optimizer and back) was seen in the window."""
    ev = ctx.evidence
    title = "The job is stuck"
    stuck = []
    no_cycle = []
    ok = []
    for r in ev.ranks:
        a = _att(r)
        main = a.get("main") or {}
        if (main.get("samples") or 0) == 0:
            continue
        if main.get("stuck"):
            stuck.append((r, main["stuck"]))
        elif (main.get("cycles") or 0) == 0 and _share(main, "forward", "backward", "optimizer", "data") < 0.05:
            no_cycle.append((r, main))
        else:
            ok.append((r, main))
    if not stuck and not no_cycle and not ok:
        yield ctx.skip("No sample of a main thread was taken.", title=title)
        return
    cycling = [r for r, m in ok if (m.get("cycles") or 0) > 0]
    if stuck and cycling:
        # one stack for the whole window on some ranks while another rank completes steps: they wait
        # for it at the next collective (DDP's all-reduce in backward): slow, not hung
        waiting = ", ".join(_label(ev, r) for r, _ in stuck)
        yield ctx.finding(severity=Severity.PASS, title="The job is making progress",
                      message=f"{waiting} spent the whole window at one place while "
                          f"{', '.join(_label(ev, r) for r in cycling)} kept stepping: they wait for it "
                          "(see distributed.straggler).",
                      evidence={"waiting_ranks": [r.rank for r, _ in stuck],
                            "moving_ranks": [r.rank for r in cycling]})
        return
    busy = [(r, s) for r, s in stuck if _busy_in_one_call(r, s)]
    if stuck and len(busy) == len(stuck) and not ev.multi_rank:
        r, s = busy[0]
        yield ctx.finding(
            severity=Severity.WARNING, title="One line for the whole window",
            message=f"{_label(ev, r)} was at one line, {_where(s.get('where'))}, in every sample of the window "
                    f"({s.get('seconds_at_least'):g} s) while using {_att(r).get('cpu_percent'):.0f}% CPU: one "
                    "long operation, a busy loop, or that line run over and over (a data-bound loop at this "
                    "sample rate); not a wait.",
            evidence={"rank": r.rank, "where": s.get("where"), "cpu_percent": _att(r).get("cpu_percent"),
                      "stack": s.get("stack")},
            fix="Attach again with a longer --duration: if the stack never changes, the job is stuck there.",
            location=_loc(s.get("where")))
        return
    if stuck:
        places = {}
        for r, s in stuck:
            key = (s.get("where") or {}).get("file"), (s.get("where") or {}).get("line"), s.get("waits_on")
            places.setdefault(key, []).append(r)
        parts = []
        for (_f, _l, waits), ranks in places.items():
            s = next(s for r, s in stuck if r in ranks)
            who = ", ".join(_label(ev, r) for r in ranks)
            parts.append(f"{who} at {_where(s.get('where'))} waiting on {waits}")
        odd = None
        if ev.multi_rank:
            moving = [r for r, _ in ok + no_cycle]
            if len(places) > 1:
                # the odd one out: the place where the fewest ranks are
                (_k, odd_ranks) = min(places.items(), key=lambda kv: len(kv[1]))
                if len(odd_ranks) < len(stuck):
                    odd = ", ".join(_label(ev, r) for r in odd_ranks) + " (stuck in a different place from the others)"
            elif moving and stuck:
                odd = ", ".join(_label(ev, r) for r in moving) + " (still moving while the others wait: " \
                      "the likely cause)"
        r0, s0 = stuck[0]
        secs = max((s.get("seconds_at_least") or 0) for _, s in stuck)
        yield ctx.finding(
            severity=Severity.ERROR, title=title,
            message=f"No progress for at least {secs:g} s: " + "; ".join(parts) + "."
                    + (f" Odd one out: {odd}." if odd else ""),
            evidence={"ranks": [{"rank": r.rank, "pid": _att(r).get("pid"), "where": s.get("where"),
                                 "waits_on": s.get("waits_on"), "phase": s.get("phase"),
                                 "seconds_at_least": s.get("seconds_at_least"), "share": s.get("share"),
                                 "stack": s.get("stack")} for r, s in stuck],
                      "odd_one_out": odd, "moving_ranks": [r.rank for r, _ in ok + no_cycle]},
            why="Every sample of the main thread shows the same stack: nothing moves, the job makes no progress.",
            fix="Look at what the line waits on: a lock never released, a queue nobody fills, or a collective "
                "another rank never reaches (a rank that crashed or took another branch). Attach again with a "
                "longer --duration to confirm, and compare ranks with --job.",
            location=_loc(s0.get("where")),
        )
        return
    if no_cycle:
        r, main = no_cycle[0]
        top = (main.get("hot_lines") or [None])[0]
        yield ctx.finding(
            severity=Severity.WARNING, title="No training step seen",
            message=f"{_label(ev, r)} moved but went through no step-like cycle in "
                    f"{_att(r).get('window_s', 0):g} s; its hottest line is {_where(top)}.",
            evidence={"rank": r.rank, "cycles": main.get("cycles"), "phases": main.get("phases"),
                      "hot_line": top},
            why="Outside the training loop (setup, evaluation, checkpointing) this is expected; during "
                "training it means the loop is not reached or is stalled.",
            fix="Attach again with a longer --duration; look at the hottest line.",
            location=_loc(top),
        )
        return
    cycles = sum(m.get("cycles") or 0 for _, m in ok)
    yield ctx.finding(severity=Severity.PASS, title="The job is making progress",
                  message=f"The main thread moved through {cycles} step-like cycle(s) in the window.",
                  evidence={"cycles": cycles})


@check(id="attach.phases", title="Where the time goes (sampled)", severity="info",
       needs=["ranks.extras.attach.main.phases"], tags=["attach", "performance"], docs=DOCS,
       sources=["attach"])
def attach_phases(ctx):
    """The share of the main thread's samples in each phase (data, forward, backward, optimizer,
    evaluation, sync, collective, checkpoint, logging, other) with a 95% margin from the number of
    samples, and the user's hottest lines. Information: the other checks judge it."""
    ev = ctx.evidence
    title = "Where the time goes (sampled)"
    for r in ev.ranks:
        a = _att(r)
        main = a.get("main") or {}
        n = int(main.get("samples") or 0)
        if n == 0:
            yield ctx.skip(f"No sample of {_label(ev, r)}'s main thread was taken.", title=title)
            continue
        ph = main.get("phases") or {}
        ranked = sorted(((p, d.get("share", 0.0)) for p, d in ph.items()), key=lambda x: -x[1])
        text = ", ".join(f"{p} {pct(s)}" for p, s in ranked if s >= 0.01)
        top = (main.get("hot_lines") or [None])[0]
        dom, dom_share = ranked[0] if ranked else ("other", 0.0)
        yield ctx.finding(
            severity=Severity.INFO, title=title,
            message=f"{_label(ev, r)}: {text} of {n} samples (± {pct(_margin(dom_share, n))} on the largest)"
                    + (f"; hottest line {_where(top)} ({pct(top['share'])})" if top else "") + ".",
            evidence={"rank": r.rank, "samples": n, "phases": ph, "dominant": dom,
                      "margin_95": round(_margin(dom_share, n), 4), "hot_lines": main.get("hot_lines") or [],
                      "cpu_percent": a.get("cpu_percent")},
            why="Shares of stack samples, not timings. Not visible in stacks: evaluation run inline under "
                "`with torch.no_grad():` (counted as forward; evaluation in its own function is told apart), "
                "GPU time behind queued kernels (it shows up at the next synchronisation), C++ threads.",
            location=_loc(top),
        )


# ---- attach variants of the usual ids --------------------------------------------------------------------

@check(id="attach.dataloader-workers", title="Training waits for data (sampled)", severity="warning",
       needs=["ranks.extras.attach.main.phases", "ranks.extras.attach.workers"], tags=["data", "attach"],
       docs=DOCS, sources=["attach"], replaces="dataloader.workers")
def attach_dataloader_workers(ctx):
    """Reported as ``dataloader.workers`` for attached evidence. The share of main-thread samples
    waiting on the DataLoader (warning >= 25%, info >= 10%), with what the workers do: saturated
    (busy >= 80% of their samples or CPU) -> more workers or cheaper transforms; idle -> the main
    process is the slow side; no workers -> batches are built in the main process (num_workers=0)."""
    ev = ctx.evidence
    title = "Training waits for data"
    for r in ev.ranks:
        a = _att(r)
        main = a.get("main") or {}
        n = int(main.get("samples") or 0)
        why = _unjudged(ev, r, main)
        if why:
            yield ctx.skip(why, title=title)
            continue
        data = _share(main, "data")
        workers = a.get("workers") or []
        busy = [w.get("busy_share") for w in workers if w.get("busy_share") is not None]
        cpus = [w.get("cpu_percent") for w in workers if w.get("cpu_percent") is not None]
        mean_busy = sum(busy) / len(busy) if busy else None
        mean_cpu = sum(cpus) / len(cpus) if cpus else None
        saturated = workers and ((mean_busy or 0) >= WORKERS_SATURATED or (mean_cpu or 0) >= 100 * WORKERS_SATURATED)
        idle = workers and (mean_busy is not None and mean_busy < WORKERS_IDLE)
        data_lines = [h for h in main.get("hot_lines") or [] if h.get("phase") == "data"]
        wtop = next((w["top_frames"][0] for w in workers if w.get("top_frames")), None)
        numbers = {"rank": r.rank, "data_share": round(data, 4), "samples": n,
                   "margin_95": round(_margin(data, n), 4), "workers": len(workers),
                   "workers_busy_share": None if mean_busy is None else round(mean_busy, 3),
                   "workers_cpu_percent": None if mean_cpu is None else round(mean_cpu, 1),
                   "worker_top": wtop, "data_lines": data_lines[:3]}
        wtext = (f"{len(workers)} worker(s) work in {pct(mean_busy or 0)} of their samples"
                 + (f", {mean_cpu:.0f}% CPU each" if mean_cpu is not None else "")) if workers else "no worker process"
        if data < DATA_INFO:
            msg = f"{_label(ev, r)} waits for data in {pct(data)} of {n} samples"
            if idle:
                msg += f"; its {wtext}: the workers keep up, the main process is the slow side"
            yield ctx.finding(severity=Severity.PASS, title="Data keeps up", message=msg + ".",
                          evidence=numbers)
            continue
        sev = Severity.WARNING if data >= DATA_WARN else Severity.INFO
        # the same advice as the probe's dataloader.workers (checks/_workers.py): no pin_memory and no
        # "GPU" on a CPU run, the CPU run's half-the-cores cap, and no worker count on a contended host
        on_cpu = not _uses_cuda(ev)
        contention = host_contention(ev)
        cpus_n = ev.environment.cpu_count
        numbers.update(cpu_training=on_cpu, host=contention)
        if not workers:
            where = _where(data_lines[0]) if data_lines else "the DataLoader"
            msg = (f"{_label(ev, r)} spends {pct(data)} of {n} samples loading data in the main process "
                   f"(no DataLoader worker: num_workers=0), hottest at {where}.")
            rec = recommended_workers(0, data, max(1 - data, 1e-6), cpus_n, on_cpu)
            a = advice(num_workers=0, wait=data, compute=max(1 - data, 1e-6), cpus=cpus_n, on_cpu=on_cpu,
                       contention=contention, timed=False,
                       lead=f"DataLoader(..., num_workers={rec}{'' if on_cpu else ', pin_memory=True'}, "
                            "persistent_workers=True).")
            fix = a["fix"]
            numbers.update(recommended_workers=rec if a["helps"] else None, workers_help=a["helps"])
            if a["why_not"] == "contended" or (a["why_not"] == "at-cap" and on_cpu):
                sev = Severity.INFO
                if a["why_not"] == "contended":
                    msg += f" During the window {contention_words(contention)}: a worker count will not help."
        elif saturated and mean_cpu is not None and mean_cpu < 50:
            msg = (f"{_label(ev, r)} waits for the DataLoader in {pct(data)} of {n} samples while its {wtext}: "
                   "the workers always have work but get little CPU, so the machine's cores are contended"
                   + (f" (busiest in {_where(wtop)})" if wtop else "") + ".")
            fix = "More workers will not help while the cores are busy: find what else uses the CPUs (other jobs, " \
                  "torch intra-op threads: torch.set_num_threads), or make __getitem__/transforms cheaper."
        elif saturated:
            msg = (f"{_label(ev, r)} waits for the DataLoader in {pct(data)} of {n} samples while its {wtext}: "
                   "the workers are saturated" + (f" (busiest in {_where(wtop)})" if wtop else "") + ".")
            fix = "Add workers (num_workers) if CPU cores are free, or make __getitem__/transforms cheaper " \
                  "(decode once, cache, move augmentation to the GPU)."
        else:
            msg = (f"{_label(ev, r)} waits for the DataLoader in {pct(data)} of {n} samples though its {wtext}: "
                   "the workers are not the limit (transfer of large batches, pin_memory thread, or a "
                   "prefetch_factor too small).")
            fix = "Raise prefetch_factor, check the size of each batch sent from workers" + \
                  ("." if on_cpu else ", use pin_memory=True.")
        yield ctx.finding(severity=sev, title=title, message=msg, evidence=numbers,
                      why="While the main process waits for a batch, the model does nothing"
                          + ("." if on_cpu else " and the GPU has nothing queued."),
                      fix=fix, location=_loc(data_lines[0] if data_lines else None))


@check(id="attach.sync-host-device", title="Host-device synchronisations (sampled)", severity="warning",
       needs=["ranks.extras.attach.main.sync_lines"], tags=["gpu", "attach"], docs=DOCS,
       sources=["attach"], replaces="sync.host-device")
def attach_sync(ctx):
    """Reported as ``sync.host-device`` for attached evidence. The share of main-thread samples on a
    line of the user's that reads a value back from the device (``.item()``, ``.cpu()``,
    ``.tolist()``, ``.numpy()``, ``torch.cuda.synchronize()``, ``.nonzero()``): on CUDA the host waits
    there for the GPU. Warning >= 10% of samples, info >= 2%. Synchronisations hidden inside library
    code (a ``print`` of a tensor, a Python ``if`` on a CUDA value) are not recognisable from a stack."""
    ev = ctx.evidence
    title = "Host-device synchronisations every step"
    for r in ev.ranks:
        main = _att(r).get("main") or {}
        n = int(main.get("samples") or 0)
        why = _unjudged(ev, r, main)
        if why:
            yield ctx.skip(why, title=title)
            continue
        share = _share(main, "sync")
        lines = main.get("sync_lines") or []
        numbers = {"rank": r.rank, "sync_share": round(share, 4), "samples": n, "lines": lines[:5],
                   "margin_95": round(_margin(share, n), 4)}
        if share < SYNC_INFO:
            yield ctx.finding(severity=Severity.PASS, title="No visible synchronisation",
                          message=f"{_label(ev, r)}: {pct(share)} of {n} samples on lines that read values back "
                              "from the device.", evidence=numbers)
            continue
        where = "; ".join(f"{_where(x)} {pct(x['share'])}" for x in lines[:3])
        yield ctx.finding(
            severity=Severity.WARNING if share >= SYNC_WARN else Severity.INFO, title=title,
            message=f"{_label(ev, r)} spends {pct(share)} of {n} samples on lines that synchronise with the "
                    f"device: {where}.",
            evidence=numbers,
            why="Each synchronisation makes the CPU wait until the GPU has finished everything queued.",
            fix="Keep values on the GPU and read them every N steps (accumulate the loss in a tensor).",
            location=_loc(lines[0] if lines else None))


@check(id="attach.gpu-low-utilization", title="GPUs underused (sampled)", severity="warning",
       needs=["gpu.devices.series", "gpu.devices.used_by_run", "ranks.extras.attach.main.phases"],
       tags=["gpu", "attach"], docs=DOCS, sources=["attach"], replaces="gpu.low-utilization")
def attach_gpu_low_util(ctx):
    """Reported as ``gpu.low-utilization`` for attached evidence: mean NVML utilisation over the window
    on the GPUs the job's processes use (all GPUs when they cannot be matched) below 50%, with the
    phase the main thread spent most time in outside forward/backward/optimizer as the likely cause."""
    ev = ctx.evidence
    title = "GPUs underused during training"
    g = ev.gpu or {}
    devices = [d for d in g.get("devices") or [] if not d.get("lost")]
    if not devices:
        yield ctx.skip(f"No GPU telemetry during the window ({g.get('reason') or 'no GPU'}).", title=title)
        return
    used = [d for d in devices if d.get("used_by_run")]
    pool = used or devices
    utils = []
    for d in pool:
        vals = [v for v in (d.get("series") or {}).get("util") or [] if v is not None]
        if vals:
            utils.append(sum(vals) / len(vals))
    if not utils:
        yield ctx.skip("NVML gave no utilisation values during the window.", title=title)
        return
    mean = sum(utils) / len(utils)
    sim = " (simulated GPUs)" if g.get("simulated") else ""
    matched = "the job's GPUs" if used else "all GPUs (the job's processes could not be matched to GPUs)"
    cause = None
    best = 0.0
    for r in ev.ranks:
        main = _att(r).get("main") or {}
        for p in ("data", "sync", "collective", "checkpoint", "logging", "evaluation", "other"):
            s = _share(main, p)
            if s > best:
                best, cause = s, p
    numbers = {"mean_util": round(mean, 1), "devices": [d.get("index") for d in pool], "matched": bool(used),
               "cause_phase": cause, "cause_share": round(best, 4), "simulated": bool(g.get("simulated"))}
    if mean >= GPU_LOW_UTIL:
        yield ctx.finding(severity=Severity.PASS, title="GPUs busy",
                      message=f"Mean utilisation {mean:.0f}% on {matched}{sim} during the window.", evidence=numbers)
        return
    yield ctx.finding(
        severity=Severity.WARNING, title=title,
        message=f"Mean utilisation {mean:.0f}% on {matched}{sim} during the window"
                + (f"; the main thread spent {pct(best)} of its samples in {cause}" if cause else "") + ".",
        evidence=numbers,
        why="A GPU that waits for the host costs as much as a busy one.",
        fix="Remove the cause named above (see dataloader.workers, sync.host-device).")


@check(id="attach.distributed-straggler", title="One rank holds the others back (sampled)", severity="warning",
       needs=["ranks.extras.attach.main.phases"], tags=["distributed", "attach"], docs=DOCS,
       sources=["attach"], replaces="distributed.straggler")
def attach_straggler(ctx):
    """Reported as ``distributed.straggler`` for attached evidence with several ranks (``--job``): the
    share of each rank's samples spent waiting for the others (collectives, and backward under DDP
    where the gradient all-reduce waits); a rank that waits at least 20 points less than the median of
    the others is the straggler, named with what it does instead (its dominant phase and line). A
    rank whose backward is genuinely slower than its peers' (unequal shards) is not told apart from
    one that waits in backward: the gap then stays small and the check passes."""
    ev = ctx.evidence
    title = "One rank holds the others back"
    ranks = [r for r in ev.ranks if (_att(r).get("main") or {}).get("samples")]
    if len(ranks) < 2:
        yield ctx.skip("Needs two or more sampled ranks (diag attach --job LAUNCHER_PID).", title=title)
        return
    if not any((_att(r).get("main") or {}).get("cycles") for r in ranks):
        yield ctx.skip("No rank completed a step-like cycle in the window (see run.hung).", title=title)
        return
    waits = {}
    for r in ranks:
        main = _att(r)["main"]
        # under DDP the gradient all-reduce is waited for inside backward (C++ hooks, no Python frame)
        waits[r.rank] = _share(main, "collective", "backward")
    odd = min(ranks, key=lambda r: waits[r.rank])
    others = sorted(waits[r.rank] for r in ranks if r is not odd)
    med = others[len(others) // 2] if len(others) % 2 else (others[len(others) // 2 - 1] + others[len(others) // 2]) / 2
    main = _att(odd)["main"]
    top = (main.get("hot_lines") or [None])[0]
    ph = main.get("phases") or {}
    dom = max(ph.items(), key=lambda kv: kv[1].get("share", 0))[0] if ph else "other"
    numbers = {"wait_share": {str(k): round(v, 4) for k, v in waits.items()}, "odd_rank": odd.rank,
               "gap": round(med - waits[odd.rank], 4), "odd_dominant_phase": dom, "odd_hot_line": top}
    if med - waits[odd.rank] < STRAGGLER_GAP:
        yield ctx.finding(severity=Severity.PASS, title="Ranks keep pace",
                      message="Every rank waits for the others in a similar share of its samples ("
                          + ", ".join(f"rank {k} {pct(v)}" for k, v in sorted(waits.items())) + ").",
                      evidence=numbers)
        return
    yield ctx.finding(
        severity=Severity.WARNING, title=title,
        message=f"rank {odd.rank} is the straggler: the other ranks wait for it in {pct(med)} of their samples "
                f"(rank {odd.rank}: {pct(waits[odd.rank])}), while it spends {pct(ph.get(dom, {}).get('share', 0))} "
                f"in {dom}" + (f", hottest at {_where(top)}" if top else "") + ".",
        evidence=numbers,
        why="In synchronous data parallelism every step runs at the pace of the slowest rank.",
        fix="Look at what the slow rank does at its hottest line (extra logging or I/O on one rank, an "
            "unbalanced shard, a slower node or GPU).",
        location=_loc(top))
