"""GPU checks over the telemetry diag's sampler recorded during the run (``Evidence.gpu``).

Pure functions of Evidence: the numbers come from ``Evidence.gpu`` (see docs/gpus.md), never from
NVML. A run without GPUs (or without telemetry) makes every check here `skipped` with the reason.
Findings built on simulated values say "(simulated GPUs)".
"""
from __future__ import annotations

from diag.checks.api import (NVML_PERIOD_S, check, data_wait, dev_name, gpu_section, gpu_timeline, has_devices,
    knob_words, label, mean, no_gpu_reason, percentile, run_devices, run_framework, Severity, steady_values,
    steady_windows, training_models, training_sites, training_window, window_values)

from ._util import TUNING_GUIDE, gib, loc, ms, pct

# gpu.low-utilization (torch-tb-profiler flags GPU utilisation < 50%; SageMaker Debugger p95 < 70%)
LOW_UTIL_WARN = 50.0
LOW_UTIL_ERROR = 25.0
MIN_SAMPLES = 10                # samples inside the steady steps below which the check says skipped
DEVICE_IDLE_WARN = 0.30         # CUDA events saw the GPU idle less than this (gpu.idle's warning): "busy"
DATA_WAIT_SHARE = 0.10          # the data wait that explains low utilisation (TraceML warns at 10%)
# gpu.imbalance
IMBALANCE_POINTS = 25.0         # busiest minus lagging device, in utilisation points ...
IMBALANCE_RATIO = 0.6           # ... and the lagging device below 60% of the busiest
IDLE_UTIL = 10.0                # a used device below this while another is >= 50% busy: idle
MEM_SKEW_WARN = 0.30            # (max - min) / max of peak memory; TraceML: 20% warn, 30% critical
MEM_SKEW_INFO = 0.20
# gpu.throttling
THERMAL_SHARE_WARN = 0.10       # share of samples with a thermal / hardware slowdown reason
POWER_CAP_SHARE_INFO = 0.25     # share of samples at the software power cap
POWER_LIMIT_LOWERED = 0.95      # enforced limit below 95% of the default limit

THERMAL_MASK = 0x20 | 0x40 | 0x8 | 0x80      # sw_thermal, hw_thermal, hw_slowdown, hw_power_brake
POWER_MASK = 0x4                             # sw_power_cap

DDP_DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#use-nn-parallel-distributeddataparallel-instead-of-multiprocessing-or-nn-dataparallel"
NVML_REASONS_DOCS = "https://docs.nvidia.com/deploy/nvml-api/group__nvmlClocksEventReasons.html"
XID_DOCS = "https://docs.nvidia.com/deploy/xid-errors/index.html"


def _names(devs: list[dict]) -> str:
    idx = [str(d.get("index")) for d in devs]
    if len(idx) == 1:
        return f"GPU {idx[0]}"
    return "GPUs " + ", ".join(idx[:-1]) + " and " + idx[-1]


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _dp_model(ev):
    """(model, location) of a model wrapped in DataParallel, if the probe saw one."""
    for r in ev.ranks:
        for m in r.models:
            if any(w == "DataParallel" for w in m.wrappers):
                site = next((f for f in r.forwards if f.model == m.id and f.location), None)
                return m, (site.location if site else None)
    return None, None


def _alive(devs: list[dict]) -> list[dict]:
    return [d for d in devs if not d.get("lost")]


# ---- gpu.low-utilization ---------------------------------------------------------------------------

def _compiled(r) -> bool:
    comp = (r.extras or {}).get("compile") or {}
    return bool(any("compiled" in (m.wrappers or []) for m in r.models) or comp.get("calls") or comp.get("models"))


