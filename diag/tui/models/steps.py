"""Numbers the Steps tab shows, computed from Evidence (pure: no textual, no torch)."""
from __future__ import annotations

from dataclasses import dataclass, field

from diag.evidence import phases as _ph

# (field, label) rows of the breakdown tables, from the one definition (diag.evidence.phases); DDP's
# collective wait sits before "other"
PHASES = tuple((p.field, p.long) for p in _ph.TRAINING if p is not _ph.OTHER) + \
    ((_ph.COMM.field, _ph.COMM.long), (_ph.OTHER.field, _ph.OTHER.long))
EVAL_PHASES = tuple((p.field, p.long) for p in _ph.EVALUATION)
RECENT = 20         # steps in the "now" throughput window
HISTORY = 240       # steps in the history graph


@dataclass
class RankSteps:
    rank: int
    host: str = ""
    status: str = ""
    steps: int = 0
    epoch: int | None = None
    median: dict | None = None        # phase -> seconds (RankEvidence.median_step)
    samples_s: float | None = None    # over the recent window
    tokens_s: float | None = None


@dataclass
class StepSummary:
    step: int = 0                     # the newest step index (rank 0)
    epoch: int | None = None
    timed: int = 0                    # steps in the timing statistics
    instrumented: int = 0             # steps diag slowed on purpose (excluded)
    median: dict | None = None        # rank 0: phase -> seconds, plus "n"
    samples_s: float | None = None    # recent window
    tokens_s: float | None = None
    samples_s_all: float | None = None  # over every timed step so far
    tokens_s_all: float | None = None
    batch: int | None = None          # one forward's batch (a micro-batch under gradient accumulation)
    micro_batches: int | None = None  # forwards per step that make up its samples
    history_ms: list[float] = field(default_factory=list)     # total step time, newest last
    data_share_history: list[float] = field(default_factory=list)
    data_share: float | None = None   # the one data-wait share (RankEvidence.data_wait_share)
    evaluation: dict | None = None    # evaluation passes in sum (RankEvidence.evaluation_summary)
    kind: str = "none"                # training | evaluation | training+evaluation | none (Evidence.run_kind)
    eval: dict | None = None          # evaluation steps: throughput and median phases (RankEvidence.eval_throughput)
    eval_share: dict | None = None    # training with periodic evaluation: its share (RankEvidence.eval_share)
    ranks: list[RankSteps] = field(default_factory=list)


def _rate(steps, attr: str) -> float | None:
    total = sum(s.total_s for s in steps)
    if total <= 0:
        return None
    counts = [getattr(s, attr) for s in steps]
    if not counts or any(c is None for c in counts):
        return None
    return sum(counts) / total


def _rank_steps(r) -> RankSteps:
    timed = r.timed_steps()
    recent = timed[-RECENT:]
    last = r.steps[-1] if r.steps else None
    return RankSteps(rank=r.rank, host=r.host, status=r.status, steps=r.step_stats.count,
                     epoch=last.epoch if last else None, median=r.median_step(),
                     samples_s=_rate(recent, "samples"), tokens_s=_rate(recent, "tokens"))


def summarize_steps(evidence) -> StepSummary:
    out = StepSummary()
    if not evidence.ranks:
        return out
    r = evidence.primary
    st = r.step_stats
    timed = r.timed_steps()
    recent = timed[-RECENT:]
    last = r.steps[-1] if r.steps else None
    out.step = last.index if last else st.count
    out.epoch = last.epoch if last else None
    out.timed = len(timed)
    out.instrumented = sum(1 for s in r.steps if s.instrumented)
    out.median = r.median_step()
    dw = r.data_wait_share()
    out.data_share = dw["share"] if dw else None
    out.evaluation = r.evaluation_summary()
    out.kind = evidence.run_kind()
    out.eval = r.eval_throughput()
    out.eval_share = r.eval_share()
    out.samples_s = _rate(recent, "samples")
    out.tokens_s = _rate(recent, "tokens")
    if st.total_s > 0 and st.timed:
        out.samples_s_all = _rate(timed, "samples")
        out.tokens_s_all = _rate(timed, "tokens")
    out.batch = last.batch if last else None
    out.micro_batches = last.micro_batches if last else None
    hist = [s for s in r.steps if not s.instrumented][-HISTORY:]
    out.history_ms = [s.total_s * 1000 for s in hist]
    out.data_share_history = [(s.data_s / s.total_s) if s.total_s > 0 else 0.0 for s in hist]
    if len(evidence.ranks) > 1:
        out.ranks = [_rank_steps(x) for x in evidence.ranks]
    return out


