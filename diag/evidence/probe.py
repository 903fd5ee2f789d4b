"""``RankEvidence.probe``: what diag's probe cost the process it observed (issue 20). Per step, the
probe's own time is ``StepRecord.probe_s``; this section is the run's total by part, written when the
script ends. The functions below give the share of the median step (:func:`of_evidence`), the
sentence every report states (:func:`headline`) and how to lighten the probe (:func:`lighten`); the
check ``probe.overhead`` states it above :data:`WARN_SHARE` and warns above :data:`LOUD_SHARE`."""
from __future__ import annotations

import statistics
from typing import Any, Iterable

from diag.evidence._schema import Section


class ProbeSection(Section):
    """The probe's own time over the whole run (seconds), and its hook hand-over."""
    own_s: float | None = None              # the probe's own time: timed_s + estimated_s (s); a lower bound of its cost
    timed_s: float | None = None            # timed around its hook bodies, extensions and event writes (s)
    estimated_s: float | None = None        # what the timer cannot see (torch's dispatch of the probe's hooks), priced by a calibration at install (s)
    by_part: dict[str, Any] | None = None   # own_s by part: hooks, sink, each extension's class name, estimated (s)
    by_part_steady: dict[str, Any] | None = None  # by_part counted from the close of step steady_after_step (the probe's one-off work in the first steps left out: what a steady step pays, by part) (s)
    steady_after_step: int | None = None    # the step by_part_steady counts from
    once_s: dict[str, Any] | None = None    # each extension's work at the run's start and end (install, on_exit: e.g. the memory replay), outside the steps and not in own_s (s)
    calibration_us: dict[str, Any] | None = None  # the install's calibration: µs per hooked forward, per backward's callbacks, per module call in a window
    slow_path_us_per_call: float | None = None  # torch's cost of a global hook pair per module call here (µs)
    handover: bool | None = None            # hooks handed over to the outermost modules (false: global hooks throughout)
    windows: int | None = None              # discovery windows opened (global hooks for about one step each)
    window_reasons: dict[str, Any] | None = None  # windows by reason (install, loader, periodic, ...)
    handovers: int | None = None            # times the global hooks were handed over to module hooks
    hooked_modules: int | None = None       # modules carrying the probe's own hooks at the end
    writer_s: float | None = None           # CPU time of the event writer's thread (encoding and writing step events off the step's thread; not in own_s) (s)
    writer_steps: int | None = None         # steps the run had when writer_s was read
    sampling: dict[str, Any] | None = None  # the cost budget's sampling of per-step extras (diag.probe.budget): budget (share of the median step; 0: off), period (the probe's extras ran on 1 step in period), rate (1/period), first (steps always sampled at the start), floor (the longest period), steps and sampled (steps fed to the budget, and sampled, at the end), changes [{step, period, step_s, core_s (the core as the budget priced it), core_timed_s (as the probe's timers saw it), extras_s, reason}] (the newest 100)


WARN_SHARE = 0.02     # above this the probe's own time may move verdicts that turn on a few percent (info)
LOUD_SHARE = 0.10     # above this on three steps in four: a warning (the probe's time alone reaches the 10% lines
                      # of dataloader.workers and the host-overhead checks). Between the two it is a caveat about
                      # diag, not a fault of the job: a warning there failed `--fail-on warning` on a clean script

# extension class name -> the lower-case name DIAG_PROBE_DISABLE takes (diag/probe/extensions.py)
_DISABLE_NAMES = {"PerfProbe": "perfprobe", "DistributedProbe": "distributedprobe", "FlopCounter": "flopcounter",
                  "MemoryProbe": "memoryprobe"}


PROBE_WARMUP = 5      # the probe's one-off work (environment refresh, FLOP count, first model
                      # description) lands in the first steps: its steady cost is judged after them
MIN_STEPS = 3         # steady steps needed to state a share at all


def step_shares(steps: Iterable[Any]) -> tuple[list[float], list[float], list[float]]:
    """(probe_s, total_s, probe_s / total_s) of the timed steps that carry ``probe_s`` after the
    probe's warm-up (instrumented steps, e.g. the FLOP-counted one, are left out as from every timing
    figure)."""
    own, total, share = [], [], []
    for s in steps:
        if not _counted(s):
            continue
        p = _get(s, "probe_s")
        t = _get(s, "total_s")
        own.append(float(p))
        total.append(float(t))
        share.append(float(p) / float(t))
    return own, total, share


def _counted(s: Any) -> bool:
    """A step :func:`step_shares` counts: timed, carrying ``probe_s``, after the probe's warm-up."""
    p = _get(s, "probe_s")
    t = _get(s, "total_s") or 0.0
    i = _get(s, "index")
    return not (p is None or _get(s, "instrumented") or t <= 0 or (i is not None and i <= PROBE_WARMUP))