def _launch_fix(ev, r, fw) -> tuple[str, str]:
    """More work per launch, fewer launches: the levers of a step that leaves gaps between kernels.
    A model that is already compiled is not told to compile."""
    parts = ["give each launch more work: a larger batch (with gradient accumulation if memory is short)"]
    snippet = None
    half = {s.autocast for s in training_sites(r) if s.autocast} | {
        d for m in training_models(r) for d in (m.dtypes or []) if d in ("float16", "bfloat16")}
    if not half and any(m for m in training_models(r)):
        amp_fix, amp_snip, _ = knob_words("amp.bf16", fw)
        parts.append("bf16 mixed precision (" + amp_fix.rstrip(".") + ")")
        snippet = amp_snip
    if _compiled(r):
        parts.append("the model is already compiled: what remains is fewer launches per step, with CUDA graphs "
                     "(torch.compile's mode=\"reduce-overhead\", if it was compiled without it)")
    else:
        cg_fix, cg_snip, _ = knob_words("compile.cuda-graphs", fw)
        parts.append("fewer launches: torch.compile, with CUDA graphs (" + cg_fix.rstrip(".") + ")")
        snippet = cg_snip if snippet is None else cg_snip + "\n" + snippet
    parts.append("and no host-device synchronisation inside the step (see sync.host-device)")
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + ".", snippet or ""


@check(id="gpu.low-utilization", title="GPUs underused during training", severity="warning",
       needs=["gpu.devices.series", "ranks.steps", "ranks.timeline"], tags=["gpu"], docs=TUNING_GUIDE)
