"""Judging the device timeline (diag's side of "the probe records, diag judges"): GPU idle time of a
CUDA run attributed to what the host was doing, and the clock each verdict uses.

Pure Python, no torch. The probe (:mod:`diag.probe.timeline`) writes ``RankEvidence.timeline``:
per step, device seconds per interval and the idle seconds measured in the intervals where the host
queued no GPU work. Causes:

``data``        the host was waiting in ``DataLoader.__next__`` while the GPU had nothing queued;
``h2d``         host-to-device copies from pageable memory (CUDA waits for the stream, stages, copies);
``h2d_pinned``  host-to-device copies from pinned memory (the stream copies instead of computing);
``sync``        idle between two steps in a run whose loop synchronises every step (``.item()``,
                ``.cpu()``, ``synchronize``: located by the sync window, ``RankEvidence.sync``): the sync
                drains the queue, and the host's next work is exposed;
``host``        idle between two steps without a per-step sync: Python overhead, logging;
``checkpoint``  the host was in ``torch.save`` (or safetensors' save);
``eval``        idle during an evaluation pass between two steps (the step model's passes); the device
                time of those passes, busy or idle, is ``eval_share``, reported beside.

Copies are timed only inside the probe's copy window (``SYNC_STEPS`` steps): their shares are measured
over the steps of that window (``TimelineSummary.copies``), every other cause over every steady step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from diag.evidence import RankEvidence, median
from diag.evidence.phases import BACKWARD, DATA, FORWARD, OPTIMIZER, OTHER, TRAINING, steady_steps

CAUSES = ("data", "h2d", "h2d_pinned", "sync", "host", "checkpoint", "eval")
CAUSE_WORDS = {"data": "waiting for data", "h2d": "in host-to-device copies from pageable memory",
               "h2d_pinned": "in host-to-device copies from pinned memory", "sync": "after host syncs",
               "host": "in Python between steps", "checkpoint": "checkpointing", "eval": "during evaluation"}


@dataclass
class CopyCost:
    """Host-to-device copies over the steps of the copy window (device clock)."""
    steps: int                      # window steps resolved (every copy of them timed)
    pageable_n: int
    pageable_bytes: int
    pageable_s: float               # device seconds in pageable copies (GPU idle for compute)
    pinned_n: int
    pinned_bytes: int
    pinned_s: float
    device_s: float                 # the device span of those steps

    @property
    def pageable_share(self) -> float:
        return self.pageable_s / self.device_s if self.device_s > 0 else 0.0

    @property
    def pinned_share(self) -> float:
        return self.pinned_s / self.device_s if self.device_s > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        n = max(self.steps, 1)
        out: dict[str, Any] = {"window_steps": self.steps}
        for kind in ("pageable", "pinned"):
            cnt, by, sec = getattr(self, f"{kind}_n"), getattr(self, f"{kind}_bytes"), getattr(self, f"{kind}_s")
            out[kind] = {"copies_per_step": round(cnt / n, 3), "bytes_per_step": int(by / n),
                         "seconds_per_step": round(sec / n, 7), "share": round(getattr(self, f"{kind}_share"), 4),
                         "gb_per_s": round(by / sec / 1e9, 3) if sec > 0 and by else None}
        return out


@dataclass
class TimelineSummary:
    """GPU busy/idle over the steady-state steps of one rank, on the device clock."""
    steps: int
    device_s: float                 # sum of the steps' device spans
    busy_s: float                   # training work (evaluation's device time out)
    idle_s: float
    idle_share: float               # idle / device span (the sum of ``causes``)
    causes: dict[str, float] = field(default_factory=dict)   # cause -> idle share of the device span
    step_s: float = 0.0             # median device span of a step
    host_step_s: float = 0.0        # median host span of the same steps
    host_data_share: float | None = None   # the probe's host-clock data wait share of the same steps
    eval_share: float = 0.0         # device time of evaluation passes between steps (busy or idle) / span
    copies: CopyCost | None = None  # copies of the copy window (None: no step of it resolved)

    def headline(self) -> str:
        s = f"the GPU was idle {self.idle_share * 100:.0f}% of the step"
        top = sorted(((v, k) for k, v in self.causes.items() if v > 0), reverse=True)
        if top:
            v, k = top[0]
            s += f"; {v * 100:.0f} points of it {CAUSE_WORDS[k]}"
        if self.eval_share >= 0.005:
            s += f"; {self.eval_share * 100:.0f}% of device time went to evaluation between steps"
        return s

    def as_dict(self) -> dict[str, Any]:
        out = {"clock": "device", "steps": self.steps, "idle_share": round(self.idle_share, 4),
               "busy_s": round(self.busy_s, 6), "idle_s": round(self.idle_s, 6),
               "idle_causes": {k: round(v, 4) for k, v in self.causes.items()},
               "eval_share": round(self.eval_share, 4),
               "device_step_s": round(self.step_s, 6), "host_step_s": round(self.host_step_s, 6)}
        if self.copies is not None:
            out["copies"] = self.copies.as_dict()
        return out


def syncs_every_step(r: RankEvidence) -> bool:
    per = r.sync.per_step if isinstance(r.sync.per_step, list) else None
    return bool(per) and median([float(x) for x in per]) >= 1


def timeline_steps(r: RankEvidence, skip_warmup: int | None = None) -> list[dict]:
    """The resolved device-timeline steps usable for judging: those of the rank's steady steps
    (:func:`diag.evidence.phases.steady_steps`: instrumented steps and the warm-up out; ``skip_warmup``:
    that many first steps instead). The probe times the device on its sampled steps only, so these
    are sampled steps; a median over them is a median over the run. Empty without a device timeline."""
    tl = r.timeline
    if tl.clock != "device" or not isinstance(tl.steps, list):
        return []
    steps = [s for s in tl.steps if isinstance(s, dict) and isinstance(s.get("device_s"), (int, float))]
    host = {s.index for s in r.steps}
    if host and any(s.get("index") in host for s in steps):
        steady = {s.index for s in r.timed_steps(skip_warmup)}
        # a record of a step the host list no longer holds is newer than its trimmed start: steady
        return [s for s in steps if s.get("index") in steady or s.get("index") not in host]
    # no host steps for these records (evidence made by hand): the rule on the records themselves
    return steady_steps(steps, skip_warmup, instrumented={s.index for s in r.steps if s.instrumented})


def copy_cost(steps: list[dict]) -> CopyCost | None:
    """Copies over the steps whose copies were all timed (the copy window), or None."""
    win = [s for s in steps if isinstance(s.get("copies"), dict) and s["copies"].get("watched")]
    if not win:
        return None

    def n(s, k):
        v = s["copies"].get(k)
        return v if isinstance(v, (int, float)) else 0

    def ph(s, k):
        v = (s.get("phases") or {}).get(k, 0.0)
        return float(v) if isinstance(v, (int, float)) else 0.0

    return CopyCost(steps=len(win), pageable_n=int(sum(n(s, "pageable_n") for s in win)),
                    pageable_bytes=int(sum(n(s, "pageable_bytes") for s in win)),
                    pageable_s=sum(ph(s, "h2d") for s in win),
                    pinned_n=int(sum(n(s, "pinned_n") for s in win)),
                    pinned_bytes=int(sum(n(s, "pinned_bytes") for s in win)),
                    pinned_s=sum(ph(s, "h2d_pinned") for s in win),
                    device_s=sum(float(s["device_s"]) for s in win))


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
            if isinstance(v, (int, float)):
                idle_by[k] = idle_by.get(k, 0.0) + float(v)
    eval_s = sum(float((s.get("phases") or {}).get("eval", 0.0)) for s in steps)
    between = idle_by.get("between", 0.0)
    sync = syncs_every_step(r)
    causes = {"data": idle_by.get("data", 0.0) / dev,
              "sync": between / dev if sync else 0.0, "host": 0.0 if sync else between / dev,
              "checkpoint": idle_by.get("ckpt", 0.0) / dev, "eval": idle_by.get("eval", 0.0) / dev}
    copies = copy_cost(steps)
    if copies is not None:
        # copies are timed inside the window only: elsewhere their time is inside the forward interval
        causes["h2d"], causes["h2d_pinned"] = copies.pageable_share, copies.pinned_share
    else:
        causes["h2d"] = idle_by.get("h2d", 0.0) / dev
        causes["h2d_pinned"] = idle_by.get("h2d_pinned", 0.0) / dev
    causes = {k: causes[k] for k in CAUSES}
    idle_share = min(sum(causes.values()), 1.0)
    idle = idle_share * dev
    eval_busy = max(eval_s - idle_by.get("eval", 0.0), 0.0)
    host_total = sum(float(s.get("host_s") or 0.0) for s in steps)
    by_index = {s.index: s for s in r.steps}
    hs = [by_index[s["index"]] for s in steps if s.get("index") in by_index]
    h_total = sum(x.total_s for x in hs)
    host_data = sum(x.data_s for x in hs) / h_total if h_total > 0 else None
    return TimelineSummary(
        steps=len(steps), device_s=dev, busy_s=max(dev - idle - eval_busy, 0.0), idle_s=idle, idle_share=idle_share,
        causes=causes,
        step_s=median([float(s["device_s"]) for s in steps]),
        host_step_s=median([float(s.get("host_s") or 0.0) for s in steps]) if host_total else 0.0,
        host_data_share=host_data, eval_share=eval_s / dev, copies=copies)


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


def device_phases(r: RankEvidence, skip_warmup: int | None = None) -> dict | None:
    """Medians over a rank's device-timeline steps in the shape of the host phases (``data_s``: GPU
    idle waiting for data; ``forward_s``, ``backward_s``, ``optimizer_s``: device time of those
    intervals; ``other_s``: the rest; ``total_s``: the device span), or None without a timeline."""
    steps = timeline_steps(r, skip_warmup)
    if not steps:
        return None

    def ph(s, k):
        return float((s.get("phases") or {}).get(k, 0.0))

    out = {DATA.field: median([float((s.get("idle") or {}).get(DATA.name, 0.0)) for s in steps])}
    for p in (FORWARD, BACKWARD, OPTIMIZER):
        out[p.field] = median([ph(s, p.name) for s in steps])
    out["total_s"] = median([float(s["device_s"]) for s in steps])
    out[OTHER.field] = max(out["total_s"] - sum(out[p.field] for p in TRAINING if p is not OTHER), 0.0)
    out["n"] = len(steps)
    return out