def phase_shares(median: dict | None) -> list[tuple[str, str, float, float]]:
    """[(key, label, seconds, share of the step)] for the breakdown table."""
    if not median:
        return []
    total = median.get("total_s") or 0.0
    rows = []
    for key, label in PHASES:
        if key == "comm_s" and key not in median:
            continue          # not a DDP run: no collective wait row
        v = median.get(key, 0.0) or 0.0
        rows.append((key, label, v, (v / total) if total > 0 else 0.0))
    return rows


def eval_phase_shares(ev: dict | None) -> list[tuple[str, str, float, float]]:
    """[(key, label, seconds, share of the evaluation step)] for the evaluation rows (the median
    evaluation step's phases)."""
    med = (ev or {}).get("phases")
    if not med:
        return []
    total = med.get("total_s") or 0.0
    return [(key, label, med.get(key) or 0.0, ((med.get(key) or 0.0) / total) if total > 0 else 0.0)
            for key, label in EVAL_PHASES]


# ---- attached jobs (run.source == "attach"): sampled shares, not timings ---------------------------------

MAX_HOT_LINES = 5


def margin95(share: float, n: int) -> float:
    """Half-width of a 95% interval for a share estimated from n samples (normal approximation; the
    same rule as the attach checks' ``margin_95``)."""
    if n <= 0:
        return 1.0
    return 1.96 * (max(share * (1 - share), 0.25 / n) / n) ** 0.5


@dataclass
class AttachRank:
    rank: int
    pid: int | None = None
    samples: int = 0                  # main-thread stack samples in the window
    cycles: int | None = None         # step-like cycles seen (None: not recorded)
    cpu_percent: float | None = None  # the process's CPU over the window (100 = one core)
    alive: bool = True
    phases: list[tuple[str, int, float, float]] = field(default_factory=list)  # (phase, samples, share, ±95%)
    hot_lines: list[dict] = field(default_factory=list)   # {file, line, function, code, samples, share, phase}
    workers: list[dict] = field(default_factory=list)     # {pid, cpu_percent, busy_share, samples, top_frames}
    stuck: dict | None = None


@dataclass
class AttachSummary:
    window_s: float | None = None
    rate_hz: float | None = None
    sampler: str = "py-spy"
    job_pid: int | None = None
    ranks: list[AttachRank] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return [r.pid for r in self.ranks if r.pid is not None]


def is_attach(evidence) -> bool:
    return evidence is not None and getattr(evidence.run, "source", "probe") == "attach"


def _num(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def summarize_attach(evidence) -> AttachSummary | None:
    """What sampling saw, per rank (``ranks[].extras["attach"]``, shape in docs/attach.md); None when
    the evidence does not come from ``diag attach``."""
    if not is_attach(evidence):
        return None
    out = AttachSummary()
    for r in evidence.ranks:
        a = (r.extras or {}).get("attach") or {}
        if not isinstance(a, dict):
            continue
        main = a.get("main") if isinstance(a.get("main"), dict) else {}
        n = int(main.get("samples") or 0)
        phases = []
        for name, d in (main.get("phases") or {}).items():
            if not isinstance(d, dict):
                continue
            c = int(d.get("samples") or 0)
            share = _num(d.get("share"))
            if share is None:
                share = c / n if n else 0.0
            if c or share > 0:
                phases.append((str(name), c, share, margin95(share, n)))
        phases.sort(key=lambda p: (-p[2], p[0]))
        workers = [w for w in (a.get("workers") or []) if isinstance(w, dict)]
        out.ranks.append(AttachRank(
            rank=r.rank, pid=a.get("pid", r.pid), samples=n,
            cycles=main.get("cycles") if isinstance(main.get("cycles"), int) else None,
            cpu_percent=_num(a.get("cpu_percent")), alive=bool(a.get("alive_after", True)),
            phases=phases, hot_lines=[h for h in (main.get("hot_lines") or []) if isinstance(h, dict)][:MAX_HOT_LINES],
            workers=workers, stuck=main.get("stuck") if isinstance(main.get("stuck"), dict) else None))
        if out.window_s is None:
            out.window_s = _num(a.get("window_s"))
            out.rate_hz = _num(a.get("rate_hz"))
            out.sampler = str(a.get("sampler") or "py-spy")
            out.job_pid = a.get("job_pid") if isinstance(a.get("job_pid"), int) else None
    if out.window_s is None:
        out.window_s = _num(evidence.run.wall_s)
    if out.rate_hz is None:
        out.rate_hz = _num((evidence.run.limits or {}).get("rate_hz"))
    return out