def gpu_low_utilization(ctx):
    """Mean GPU utilisation (NVML: share of time a kernel ran) over the steady training steps, on the
    devices the run used. A sample counts only when the whole period it speaks for (NVML averages
    over up to 1 s before it) lies inside a stretch of steady steps: start-up, the first step, the
    FLOP-counted step, evaluation passes and shutdown are left out. Warning below 50%
    (torch-tb-profiler's threshold), error below 25%. Skipped with fewer than 10 such samples (a run
    samples at 10 Hz for its first minute, then at --gpu-interval). On CUDA runs with a device
    timeline, CUDA events judge too: when they saw the GPU busy at the step's marks (idle under
    30%), NVML alone makes at most a warning, which then says the step leaves gaps between kernels
    (launch-bound) instead of blaming data. The cause is related to the measured data wait (>= 10%
    of the step) or Python work between steps; the fix speaks the framework's knobs, and a compiled
    model is not told to compile."""
    ev = ctx.evidence
    gpu = gpu_section(ev)
    if not has_devices(gpu):
        yield ctx.skip(no_gpu_reason(gpu))
        return
    lab = label(gpu)
    devs, how = run_devices(gpu)
    if how == "processes" and not devs:
        n = len(gpu.get("devices") or [])
        yield ctx.finding(
            severity=Severity.WARNING, title="The GPUs were not used",
            message=f"None of the run's processes held memory on any of the {n} GPU(s){lab}: "
                    "the script trained on the CPU.",
            evidence={"devices": n, "decided_by": how},
            why="A GPU that the script never uses gives no speed-up; CPU training is typically 10-100x slower.",
            fix="Move the model and every batch to the GPU (and check torch.cuda.is_available() is True: a "
                "CPU-only torch build cannot use it).",
            snippet="device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\nmodel = model.to(device)\n"
                    "for x, y in loader:\n    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)",
        )
        return
    devs = [d for d in devs if d.get("series", {}).get("util")]
    windows = steady_windows(ev, gpu)
    if not windows:
        yield ctx.skip("No timed training step was observed, so utilisation during training "
                       "cannot be judged.")
        return
    interval = gpu.get("interval_s") or 1.0
    burst = gpu.get("burst_interval_s")
    steady_s = sum(b - a for a, b in windows)
    sampling = (f"one every {burst:g} s for the first {gpu.get('burst_s') or 0:g} s, then every {interval:g} s"
                if burst else f"one every {interval:g} s")
    per, raw = {}, {}
    for d in devs:
        vals, n_raw = steady_values(d, "util", windows)
        if vals:
            per[d["index"]], raw[d["index"]] = vals, n_raw
    window_txt = (f"{steady_s:.1f} s of steady training steps"
                  + (f" in {len(windows)} stretches" if len(windows) > 1 else ""))
    if not per:
        na = all(v is None for d in devs for v in (d.get("series", {}).get("util") or []))
        reason = ("NVML gives no utilisation for these GPUs (MIG mode, or not supported by the driver)."
                  if na or not devs else
                  f"No GPU sample spoke for the {window_txt} alone ({sampling}; each sample averages the "
                  f"{NVML_PERIOD_S:g} s before it): run longer (--steps/--max-time).")
        yield ctx.skip(reason, samples=0, steady_s=round(steady_s, 3))
        return
    n = max(len(v) for v in per.values())
    if n < MIN_SAMPLES:
        yield ctx.skip(f"Only {n} GPU sample(s) spoke for the {window_txt} alone ({sampling}; each sample "
                       f"averages the {NVML_PERIOD_S:g} s before it): fewer than {MIN_SAMPLES}, too few to "
                       "judge; run longer (--steps/--max-time) or sample faster (--gpu-interval 0.1).",
                       samples=n, min_samples=MIN_SAMPLES, steady_s=round(steady_s, 3))
        return
    means = {i: mean(v) for i, v in per.items()}
    overall = mean(means.values())
    all_vals = [x for v in per.values() for x in v]
    p95, p5 = percentile(all_vals, 0.95), percentile(all_vals, 0.05)
    r = ev.primary
    fw = run_framework(ev)
    tl = gpu_timeline(r)
    numbers = {"util_mean": round(overall, 1), "util_p95": round(p95, 1), "util_p5": round(p5, 1),
               "samples": n, "raw_samples": max(raw.values()), "min_samples": MIN_SAMPLES,
               "devices": len(per), "threshold": LOW_UTIL_WARN,
               "window_s": round(steady_s, 2), "stretches": len(windows), "nvml_period_s": NVML_PERIOD_S,
               "interval_s": interval, "burst_interval_s": burst, "decided_by": how,
               "per_device": {str(i): round(m, 1) for i, m in sorted(means.items())},
               "clock": "device+nvml" if tl is not None else "nvml", "framework": fw}
    dev_txt = ""
    events_busy = False
    if tl is not None:
        numbers.update(device_idle_share=round(tl.idle_share, 4), device_step_s=round(tl.step_s, 6),
                       device_busy_s=round(tl.busy_s / max(tl.steps, 1), 6), device_steps=tl.steps)
        events_busy = tl.idle_share < DEVICE_IDLE_WARN
        dev_txt = (f"; CUDA events saw the GPU idle {pct(tl.idle_share)} of the {ms(tl.step_s)} step at its "
                   f"marks ({tl.steps} steps)")
    if overall >= LOW_UTIL_WARN:
        yield ctx.passed(f"The GPU(s) used by the run were busy {overall:.0f}% of the time during the "
                         f"{window_txt} (p5 {p5:.0f}%, p95 {p95:.0f}%, {n} samples){dev_txt}{lab}.",
                         **numbers, title="GPUs busy during training")
        return
    # why? relate to the measured data wait (on the device clock when there is one)
    steps = r.timed_steps()
    total = sum(s.total_s for s in steps)
    dw = data_wait(r)
    data_share = dw.share
    other_share = (sum(s.other_s for s in steps) / total) if total > 0 else None
    if data_share is not None:
        numbers["data_wait_share"] = round(data_share, 4)
        numbers["data_wait_clock"] = dw.clock
    where = _names([d for d in devs if d["index"] in per])
    msg = (f"{where} {'was' if len(per) == 1 else 'were'} busy only {overall:.0f}% of the time during the "
           f"{window_txt} (NVML, p95 {p95:.0f}%, {n} samples){dev_txt}{lab}")
    cause = "launch"
    if events_busy:
        msg += (": the GPU had work queued at every mark, yet ran no kernel much of the time, so the gaps "
                "are between kernels inside the phases (a step bound by launching many small kernels from "
                "the CPU), not a data or host wait")
    elif data_share is not None and data_share >= DATA_WAIT_SHARE:
        cause = "data"
        msg += (f"; the training loop waited for data {pct(data_share)} of each step"
                + (" (GPU idle, device clock)" if dw.clock == "device" else "")
                + ", which accounts for much of the idle time")
    elif other_share is not None and other_share >= 0.2:
        cause = "host"
        msg += f"; {pct(other_share)} of each step was spent outside forward/backward/optimizer (Python work between steps)"
    else:
        msg += "; the steps did not wait for data, so each step gives the GPU too little work or waits on the CPU"
    if cause == "data":
        fix, snippet, _ = knob_words("dataloader.workers", fw, n=8, batch_size="...")
        fix = "Feed the GPU faster: " + fix[0].lower() + fix[1:] + " (see dataloader.workers for the number to use)."
    elif cause == "host":
        fix, snippet, _ = knob_words("log.interval", fw, n=50)
        fix = ("Move per-step Python work (logging, metrics, .item() calls, hand-made batching) off the hot "
               "path or do it every N steps. " + fix)
    else:
        fix, snippet = _launch_fix(ev, r, fw)
    numbers["cause"] = cause
    sev = Severity.ERROR if overall < LOW_UTIL_ERROR else Severity.WARNING
    if events_busy and sev is Severity.ERROR:
        sev = Severity.WARNING      # NVML alone never makes an error when the device clock saw it busy
        numbers["capped_by_device_clock"] = True
    yield ctx.finding(severity=sev, message=msg + ".", evidence=numbers,
                      why="Time the GPU sits idle is paid for and lost. NVML counts the time at least one kernel "
                          "ran, not how much of the GPU it filled: a step that kept the GPU fully busy could take "
                          f"as little as {overall / 100:.0%} of the time (a bound, not a prediction: "
                          "measure a change before relying on it).",
                      fix=fix, snippet=snippet)


