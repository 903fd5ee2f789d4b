"""Judging the device timeline (diag's side of "the probe records, diag judges"): GPU idle time of a
CUDA run attributed to what the host was doing, and the clock each verdict uses.

Pure Python, no torch. The probe (:mod:`diag.probe.timeline`) writes ``RankEvidence.timeline``:
per step, device seconds per interval and the idle seconds measured in the intervals where the host
queued no GPU work. Causes:

``data``   the host was waiting in ``DataLoader.__next__`` while the GPU had nothing queued;
``h2d``    host-to-device copies (the compute stream waits for the copy);
``sync``   idle between two steps in a run whose loop synchronises every step (``.item()``, ``.cpu()``,
           ``synchronize``: located by the sync window, ``RankEvidence.sync``): the sync drains the queue,
           and the host's next work is exposed;
``host``   idle between two steps without a per-step sync: Python overhead, logging, checkpointing;
``eval``   evaluation between two steps (GPU busy, but not training).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diag.evidence import RankEvidence, median

CAUSES = ("data", "h2d", "sync", "host", "eval")
CAUSE_WORDS = {"data": "waiting for data", "h2d": "in host-to-device copies", "sync": "after host syncs",
               "host": "in Python between steps", "eval": "evaluating"}


@dataclass
class TimelineSummary:
    """GPU busy/idle over the steady-state steps of one rank, on the device clock."""
    steps: int
    device_s: float                 # sum of the steps' device spans
    busy_s: float
    idle_s: float
    idle_share: float               # idle / device span
    causes: dict[str, float] = field(default_factory=dict)   # cause -> share of the device span
    step_s: float = 0.0             # median device span of a step
    host_step_s: float = 0.0        # median host span of the same steps
    host_data_share: float | None = None   # the probe's host-clock data wait share of the same steps

    def headline(self) -> str:
        s = f"the GPU was idle {self.idle_share * 100:.0f}% of the step"
        top = sorted(((v, k) for k, v in self.causes.items() if k != "eval" and v > 0), reverse=True)
        if top:
            v, k = top[0]
            s += f"; {v * 100:.0f} points of it {CAUSE_WORDS[k]}"
        if self.causes.get("eval"):
            s += f"; {self.causes['eval'] * 100:.0f}% of device time went to evaluation between steps"
        return s

    def as_dict(self) -> dict[str, Any]:
        return {"clock": "device", "steps": self.steps, "idle_share": round(self.idle_share, 4),
                "busy_s": round(self.busy_s, 6), "idle_s": round(self.idle_s, 6),
                "idle_causes": {k: round(v, 4) for k, v in self.causes.items()},
                "device_step_s": round(self.step_s, 6), "host_step_s": round(self.host_step_s, 6)}


def syncs_every_step(r: RankEvidence) -> bool:
    per = r.sync.per_step if isinstance(r.sync.per_step, list) else None
    return bool(per) and median([float(x) for x in per]) >= 1


def timeline_steps(r: RankEvidence, skip_warmup: int = 1) -> list[dict]:
    """The resolved device-timeline steps usable for judging (the first ``skip_warmup`` dropped
    when enough remain); empty without a device timeline."""
    tl = r.timeline
    if tl.clock != "device" or not isinstance(tl.steps, list):
        return []
    steps = [s for s in tl.steps if isinstance(s, dict) and isinstance(s.get("device_s"), (int, float))]
    instrumented = {s.index for s in r.steps if s.instrumented}
    steps = [s for s in steps if s.get("index") not in instrumented]
    if len(steps) > skip_warmup + 2:
        steps = [s for s in steps if (s.get("index") or 0) > skip_warmup]
    return steps


def summarize(r: RankEvidence) -> TimelineSummary | None:
    """GPU idle share and its causes over the steady-state steps, or None without a device timeline."""
    steps = timeline_steps(r)
    if not steps:
        return None
    dev = sum(float(s["device_s"]) for s in steps)
    if dev <= 0:
        return None
    idle_by: dict[str, float] = {}
    for s in steps:
        for k, v in (s.get("idle") or {}).items():
            idle_by[k] = idle_by.get(k, 0.0) + float(v)
    eval_s = sum(float((s.get("phases") or {}).get("eval", 0.0)) for s in steps)
    between = idle_by.pop("between", 0.0)
    causes = {"data": idle_by.get("data", 0.0), "h2d": idle_by.get("h2d", 0.0),
              "sync": between if syncs_every_step(r) else 0.0,
              "host": 0.0 if syncs_every_step(r) else between, "eval": eval_s}
    idle = sum(v for k, v in causes.items() if k != "eval")
    host_total = sum(float(s.get("host_s") or 0.0) for s in steps)
    by_index = {s.index: s for s in r.steps}
    hs = [by_index[s["index"]] for s in steps if s.get("index") in by_index]
    h_total = sum(x.total_s for x in hs)
    host_data = sum(x.data_s for x in hs) / h_total if h_total > 0 else None
    return TimelineSummary(
        steps=len(steps), device_s=dev, busy_s=max(dev - idle - eval_s, 0.0), idle_s=idle, idle_share=idle / dev,
        causes={k: v / dev for k, v in causes.items()},
        step_s=median([float(s["device_s"]) for s in steps]),
        host_step_s=median([float(s.get("host_s") or 0.0) for s in steps]) if host_total else 0.0,
        host_data_share=host_data)


@dataclass
class DataWait:
    """The share of step time lost waiting for data, on the clock the run allows.

    ``clock`` is ``"device"`` (GPU idle caused by data wait, from the device timeline) or ``"host"``
    (the probe's host-clock DataLoader wait: CPU runs, or CUDA runs without a timeline). ``host_share``
    is the host-clock share in both cases; on the device clock, ``hidden`` says the host waited
    (``host_share`` at or above the threshold given) while the GPU did not idle for it."""
    clock: str
    share: float | None
    host_share: float | None
    steps: int = 0
    summary: TimelineSummary | None = None

    def hidden(self, threshold: float) -> bool:
        return (self.clock == "device" and self.share is not None and self.share < threshold
                and self.host_share is not None and self.host_share >= threshold)

    def evidence(self) -> dict[str, Any]:
        out: dict[str, Any] = {"clock": self.clock}
        if self.clock == "device" and self.summary is not None:
            out.update(gpu_idle_share=round(self.summary.idle_share, 4),
                       gpu_idle_data_share=round(self.share or 0.0, 4),
                       host_data_share=round(self.host_share, 4) if self.host_share is not None else None,
                       idle_causes={k: round(v, 4) for k, v in self.summary.causes.items()})
        return out

    def sentence(self) -> str:
        """One sentence with the device numbers ('' on the host clock)."""
        if self.clock != "device" or self.summary is None:
            return ""
        return f" On the device clock {self.summary.headline()}."


def data_wait(r: RankEvidence) -> DataWait:
    s = summarize(r)
    steps = r.timed_steps()
    total = sum(x.total_s for x in steps)
    host = sum(x.data_s for x in steps) / total if total > 0 else None
    if s is None:
        return DataWait("host", host, host, len(steps))
    return DataWait("device", s.causes.get("data", 0.0), s.host_data_share if s.host_data_share is not None else host,
                    s.steps, s)


def device_busy(r: RankEvidence) -> tuple[float, float, int] | None:
    """(median device busy seconds per step, median device span per step, steps) from the timeline."""
    steps = timeline_steps(r)
    if not steps:
        return None
    busy = median([float(s.get("busy_s") or 0.0) for s in steps])
    span = median([float(s["device_s"]) for s in steps])
    return busy, span, len(steps)


def device_phases(r: RankEvidence, skip_warmup: int = 1) -> dict | None:
    """Medians over a rank's device-timeline steps in the shape of the host phases (``data_s``: GPU
    idle waiting for data; ``forward_s``, ``backward_s``, ``optimizer_s``: device time of those
    intervals; ``other_s``: the rest; ``total_s``: the device span), or None without a timeline."""
    steps = timeline_steps(r, skip_warmup)
    if not steps:
        return None

    def ph(s, k):
        return float((s.get("phases") or {}).get(k, 0.0))

    out = {"data_s": median([float((s.get("idle") or {}).get("data", 0.0)) for s in steps]),
           "forward_s": median([ph(s, "forward") for s in steps]),
           "backward_s": median([ph(s, "backward") for s in steps]),
           "optimizer_s": median([ph(s, "optimizer") for s in steps]),
           "total_s": median([float(s["device_s"]) for s in steps])}
    out["other_s"] = max(out["total_s"] - out["data_s"] - out["forward_s"] - out["backward_s"]
                         - out["optimizer_s"], 0.0)
    out["n"] = len(steps)
    return out