def _lower_quartile(values: list[float]) -> float:
    v = sorted(values)
    return v[(len(v) - 1) // 4]


def summarize(steps: Iterable[Any], cost: dict | None = None) -> dict | None:
    """The run's probe figures (None when no timed step carries ``probe_s``). Where the probe sampled
    its per-step extras (its cost budget), an unsampled step is the typical one and a sampled one
    costs more: the figures are an unsampled step's plus the sampled steps' extra cost spread over
    every step (``sampled_share``: the share of the steps sampled), what the run paid per step."""
    steps = list(steps)
    own, total, share = step_shares(steps)
    if len(share) < MIN_STEPS:
        return None
    out: dict[str, Any] = {
        "median_step_share": statistics.median(share),
        # the lower quartile: a share that is above a line on three steps in four (issue 33: a run whose
        # median sat at 1.8-2.1% crossed the 2% line on one run and not on the next)
        "q1_step_share": _lower_quartile(share),
        "median_probe_s": statistics.median(own),
        "median_step_s": statistics.median(total),
        "steps": len(share),
    }
    flags = [_get(s, "sampled") is not False for s in steps if _counted(s)]
    on = [i for i, f in enumerate(flags) if f]
    off = [i for i, f in enumerate(flags) if not f]
    if on and len(off) >= MIN_STEPS:
        frac = len(on) / len(flags)
        extra_s = max(statistics.median([own[i] for i in on]) - statistics.median([own[i] for i in off]), 0.0)
        extra_share = max(statistics.median([share[i] for i in on]) - statistics.median([share[i] for i in off]),
                          0.0)
        base_share = [share[i] for i in off]
        out.update(median_step_share=statistics.median(base_share) + frac * extra_share,
                   q1_step_share=_lower_quartile(base_share) + frac * extra_share,
                   median_probe_s=statistics.median([own[i] for i in off]) + frac * extra_s,
                   sampled_share=frac, sampled_extra_s=extra_s)
    if cost:
        for k in ("by_part", "by_part_steady", "windows", "window_reasons", "handovers", "slow_path_us_per_call", "own_s",
                  "timed_s", "estimated_s", "calibration_us", "handover", "writer_s"):
            if k in cost:
                out[k] = cost[k]
        w, n = cost.get("writer_s"), cost.get("writer_steps")
        if isinstance(w, (int, float)) and isinstance(n, int) and n > 0:
            out["writer_per_step_s"] = w / n
    return out


LOWER_BOUND = "a lower bound: its timed work plus an estimate of torch's dispatch of its hooks"


def headline(summary: dict | None) -> str | None:
    """"diag's probe took 0.4% of the median step (12 µs of 2.9 ms; a lower bound: ...)". The figure is
    what the probe could time in its own code plus an estimate of what it cannot (docs/performance.md):
    its real cost is higher: 3-7x on steps of a few milliseconds (docs/performance.md, eleventh pass)."""
    if not summary:
        return None
    text = (f"diag's probe took {pct(summary['median_step_share'])} of the median step "
            f"({_dur(summary['median_probe_s'])} of {_dur(summary['median_step_s'])}; {LOWER_BOUND})")
    w = summary.get("writer_per_step_s")
    if w:
        # off the step's thread: it costs the step only where the two threads contend for the GIL or a core
        text += f"; its event writer used another {_dur(w)} of CPU a step on a thread of its own"
    return text


def short_headline(summary: dict | None) -> str | None:
    """The headline in one line: "diag's probe took 0.4% of the median step (12 µs of 2.9 ms; a lower
    bound)" (the text report without -v)."""
    if not summary:
        return None
    return (f"diag's probe took {pct(summary['median_step_share'])} of the median step "
            f"({_dur(summary['median_probe_s'])} of {_dur(summary['median_step_s'])}; a lower bound)")


MORE_WORK = "a larger batch, gradient accumulation"


def lighten(summary: dict, more_work: str = MORE_WORK) -> str:
    """How to make the probe lighter: the largest part of its time, and the switch for it.
    ``more_work``: what makes each step do more work, in the words of the framework that ran the loop
    (checks/probe.py passes Lightning's, the Trainer's or accelerate's)."""
    parts = dict(summary.get("by_part_steady") or summary.get("by_part") or {})
    if not parts:
        return ("Rerun with fewer probe extensions (DIAG_PROBE_DISABLE=perfprobe,memoryprobe,"
                "distributedprobe,flopcounter turns them off one by one).")
    name, secs = max(parts.items(), key=lambda kv: kv[1] or 0.0)
    total = sum(v or 0.0 for v in parts.values()) or 1.0
    share = f"{100 * (secs or 0.0) / total:.0f}% of the probe's own time"
    if name == "estimated":
        return (f"The largest part is torch's dispatch of the probe's hooks ({share}, estimated): one hooked "
                "forward and one backward callback a step, or discovery windows that put a global hook on every "
                f"module call; steps that do more work each ({more_work}) lower the share.")
    if name in _DISABLE_NAMES or name not in ("hooks", "sink"):
        env = _DISABLE_NAMES.get(name, name.lower())
        return (f"The largest part is the {name} extension ({share}): rerun with DIAG_PROBE_DISABLE={env} "
                f"to turn it off (its checks are then skipped).")
    if name == "sink":
        return (f"The largest part is writing events ({share}): a run with very many short steps writes one "
                f"event per step; steps that do more work each ({more_work}) lower the share.")
    windows = summary.get("window_reasons") or {}
    if windows and sum(windows.values()) > 8:
        top = max(windows.items(), key=lambda kv: kv[1])
        return (f"The largest part is the probe's hooks ({share}), with {sum(windows.values())} discovery "
                f"windows, most of them for \"{top[0]}\" (each puts a global hook on every module call for one "
                f"step): e.g. a DataLoader re-created every step, or train()/eval() switched every step.")
    per_step = summary.get("median_probe_s")
    step = summary.get("median_step_s")
    fixed = f" (~{_dur(per_step)} a step)" if per_step else ""
    on = f" on a {_dur(step)} step" if step else ""
    return (f"The largest part is the probe's hooks ({share}): its fixed per-step work{fixed} does not grow "
            f"with the model but is a visible share{on}; steps that do more work each ({more_work}) lower "
            "the share, and DIAG_PROBE_DISABLE=perfprobe,memoryprobe,"
            "distributedprobe,flopcounter turns the extensions off one by one.")


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(key)
    return getattr(obj, key, None)


def pct(x: float) -> str:
    p = 100 * x
    return f"{p:.2f}%" if p < 0.1 else f"{p:.1f}%"


def _dur(s: float) -> str:
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} µs"