# ---- gpu.imbalance ----------------------------------------------------------------------------------

@check(id="gpu.imbalance", title="Work spread unevenly across GPUs", severity="warning",
       needs=["gpu.devices.series", "gpu.devices.used_by_run", "ranks.models"], tags=["gpu", "distributed"],
       docs=DDP_DOCS)
def gpu_imbalance(ctx):
    """Across the devices the run used (seen through its processes; otherwise the active visible
    ones): utilisation spread and peak-memory skew. A device is lagging when it is >= 25 points and
    below 60% of the busiest device's mean utilisation (warning); idle when below 10% while another
    is >= 50% busy (error). Memory skew (max - min) / max of peak memory: info at >= 20%, warning at
    >= 30% (TraceML's rank-memory thresholds). Names the busy and idle devices and the DataParallel
    GPU-0 pattern when it is the cause. Lost GPUs are left to gpu.lost."""
    ev = ctx.evidence
    gpu = gpu_section(ev)
    if not has_devices(gpu):
        yield ctx.skip(no_gpu_reason(gpu))
        return
    lab = label(gpu)
    devs, how = run_devices(gpu)
    devs = _alive(devs)
    visible = [d for d in gpu.get("devices") or [] if d.get("visible", True) and not d.get("lost")]
    if len(devs) < 2:
        if how == "processes" and len(devs) == 1 and len(visible) > 1:
            others = [d for d in visible if d is not devs[0]]
            idle_others = [d for d in others if ((d.get("stats") or {}).get("util_mean") or 0) < IDLE_UTIL]
            if idle_others:
                n = len(visible)
                yield ctx.finding(
                    severity=Severity.INFO, title="The run used one of several GPUs",
                    message=f"The run used {dev_name(devs[0])} only; {_names(idle_others)} "
                            f"{'was' if len(idle_others) == 1 else 'were'} visible and idle{lab}.",
                    evidence={"used": devs[0]["index"], "idle": [d["index"] for d in idle_others],
                              "visible": n, "decided_by": how},
                    fix=f"To train on all {n} GPUs, launch with torchrun and wrap the model in "
                        "DistributedDataParallel; if the others belong to someone else, set "
                        "CUDA_VISIBLE_DEVICES to the GPU you use.",
                    snippet=f"torchrun --nproc-per-node={n} train.py\n# in train.py:\n"
                            "dist.init_process_group('nccl'); torch.cuda.set_device(local_rank)\n"
                            "model = DDP(model.to(local_rank), device_ids=[local_rank])",
                )
                return
        yield ctx.skip(f"The run used {len(devs)} GPU{'s' if len(devs) != 1 else ''}{lab}: "
                                  "nothing to balance.")
        return
    window = training_window(ev, gpu)
    interval = gpu.get("interval_s") or 1.0
    util, peak, total = {}, {}, {}
    for d in devs:
        i = d["index"]
        u = window_values(d, "util", window, pad=interval) or window_values(d, "util", None)
        if u:
            util[i] = mean(u)
        m = (d.get("stats") or {}).get("mem_used_max")
        if m is not None:
            peak[i] = m
        total[i] = d.get("memory_total")
    numbers: dict = {"devices": len(devs), "decided_by": how,
                     "util_mean": {str(i): round(u, 1) for i, u in sorted(util.items())},
                     "mem_peak": {str(i): m for i, m in sorted(peak.items())}}
    sev = Severity.PASS
    parts = []
    lagging, idle = [], []
    by_index = {d["index"]: d for d in devs}
    if len(util) >= 2:
        busiest = max(util, key=util.get)
        top = util[busiest]
        spread = top - min(util.values())
        numbers["util_spread_points"] = round(spread, 1)
        numbers["busiest"] = busiest
        for i, u in sorted(util.items()):
            if i != busiest and top - u >= IMBALANCE_POINTS and u <= IMBALANCE_RATIO * top:
                (idle if (u < IDLE_UTIL and top >= 50) else lagging).append(i)
        if idle or lagging:
            sev = Severity.ERROR if idle else Severity.WARNING
            text = f"GPU {busiest} was busy {top:.0f}% of the time"
            if idle:
                text += f" while {_names([by_index[i] for i in idle])} sat idle ({_join([f'{util[i]:.0f}%' for i in idle])})"
            if lagging:
                text += (" and" if idle else " while") + f" {_names([by_index[i] for i in lagging])} ran at " \
                        f"{_join([f'{util[i]:.0f}%' for i in lagging])}"
            parts.append(text)
        numbers["idle"] = idle
        numbers["lagging"] = lagging
    skew = None
    if len(peak) >= 2 and max(peak.values()) > 0:
        hi_i = max(peak, key=peak.get)
        lo_i = min(peak, key=peak.get)
        skew = (peak[hi_i] - peak[lo_i]) / peak[hi_i]
        numbers["mem_skew"] = round(skew, 3)
        if skew >= MEM_SKEW_INFO:
            if skew >= MEM_SKEW_WARN and sev is Severity.PASS:
                sev = Severity.WARNING
            elif sev is Severity.PASS:
                sev = Severity.INFO
            parts.append(f"GPU {hi_i} peaked at {gib(peak[hi_i])} of memory against {gib(peak[lo_i])} on "
                         f"GPU {lo_i} (skew {skew:.0%})")
    if sev is Severity.PASS:
        u_txt = (f"utilisation within {numbers['util_spread_points']:.0f} points" if "util_spread_points" in numbers
                 else "utilisation not available")
        m_txt = f", memory skew {skew:.0%}" if skew is not None else ""
        yield ctx.passed(f"The {len(devs)} GPUs used by the run were balanced ({u_txt}{m_txt}){lab}.", **numbers, title="Work evenly spread across GPUs")
        return
    model, where = _dp_model(ev)
    gpu0_heavy = peak and max(peak, key=peak.get) == min(peak) and skew is not None and skew >= MEM_SKEW_INFO
    dp = model is not None or (gpu0_heavy and util and max(util, key=util.get) == min(util))
    numbers["dataparallel_pattern"] = bool(dp)
    msg = "; ".join(parts) + lab + "."
    if dp:
        msg += (" This is the DataParallel pattern: GPU 0 gathers outputs, computes the loss and holds the "
                "master copy, while the other GPUs wait." if model is not None else
                " GPU 0 doing more than the rest is the DataParallel pattern (outputs gathered and the loss "
                "computed on GPU 0).")
        fix = ("Replace nn.DataParallel with DistributedDataParallel: one process per GPU, each with its own "
               "batch shard, gradients averaged with all-reduce; it is faster even on one machine.")
        snippet = ("# torchrun --nproc-per-node=NUM_GPUS train.py\nimport torch.distributed as dist\n"
                   "dist.init_process_group('nccl')\nlocal_rank = int(os.environ['LOCAL_RANK'])\n"
                   "torch.cuda.set_device(local_rank)\n"
                   "model = torch.nn.parallel.DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])\n"
                   "sampler = DistributedSampler(dataset, drop_last=True)")
    else:
        fix = ("Give every GPU the same work: shard data evenly (DistributedSampler with drop_last=True), "
               "keep per-rank extra work (evaluation, logging, checkpointing) off the training path or spread "
               "it, and check that each process uses its own GPU (torch.cuda.set_device(local_rank)).")
        snippet = "torch.cuda.set_device(local_rank)\nsampler = DistributedSampler(dataset, drop_last=True)"
    yield ctx.finding(severity=sev, message=msg, evidence=numbers,
                  why="In synchronous data-parallel training every step waits for the slowest device; in "
                      "DataParallel the others wait for GPU 0. An idle or lagging GPU is capacity paid for "
                      "and not used.",
                  fix=fix, snippet=snippet, location=loc(where))


