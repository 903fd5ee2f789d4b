"""The phases of a step and the steady-steps rule, defined once for every reader (fold, checks, the
text, JSON and HTML reports, the TUI, ``diag compare``, ``diag attach``) (issue 28; docs/steps.md).

**Phases.** A training step is ``data`` + ``forward`` + ``backward`` + ``optimizer`` + ``other``
(``StepRecord.<name>_s``; they add up to ``total_s``). Under DDP the time waiting in collectives
(``StepRecord.extra["comm_wait_s"]``) is shown as a phase of its own, :data:`COMM` (``comm_s`` in
:meth:`RankEvidence.median_step`). An evaluation step is ``data`` + ``h2d`` + ``forward`` + ``other``
(``EvalStepRecord``).

**Steady steps** (:func:`steady_steps`): the steps a timing figure is taken over.

1. Instrumented steps go (the FLOP-counted step, the step after the memory replay: diag slowed them).
2. The warm-up goes: the run's first timed step, and after it every step up to the last one that is
   still slow (above the median of the later steps by half of it, or by 6 median absolute
   deviations on a noisy run) among the first :func:`warmup_count` (10% of the run's timed steps, at
   least 1, at most 20, as long as :data:`MIN_STEADY` remain). The first step always carries
   torch's one-off costs (lazy CUDA and cuBLAS initialisation, the optimizer's state allocated at
   its first ``step()``, the allocator growing its pool, ``cudnn.benchmark``'s search) and the
   probe's (hook discovery); a compiled model compiles in step 1 and may recompile or record CUDA
   graphs in the next ones, which the slow-step test catches; a run without such steps keeps them
   all (dropping 10% of a bimodal run's steps moved its median by 4%: the demo's 80.2 -> 76.9 ms).
   The count is over the run's steps (``index``), not over the kept list: a long run whose first
   steps were dropped from the evidence (``MAX_STEPS_KEPT``) has no warm-up left in it. Before
   issue 28 the checks dropped step 1 only and ``diag compare`` always dropped the 10%.
3. Where the reader needs the probe's per-step extras (device timeline, allocator reads, extension
   values in ``extra``), the steps the probe did not sample go too (``sampled=True``): the probe
   does those extras on sampled steps only (its cost budget, docs/performance.md). A median over
   sampled steps is still a median: the pattern is evenly spread and deterministic, not tied to
   what a step does.

Records are ``StepRecord`` / ``EvalStepRecord`` objects or dicts with the same keys (the device
timeline's records, the compare export's rows). Pure Python, no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Sequence, TypeVar


@dataclass(frozen=True)
class Phase:
    """One phase of a step."""
    name: str       # "data": the key compare, attach and the device timeline use
    label: str      # short label for tables and charts ("data")
    long: str       # label where there is room ("data wait")

    @property
    def field(self) -> str:
        """The record field in seconds (``data_s``)."""
        return f"{self.name}_s"


DATA = Phase("data", "data", "data wait")
FORWARD = Phase("forward", "forward", "forward")
BACKWARD = Phase("backward", "backward", "backward")
OPTIMIZER = Phase("optimizer", "optimizer", "optimizer")
OTHER = Phase("other", "other", "other")
COMM = Phase("comm", "collective wait", "collective wait")   # DDP: extra["comm_wait_s"], apart from the five
H2D = Phase("h2d", "H2D", "host-to-device")

TRAINING: tuple[Phase, ...] = (DATA, FORWARD, BACKWARD, OPTIMIZER, OTHER)   # add up to StepRecord.total_s
EVALUATION: tuple[Phase, ...] = (DATA, H2D, FORWARD, Phase("other", "other", "other (post-processing)"))

TRAINING_NAMES = tuple(p.name for p in TRAINING)        # ("data", "forward", "backward", "optimizer", "other")
TRAINING_FIELDS = tuple(p.field for p in TRAINING)      # ("data_s", ..., "other_s")
STEP_FIELDS = ("total_s",) + TRAINING_FIELDS            # what a training step's timing is
EVAL_FIELDS = ("total_s",) + tuple(p.field for p in EVALUATION)
# the phases a step is made of, in the order a training loop runs them (attach: "step-like" cycles)
LOOP_NAMES = ("data", "forward", "backward", "optimizer")

# the steady-steps rule
WARMUP_SHARE = 0.1      # the warm-up is at most the first 10% of a run's timed steps ...
WARMUP_MIN = 1          # ... and at least one (the first step) ...
WARMUP_MAX = 20         # ... and at most 20
MIN_STEADY = 3          # steps that must remain for any to be dropped as warm-up
REFERENCE = 200         # the steady level a warm-up step is compared with: the steps after the cap, this many at most

R = TypeVar("R")


def warmup_count(n: int) -> int:
    """The most warm-up steps a run of ``n`` timed steps can have (:func:`warmup_of` finds how many
    it had)."""
    if n <= MIN_STEADY:
        return 0
    w = min(WARMUP_MAX, max(WARMUP_MIN, math.ceil(WARMUP_SHARE * n)))
    return min(w, n - MIN_STEADY)


def _get(rec: Any, key: str, default: Any = None) -> Any:
    if isinstance(rec, dict):
        return rec.get(key, default)
    return getattr(rec, key, default)


def is_sampled(rec: Any) -> bool:
    """Did the probe do its per-step extras on this step? (absent: yes; older evidence is sampled
    throughout)."""
    return _get(rec, "sampled", True) is not False


def _ordinals(timed: Sequence[Any], instrumented: Sequence[int], limit: int) -> tuple[list[int], int]:
    """The place among the run's timed steps (1-based) of the first ``limit`` timed records (its
    index less the instrumented steps before it), and the run's timed steps so far (the last
    record's place). Records without usable indices (0, repeated, out of order: made by hand) count
    by position. Only the first records matter to the warm-up: the rest are not looked at."""
    head = [s.get("index") if isinstance(s, dict) else getattr(s, "index", None) for s in timed[:limit]]
    last = timed[-1].get("index") if isinstance(timed[-1], dict) else getattr(timed[-1], "index", None)
    prev = 0
    ok = True
    for i in head:
        if type(i) is not int or i <= prev:
            ok = False
            break
        prev = i
    if not ok or type(last) is not int or last < prev:
        return list(range(1, len(head) + 1)), len(timed)
    ints: list[int] = [i for i in head if type(i) is int]
    if not instrumented:
        return ints, max(last, len(timed))
    inst = sorted(instrumented)
    out, j = [], 0
    for i in ints:
        while j < len(inst) and inst[j] < i:
            j += 1
        out.append(i - j)
    return out, max(last - sum(1 for x in inst if x < last), len(timed))


def _slow_line(totals: list[float]) -> float:
    """A step time above which a step is not at the run's steady level: the median plus half of it,
    or plus 6 median absolute deviations on a run that varies more (a loaded machine)."""
    if not totals:
        return math.inf
    med = _median(totals)
    mad = _median([abs(x - med) for x in totals])
    return med + max(0.5 * med, 6 * mad)


def _median(v: list[float]) -> float:
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def warmup_of(timed: Sequence[Any], ordinals: Sequence[int], n: int | None = None) -> int:
    """The run's warm-up, in timed steps (``ordinals``: the place of the first records among the
    run's timed steps; ``n``: the run's timed steps so far): the first step, then up to
    :func:`warmup_count` steps as long as one of them is still slow (above :func:`_slow_line` of the
    steps after them): the last slow one among the first ``warmup_count`` steps ends the warm-up. 0
    when too few steps remain to drop any."""
    if not timed or not ordinals:
        return 0
    cap = warmup_count(max(ordinals[-1], len(timed)) if n is None else n)
    if cap == 0 or ordinals[0] > cap:
        return cap and 1      # (a list that starts after the warm-up: nothing of it to drop)

    def total(s: Any) -> float:
        v = _get(s, "total_s")
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0

    # the steady level: the steps right after the warm-up's cap (at most REFERENCE of them)
    after = [total(s) for s, o in zip(timed, ordinals) if cap < o <= cap + REFERENCE]
    if len(after) < MIN_STEADY:
        after = [total(s) for s, o in zip(timed, ordinals) if o >= 2]
    line = _slow_line(after)
    w = 1
    for s, o in zip(timed, ordinals):
        if 2 <= o <= cap and total(s) > line:
            w = o
    return w


def steady_steps(records: Iterable[R], warmup: int | None = None, sampled: bool = False,
                 instrumented: Iterable[int] = ()) -> list[R]:
    """The steady steps of ``records`` (a rank's kept steps, oldest first): instrumented ones
    dropped, then the warm-up (:func:`warmup_of`, or the first ``warmup`` timed steps when given),
    then, with ``sampled``, the steps the probe did not sample. ``instrumented``: more step indices
    to treat as instrumented (records that do not carry the flag, e.g. the device timeline's)."""
    extra = set(instrumented)
    timed, inst_idx = [], []
    recs: list[Any] = records if isinstance(records, list) else list(records)
    if recs and not extra and not isinstance(recs[0], dict) and hasattr(recs[0], "instrumented"):
        # StepRecord / EvalStepRecord (every reader's common case: a rank's 2,000 kept steps)
        timed = [s for s in recs if not s.instrumented]
        if len(timed) < len(recs):
            inst_idx = [s.index for s in recs if s.instrumented and isinstance(s.index, int)]
        recs = []
    for s in recs:
        if isinstance(s, dict):
            flagged, i = s.get("instrumented"), s.get("index")
        else:
            flagged, i = getattr(s, "instrumented", False), getattr(s, "index", None)
        if flagged or (extra and i in extra):
            if isinstance(i, int):
                inst_idx.append(i)
        else:
            timed.append(s)
    if not timed:
        return []
    if warmup is None:
        ords, n = _ordinals(timed, inst_idx, WARMUP_MAX + REFERENCE + 1)
        w = warmup_of(timed, ords, n)
    else:               # an explicit count: all or nothing, as before (3 must remain)
        w = max(int(warmup), 0)
        if len(timed) < w + MIN_STEADY:
            w = 0
        ords = _ordinals(timed, inst_idx, w + 1)[0] if w else []
    # places increase along the list: the warm-up is a prefix of it
    k = 0
    while k < len(ords) and ords[k] <= w:
        k += 1
    out = timed[k:] if k else timed
    if sampled:
        out = [s for s in out if (s.get("sampled", True) if isinstance(s, dict) else getattr(s, "sampled", True))
               is not False]
    return out


def warmup_dropped(records: Sequence[Any], steady: Sequence[Any]) -> int:
    """How many timed records the rule left out as warm-up (for "n warm-up steps left out")."""
    timed = sum(1 for s in records if not _get(s, "instrumented"))
    return max(timed - len(steady), 0)


__all__ = ["BACKWARD", "COMM", "DATA", "EVALUATION", "EVAL_FIELDS", "FORWARD", "H2D", "LOOP_NAMES", "MIN_STEADY",
           "OPTIMIZER", "OTHER", "Phase", "STEP_FIELDS", "TRAINING", "TRAINING_FIELDS", "TRAINING_NAMES",
           "WARMUP_MAX", "WARMUP_MIN", "WARMUP_SHARE", "is_sampled", "steady_steps", "warmup_count",
           "warmup_dropped"]