MAX_SAMPLING_CHANGES = 100
EXTRAS_WORDS = "the probe's per-step extras (its extensions' step work; on a GPU, the device timeline and the memory reads)"


def fold_sampling(section: ProbeSection, data: dict) -> None:
    """Apply one ``probe_sampling`` event (diag.evidence.events.PROBE_SAMPLING) to the section."""
    period = data.get("period")
    if not isinstance(period, int) or isinstance(period, bool) or period < 1:
        raise ValueError(f"probe_sampling period {period!r} is not a whole number >= 1")
    cur = dict(section.sampling or {})
    for k in ("budget", "first"):
        if isinstance(data.get(k), (int, float)) and not isinstance(data.get(k), bool):
            cur[k] = data[k]
    cur["period"] = period
    cur["rate"] = 1.0 / period
    changes = list(cur.get("changes") or [])
    changes.append({k: data[k] for k in ("step", "period", "step_s", "core_s", "core_timed_s", "extras_s", "reason") if k in data})
    cur["changes"] = changes[-MAX_SAMPLING_CHANGES:]
    section.sampling = cur


def sampling_summary(rank) -> dict | None:
    """{sampled, steps, period, budget, first}: the kept steps the probe sampled, of how many, and the
    budget's last period; None when every kept step was sampled (the rate is 1: nothing to say)."""
    steps = getattr(rank, "steps", None) or []
    n = len(steps)
    sampled = sum(1 for s in steps if _get(s, "sampled") is not False)
    if n == 0 or sampled == n:
        return None
    info = getattr(getattr(rank, "probe", None), "sampling", None) or {}
    period = info.get("period") if isinstance(info.get("period"), int) else None
    if not period or period <= 1:
        period = max(1, round(n / max(sampled, 1)))
    # period 1 with steps left out: the budget's checks (diag.probe.budget: a few steps in every 1,024
    # sampled 1 in 4, to price sampling on the step clock), or a run whose rate changed
    return {"sampled": sampled, "steps": n, "period": period, "share": sampled / n, "budget": info.get("budget"),
            "first": info.get("first")}


def sampling_rate_words(s: dict) -> str:
    """"1 step in 8", or "95% of the steps" where the period is 1 and a few steps were left out."""
    if s["period"] > 1:
        return f"1 step in {s['period']}"
    return f"{min(s['share'] * 100, 99):.0f}% of the steps"


def sampling_line(rank) -> str | None:
    """One line for every report where the probe sampled its per-step extras: "the device timeline
    and the memory reads ran on 1 step in 8 (412 of 3,200 steps; probe budget 1% of the step); step
    times were measured on every step". None when every step was sampled."""
    s = sampling_summary(rank)
    if s is None:
        return None
    budget = s.get("budget")
    why = f"probe budget {budget * 100:g}% of the step" if isinstance(budget, (int, float)) and budget > 0 \
        else "the probe's cost budget"
    if s["period"] <= 1:
        why += "; the rest left out by its checks of what sampling costs on the step clock, or at a longer period for a while"
    return (f"{EXTRAS_WORDS[0].upper()}{EXTRAS_WORDS[1:]} ran on {sampling_rate_words(s)} "
            f"({s['sampled']:,} of {s['steps']:,} steps; {why}); step times were measured on every step")


def of_evidence(evidence) -> dict | None:
    """The run's probe figures from Evidence: the primary rank's timed steps (warm-up and instrumented
    steps left out, as from every timing figure) and its ``probe`` section."""
    ranks = getattr(evidence, "ranks", None)
    if not ranks:
        return None
    r = evidence.primary
    section = getattr(r, "probe", None)
    return summarize(r.timed_steps(), dict(section) if section else None)