# ---- gpu.throttling ---------------------------------------------------------------------------------

@check(id="gpu.throttling", title="GPU clocks throttled", severity="warning",
       needs=["gpu.devices.series.throttle", "gpu.devices.stats"], tags=["gpu"], docs=NVML_REASONS_DOCS)
def gpu_throttling(ctx):
    """NVML clock event reasons during the run, on the devices the run used. Thermal or hardware
    slowdown (sw_thermal, hw_thermal, hw_slowdown, hw_power_brake) in >= 10% of the samples:
    warning, with the clock lost and the peak temperature. The software power cap in >= 25% of the
    samples: info (expected under heavy load), a warning when the power limit was lowered below 95%
    of the default. Idle, application-clock and sync-boost reasons are ignored."""
    ev = ctx.evidence
    gpu = gpu_section(ev)
    if not has_devices(gpu):
        yield ctx.skip(no_gpu_reason(gpu))
        return
    lab = label(gpu)
    devs, how = run_devices(gpu)
    if not devs:
        devs = [d for d in gpu.get("devices") or [] if d.get("visible", True)]
    readable = [d for d in devs if (d.get("stats") or {}).get("throttle_samples")]
    if not readable:
        yield ctx.skip("The driver reported no clock event (throttle) reasons for these GPUs "
                                  f"(NotSupported or no samples){lab}.")
        return
    thermal, power, recs = [], [], []
    numbers: dict = {"devices": len(readable), "decided_by": how}
    for d in readable:
        s = d.get("series") or {}
        masks = s.get("throttle") or []
        clocks = s.get("sm_clock") or []
        known = [(m, c) for m, c in zip(masks, clocks + [None] * (len(masks) - len(clocks))) if m is not None]
        if not known:
            continue
        th = [(m, c) for m, c in known if m & THERMAL_MASK]
        pw = [(m, c) for m, c in known if m & POWER_MASK]
        free = [c for m, c in known if not (m & (THERMAL_MASK | POWER_MASK)) and c is not None and not (m & 0x1)]
        st = d.get("stats") or {}
        rec = {"index": d["index"], "thermal_share": len(th) / len(known), "power_share": len(pw) / len(known),
               "samples": len(known), "temp_max": st.get("temp_max"),
               "clock_throttled": mean(c for _, c in th if c is not None) if th else None,
               "clock_free": mean(free) if free else None, "name": d.get("name"),
               "power_limit_w": d.get("power_limit_w"), "default_power_limit_w": d.get("default_power_limit_w"),
               "reasons": st.get("throttle_counts") or {}}
        recs.append(rec)
        if rec["thermal_share"] >= THERMAL_SHARE_WARN:
            thermal.append(rec)
        if pw:
            rec["clock_power"] = mean(c for _, c in pw if c is not None)
            power.append(rec)
    # a GPU throttled all along: compare with the unthrottled clock of its siblings (same model)
    free_by_name: dict = {}
    for r in recs:
        if r["clock_free"]:
            free_by_name.setdefault(r["name"], []).append(r["clock_free"])
    for r in recs:
        if not r["clock_free"] and free_by_name.get(r["name"]):
            r["clock_free"] = mean(free_by_name[r["name"]])
    numbers["thermal"] = {str(r["index"]): round(r["thermal_share"], 3) for r in thermal}
    numbers["power_cap"] = {str(r["index"]): round(r["power_share"], 3) for r in power}
    lowered = [r for r in power if r["power_share"] >= THERMAL_SHARE_WARN and _lowered(r)]
    capped = [r for r in power if r["power_share"] >= POWER_CAP_SHARE_INFO]
    if not thermal and not lowered and not capped:
        n = max(len((d.get("series") or {}).get("throttle") or []) for d in readable)
        yield ctx.passed(f"No thermal or power throttling on the {len(readable)} GPU(s) "
                                               f"over {n} samples{lab}.", **numbers, title="No GPU throttling")
        return
    parts = []
    for r in thermal:
        t = f"GPU {r['index']} was slowed by heat in {r['thermal_share']:.0%} of the samples"
        if r["temp_max"] is not None:
            t += f" (up to {r['temp_max']:.0f} °C)"
        if r["clock_throttled"] and r["clock_free"]:
            t += f", its SM clock at {r['clock_throttled']:.0f} MHz against {r['clock_free']:.0f} MHz unthrottled " \
                 f"({r['clock_throttled'] / r['clock_free'] - 1:+.0%})"
        parts.append(t)
    for r in lowered:
        parts.append(f"GPU {r['index']}'s power limit is lowered to {r['power_limit_w']:.0f} W from the default "
                     f"{r['default_power_limit_w']:.0f} W and it ran at that cap in {r['power_share']:.0%} of the samples")
    for r in capped:
        if r in lowered:
            continue
        parts.append(f"GPU {r['index']} ran at its power limit"
                     + (f" ({r['power_limit_w']:.0f} W)" if r.get("power_limit_w") else "")
                     + f" in {r['power_share']:.0%} of the samples")
    sev = Severity.WARNING if (thermal or lowered) else Severity.INFO
    fixes = []
    if thermal:
        fixes.append("improve cooling: airflow, fan curve, dust, the ambient temperature of the room or rack "
                     "(on a managed cluster, report the node); check `nvidia-smi -q -d PERFORMANCE,TEMPERATURE`")
    if lowered:
        fixes.append("restore the default power limit (sudo nvidia-smi -pl DEFAULT_WATTS -i GPU), if the "
                     "lower limit was not set on purpose")
    if capped and not thermal and not lowered:
        fixes.append("running at the power cap is normal for a GPU under full load; nothing to change unless "
                     "the limit was lowered")
    yield ctx.finding(severity=sev, message="; ".join(parts) + lab + ".", evidence=numbers,
                  why="A throttled GPU lowers its clocks, so every kernel runs slower; a synchronous multi-GPU "
                      "job then waits for its hottest GPU.",
                  fix="; ".join(fixes)[:1].upper() + "; ".join(fixes)[1:] + ".",
                  snippet="nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER   # clock event reasons, temperatures, limits\n"
                          "nvidia-smi dmon -s pucv                        # watch power, utilisation, clocks live")


def _lowered(r: dict) -> bool:
    lim, default = r.get("power_limit_w"), r.get("default_power_limit_w")
    return bool(lim and default and lim < POWER_LIMIT_LOWERED * default)


# ---- gpu.lost ---------------------------------------------------------------------------------------

@check(id="gpu.lost", title="A GPU was lost during the run", severity="error",
       needs=["gpu.devices.lost"], tags=["gpu"], docs=XID_DOCS)
def gpu_lost(ctx):
    """A GPU stopped answering NVML during the run ("GPU is lost": fallen off the bus, a fatal Xid
    error). Error, with when it happened and what the driver said."""
    ev = ctx.evidence
    gpu = gpu_section(ev)
    if not has_devices(gpu):
        yield ctx.skip(no_gpu_reason(gpu))
        return
    lab = label(gpu)
    lost = [d for d in gpu.get("devices") or [] if d.get("lost")]
    if not lost:
        n = len(gpu.get("devices") or [])
        yield ctx.passed(f"All {n} GPU(s) answered for the whole run{lab}.", devices=n, title="No GPU lost")
        return
    parts = []
    for d in lost:
        at = d.get("lost_at")
        parts.append(f"{dev_name(d)} ({d.get('name') or 'unknown'}) stopped answering "
                     + (f"{at:.1f} s into the run" if at else "from the start"))
    err = next((d.get("error") for d in lost if d.get("error")), None)
    yield ctx.finding(
        severity=Severity.ERROR,
        message="; ".join(parts) + lab + (f": {err}." if err else "."),
        evidence={"lost": [d["index"] for d in lost], "lost_at": {str(d["index"]): d.get("lost_at") for d in lost},
                  "error": err},
        why="A lost GPU cannot be used again until it is reset; any process on it has failed or hangs, and the "
            "rest of a multi-GPU job waits for it.",
        fix="Look for Xid errors in the kernel log (Xid 79: fallen off the bus; 48/94/95: uncorrectable memory "
            "errors), reset the GPU or reboot, and if it repeats, check power, cooling and seating, or report "
            "the node to its administrators.",
        snippet="sudo dmesg -T | grep -i xid\nnvidia-smi -q | grep -i -A2 -E 'retired|remapp|xid'\n"
                "sudo nvidia-smi -r -i GPU_INDEX   # reset, when nothing runs on it",
    )
