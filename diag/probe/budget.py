"""The probe's cost budget (issue 28): how often the probe does its per-step extras.

The probe's core step accounting (which step, its phases, its wall time) runs on every step. Its
per-step *extras* — the CUDA-event device timeline (:mod:`diag.probe.timeline`), the allocator reads
(:mod:`diag.probe.memory`), other extension work — run on *sampled* steps only (``ctx.sampled``), and
:class:`Budget` chooses how many: enough that the probe's core plus its extras stay within a share of
the median step (1% by default), where they can.

The rule, fed after every step with the step's wall time and the probe's own time on it, split into
core and extras:

* the first :data:`FIRST` steps are always sampled (a short run loses nothing; the warm-up is seen);
* the first decision is at step ``FIRST + REVIEW`` (26: a run that short is sampled throughout, and
  the first estimate has 16 steps past the start to go on), then every :data:`REVIEW` steps the
  budget looks at the last :data:`WINDOW` steps: ``room`` = the
  budget (share x median step) less the core's median; extras cost ``x`` per sampled step (the median
  over the window's sampled steps of what each brought, with what the unsampled steps after it, up to
  the next sampled one, brought: extras counted a step late still count, so does what an unsampled step
  next to a sampled one costs beyond the core, and a one-off cost, a first record or a compilation,
  does not set the rate), or, when it is larger, what sampling costs on the step's own clock: the median,
  over the last :data:`MEASURED` sampled steps, of the wall time a sampled step and the unsampled step
  after it took beyond two unsampled steps in a row next to them (the median of a few such pairs),
  when that is clear of the step time's own noise (the probe's timers see its own code only, not
  torch's dispatch of its hooks, the caches its work evicts, or an extension's step end that lands in
  the next step: on the depth sweep's 101-call 2 ms CPU step they saw 120-170 µs where the step clock showed
  180-290). The period
  ``p`` (1 step in ``p`` sampled) is the smallest power of two with ``x / p <= room``; with no room at
  all (the core alone is over the budget) it is the floor :data:`FLOOR` (1 in 64); the period goes
  down again (to every step sampled too) only when the smaller one fits with a 25% margin at two
  reviews in a row, priced with what a sampled step cost the last time the run was at that period
  (within :data:`SEEN_FOR` steps: sampled steps closer together cost more each). No flapping at a
  boundary, or on a figure that varies by a quarter from review to review: the 801-call CPU step,
  1% of it just above what the probe's timers see, went 2, 1, 2, 1 ... and then 2, 4, 2, 4 ... every
  16 to 100 steps before these rules (docs/performance.md, twelfth pass);
* the pattern is deterministic and evenly spread: after the first steps, step ``i`` is sampled when
  ``(i - FIRST) % p == 0``. Not random: two runs of the same script sample the same steps, and
  halving or doubling ``p`` keeps the steps already in the pattern;
* **checks**: while ``p`` is under :data:`CHECK_PERIOD` (everything fits by the timers: 1 or 2), the
  step clock has no unsampled steps to price sampling against, and the timers are a lower bound (3-7x
  low on CPU steps of a few ms, docs/performance.md). So :data:`CHECK_LEN` steps in every
  :data:`CHECK_EVERY` (the first check right after the first decisions: steps ``FIRST + 33`` to
  ``FIRST + 96``) are sampled 1 in :data:`CHECK_PERIOD` whatever ``p`` is: enough sampled steps with
  unsampled pairs around them for the step clock's figure (:data:`MEASURED_MIN`). When it shows that
  sampling costs more than the room, the next review raises ``p``; when it fits, ``p`` stays and the
  check costs nothing but ~5% of the steps' extras (48 of 1,024 steps unsampled). The check is part of
  the deterministic pattern (:meth:`Budget.is_sampled`) and changes no period by itself;
* **what the timers miss**: where the step clock has no clear figure (a check on a noisy host: a 2-core
  VM's 12 ms step varies by ±1-2 ms from step to step), a period under :data:`CHECK_PERIOD` is priced
  at :data:`UNSEEN` (2) times the timers' figure: on bench_depth's 801-call CPU step the timers saw
  86-105 µs a sampled step where sampling cost about twice that, and the budget sampled 1 step in 2
  (+1.45% a step, in both trees of the fifteenth pass) where 1 in 4 (+1.15%) is nearer its 1%. At 1 in 4
  and longer the step clock can measure, and the factor does not apply.

Each change of period is kept in :attr:`Budget.changes` (the probe emits them as ``probe_sampling``
events, :data:`diag.evidence.events.PROBE_SAMPLING`; the reports say the rate).

``DIAG_PROBE_BUDGET``: the share (``0.01`` or ``1%``; at most 0.5), or ``0`` / ``off`` to sample every
step. Pure Python, no torch, nothing of the probe: cheap enough to run per step (one call, a few
appends and a modulo; a review every 16 to 64 steps, every 256 at the floor, sorts 64 numbers:
:meth:`Budget.is_review`).
"""
from __future__ import annotations

import math
import os
from collections import deque
from itertools import repeat
from typing import Any, Mapping

ENV = "DIAG_PROBE_BUDGET"
DEFAULT_SHARE = 0.01    # the probe's cost, core and extras, within 1% of the median step where it can
MAX_SHARE = 0.5
FIRST = 10              # steps always sampled at the start
FLOOR = 64              # never fewer than 1 step in 64 sampled
REVIEW = 16             # the period is reviewed every this many steps (after the first ones) ...
REVIEW_MAX = 64         # ... or every period's steps, up to this many, once the period is longer (is_review)
REVIEW_FLOOR = 256      # ... and every this many at the floor, where a review can only sample more: each one walks
#                         the window (~1-2 µs a step at 1 in 64 on bench_depth's short steps, issue 28)
WINDOW = 64             # over the last this many steps
UNSEEN = 2.0            # a sampled step's extras, priced at this many times the probe's timers while the step
#                         clock has no clear figure (the timers see the probe's code only: 2x low on the 801-call
#                         CPU step of bench_depth, 3-7x on steps of a few ms; issue 28, fifteenth pass)
CORE_UNSEEN = 3.0       # the probe's core, priced at this many times its timers: torch's dispatch of its hooks, its
#                         wrappers' frames and the caches its hook entries find cold are on no timer; with no
#                         sampling at all the core cost 3.3-3.7x what the timers saw, at 11, 101 and 801 module
#                         calls a step (bench_depth's steady state, issue 28, seventeenth pass)
DOWN_MARGIN = 1.25      # a shorter period (more sampling) must fit with this margin ...
DOWN_REVIEWS = 2        # ... at this many reviews in a row, priced with what it cost the last time the run
SEEN_FOR = 512          # was at that period, within this many steps
MEASURED = 16           # sampled steps whose cost on the step clock is kept (their median is used)
MEASURED_MIN = 12       # ... and how many are needed before it is used ...
CLEAR = 4               # ... and used when its median is more than this many standard errors above zero
NEAR = 4                # unsampled pairs of steps on each side of a sampled one it is measured against ...
SPAN = 16               # ... within this many steps of it (NEAR after it, at least one before it)
CHECK_PERIOD = 4        # a check samples 1 step in 4 (the least that leaves unsampled pairs between sampled steps)
CHECK_FROM = 32         # the first check starts after this many steps past FIRST (the first decisions made) ...
CHECK_LEN = 64          # ... and lasts this many steps (12 measurable sampled steps: MEASURED_MIN) ...
CHECK_EVERY = 1024      # ... and comes again every this many steps, while the period is under CHECK_PERIOD
_OFF = ("0", "off", "none", "no", "false")
_INF = math.inf
_NO_EXTRAS = (0.0, False)   # an unsampled step's extras


def parse_share(text: str | None) -> float | None:
    """The budget in ``DIAG_PROBE_BUDGET``'s words: ``None`` (unset: the default), ``0``/``off`` (0.0:
    sample every step), ``0.01`` or ``1%``. Raises ValueError with one sentence for anything else."""
    if text is None or not text.strip():
        return None
    t = text.strip().lower()
    if t in _OFF:
        return 0.0
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and 0 <= v <= MAX_SHARE):
        raise ValueError(f"{ENV}={text!r} is not a share of the step between 0 and {MAX_SHARE} (e.g. 0.01 or 1%), "
                         "or 0/off to do the probe's per-step extras on every step")
    return v


def _median(values) -> float:
    v = sorted(values)
    n = len(v)
    if n == 0:
        return 0.0
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def _us(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s >= 1e-3 else f"{s * 1e6:.0f} µs"


class Budget:
    """Which steps are sampled. ``after_step()`` after every step; ``sampled`` is the decision for
    the next one (True for step 1)."""

    def __init__(self, share: float | None = DEFAULT_SHARE, first: int = FIRST, floor: int = FLOOR,
                 review: int = REVIEW, window: int = WINDOW, core_unseen: float = 1.0):
        self.share = share if share else 0.0      # 0: off, every step sampled
        # the core's price per second its timers saw (the probe passes CORE_UNSEEN; 1: the figures as fed)
        self.core_unseen = max(float(core_unseen), 1.0)
        self.first = max(int(first), 1)
        self.floor = max(int(floor), 1)
        self.review = max(int(review), 1)
        self.period = 1
        self.steps = 0                  # steps fed
        self.sampled_steps = 0          # of which sampled
        self.sampled = True             # is the next step (self.steps + 1) sampled?
        self.error: str | None = None   # a bad DIAG_PROBE_BUDGET, in one sentence (the default was used)
        self.changes: list[dict[str, Any]] = []   # every change of period, oldest first
        self._taken = 0                 # changes handed out by pop_changes()
        self._total: deque = deque(maxlen=window)
        self._core: deque = deque(maxlen=window)
        self._extras: deque = deque(maxlen=window)    # (extras_s, sampled) per step
        self._clock: deque = deque(maxlen=window)     # (index, total_s or None, sampled) per step
        self._measured: deque = deque(maxlen=MEASURED)  # sampling's cost on the step clock, a sampled step each
        self._measured_to = 0                           # the last sampled step measured
        self._measured_cost: float | None = None        # what _measure() said last
        self._down = 0                                  # reviews in a row that found a shorter period fits
        self._seen: dict[int, tuple[float, int]] = {}   # period -> (extras a sampled step, step) at its last review
        self._sampled_at = (0, 0)                       # the indexes of the last two sampled steps fed

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **kw: Any) -> "Budget":
        env = os.environ if environ is None else environ
        error = None
        try:
            share = parse_share(env.get(ENV))
        except ValueError as e:
            share, error = None, str(e)
        b = cls(DEFAULT_SHARE if share is None else share, **kw)
        b.error = error
        return b

    @property
    def on(self) -> bool:
        return self.share > 0

    @property
    def rate(self) -> float:
        return 1.0 / self.period

    def is_sampled(self, index: int) -> bool:
        """Is step ``index`` (1-based) sampled under the current period (a check's steps included)?"""
        k = index - self.first
        if k <= 0 or self.share <= 0:
            return True
        return k % (CHECK_PERIOD if self.in_check(index) else self.period) == 0

    def in_check(self, index: int) -> bool:
        """Does step ``index`` fall in a check (sampled 1 in :data:`CHECK_PERIOD` although the period is
        shorter)?"""
        k = index - self.first
        return (self.share > 0 and self.period < CHECK_PERIOD and k > CHECK_FROM
                and (k - CHECK_FROM - 1) % CHECK_EVERY < CHECK_LEN)

    def is_review(self, index: int) -> bool:
        """Is the period reviewed after step ``index``? Every :data:`REVIEW` steps while the period is at
        most that; at longer periods every period's steps (at most :data:`REVIEW_MAX`), half-way between
        two sampled steps (each review's sampled step then has its unsampled neighbours on both sides for
        the step clock's figure, :meth:`_measure`). A review sorts and walks the 64-step window: ~60 µs
        cold on a short CPU step, 4 µs a step at one review in 16, which on the 1.5 ms step of
        ``bench_depth --calls 100`` was a tenth of the probe's whole cost; at 1 in 64 sampled there is
        nothing a review every 16 steps would decide sooner. At the floor (1 in :data:`FLOOR`: the core
        alone over the budget, the case of every short host-bound step) a review can only decide more
        sampling, which the step getting several times longer would allow: every :data:`REVIEW_FLOOR`
        steps there (the budget's work on bench_depth's 11-call step: ~100 bytecodes a step to ~30,
        issue 28). The rule needs no state but the period; every review step is one of the 16-step
        cadence, and the floor's are reviews of the 1-in-64 cycle too."""
        k = index - self.first
        if k <= 0 or k % self.review:
            return False
        every, off = self._review_cycle(self.period)
        return (k - off) % every == 0

    def _review_cycle(self, period: int) -> tuple[int, int]:
        """(every, offset): the review steps are ``first + offset + n * every``. At the floor (no less
        sampling is possible: a review can only decide more) every :data:`REVIEW_FLOOR` steps, on review
        steps of the floor's own cycle (half-way between two sampled steps, as there)."""
        review = self.review
        if period >= self.floor and period >= REVIEW_MAX:
            return REVIEW_FLOOR, REVIEW_MAX // 2
        m = min(period, REVIEW_MAX) // review
        return (review, 0) if m <= 1 else (review * m, review * (m // 2))

    def after_step(self, total_s: float, core_s: float, extras_s: float,
                   extras_sampled: bool | None = None) -> bool:
        """Feed one step: its wall time, the probe's core time on it and its extras' time (extras
        counted a step late are fine: they are summed over the window). ``extras_sampled``: whether the
        step the extras were measured on was sampled, when the caller feeds them a step late (the probe
        decides the next step before its extensions' step-end work); default: this step. Returns
        whether the next step is sampled (also ``self.sampled``)."""
        was = self.sampled
        self.steps = i = self.steps + 1
        if was:
            self.sampled_steps += 1
            self._sampled_at = (i, self._sampled_at[0])
        if self.share > 0:
            ok = 0.0 < total_s < _INF       # (NaN compares false)
            if ok:
                self._total.append(total_s)
            self._clock.append((i, total_s if ok else None, was))
            self._core.append(core_s if 0.0 < core_s < _INF else 0.0)
            self._extras.append((extras_s if 0.0 < extras_s < _INF else 0.0,
                                 was if extras_sampled is None else extras_sampled))
            if i > self.first and (i - self.first) % self.review == 0 and self.is_review(i):
                self._review(i)
            k = i + 1 - self.first
            if k <= 0:
                nxt = True
            else:
                p = self.period
                if p < CHECK_PERIOD and k > CHECK_FROM and (k - CHECK_FROM - 1) % CHECK_EVERY < CHECK_LEN:
                    p = CHECK_PERIOD    # a check (is_sampled, inlined: this runs on every full-path step)
                nxt = k % p == 0
            self.sampled = nxt
            return nxt
        return True

    def _review(self, i: int) -> None:
        if not self._total:
            return
        step = _median(self._total)
        core = _median(self._core)
        ex = list(self._extras)
        per: list[float] = []
        for j, (x, was) in enumerate(ex):
            if was:
                # with the unsampled steps after it, up to the next sampled one: extras counted a step late,
                # and what an unsampled step next to a sampled one costs beyond the core (the probe feeds it
                # as extras: the sampled step's close spilled into the step after it, the extensions' step
                # end in the one before the next)
                k = j + 1
                while k < len(ex) and not ex[k][1]:
                    x += ex[k][0]
                    k += 1
                per.append(x)
        if not per:
            return          # no sampled step in the window: nothing new to judge the extras by
        extras = timed = _median(per)
        measured = self._measure()
        if measured is not None and measured > extras:
            extras = measured
        # the core as it costs the step, not as the timers see it (CORE_UNSEEN): room priced with the timers'
        # figure alone let sampling take room the core had already used (the 101-call CPU step: 1 in 8 to 1
        # in 32 sampled, +5-8 µs a step, where the core alone was over 1%)
        timed_core = core
        core *= self.core_unseen
        room = self.share * step - core
        # at 1 or 2 (below CHECK_PERIOD) no unsampled pairs are left for the step clock to price sampling
        # with: there, without its figure, what the timers miss is priced too (UNSEEN times theirs)
        unseen = UNSEEN if measured is None else 1.0
        period = self._period_for(extras, room)
        if period < CHECK_PERIOD and unseen > 1.0:
            period = max(period, self._period_for(extras * unseen, room))
        self._seen[self.period] = (extras, i)
        if period < self.period:
            # more sampling only with a margin (to every step too), priced with what a sampled step cost
            # the last time the run was at that period (a sampled step costs more when sampled steps are
            # closer: on the 801-call CPU step ~560 µs at 1 in 2 against ~380 at 1 in 4, so 1 in 2 looked
            # as if it fit from 1 in 4 and did not once there), and when the review before found it too: a
            # step time at the boundary, or a figure that varies by a quarter from review to review, does
            # not flap
            c = self.period
            while c > 1:
                x = extras
                seen = self._seen.get(c // 2)
                if seen is not None and i - seen[1] <= SEEN_FOR and seen[0] > x:
                    x = seen[0]
                if c // 2 < CHECK_PERIOD:
                    x *= unseen
                if x * DOWN_MARGIN > room * (c // 2):
                    break
                c //= 2
            period = c
        if period < self.period:
            self._down += 1
            if self._down < DOWN_REVIEWS:
                period = self.period
        else:
            self._down = 0
        if period == self.period:
            return          # (the reason is worded for a change only: a review that changes nothing is most)
        cw = _us(core) if self.core_unseen == 1.0 else f"{_us(core)}: {self.core_unseen:g}x the {_us(timed_core)} its timers saw"
        if period == 1:
            why = (f"core {cw} + extras {_us(extras)} fit in {_us(self.share * step)} "
                   f"({self.share * 100:g}% of the {_us(step)} step)")
        elif room <= 0:
            why = (f"the probe's core alone ({cw}) is over {_us(self.share * step)} "
                   f"({self.share * 100:g}% of the {_us(step)} step): extras at the floor")
        else:
            why = (f"extras {_us(extras)} a sampled step, {_us(room)} of room after the core ({cw}) "
                   f"in {self.share * 100:g}% of the {_us(step)} step")
        if measured is not None and measured > timed:
            why += (f"; extras as the step clock measured them over the last {len(self._measured)} sampled "
                    f"steps (the probe's timers saw {_us(timed)})")
        elif unseen > 1.0 and period < CHECK_PERIOD * 2 and self._period_for(extras, room) < period:
            why += (f"; below 1 in {CHECK_PERIOD} priced at {unseen:g}x the probe's timers: the step clock has "
                    f"no clear figure there, and the timers miss torch's dispatch of the hooks and the caches")
        self.period = period
        self._down = 0
        self.changes.append({"step": i + 1, "period": period, "budget": self.share, "first": self.first,
                             "step_s": round(step, 9), "core_s": round(core, 9), "core_timed_s": round(timed_core, 9), "extras_s": round(extras, 9),
                             "reason": why})

    def _period_for(self, extras: float, room: float) -> int:
        """The smallest power of two ``p`` with ``extras / p <= room`` (1 when everything fits; the floor
        when there is no room)."""
        if extras <= 0 or room >= extras:
            return 1
        if room <= 0:
            return self.floor
        return min(self.floor, 1 << max(math.ceil(math.log2(extras / room)), 0))

    def _measure(self) -> float | None:
        """Sampling's cost on the step clock (s per sampled step), or None where it is not clear of the
        noise. For each sampled step in the window not measured yet and followed by an unsampled one: the
        two steps' wall time less the median wall time of two unsampled steps in a row around them, the
        first not right after a sampled step (what spills from a sampled step is in that one's time; up
        to :data:`NEAR` such pairs before, :data:`NEAR` after, all within :data:`SPAN` steps, at least
        one before: pairs against pairs, so a step time that varies does not read as a cost, and
        neighbours on both sides, so a step time that changes does not either).
        The figure is the median of the last :data:`MEASURED`, used only when there are
        :data:`MEASURED_MIN` and it is more than :data:`CLEAR` (4) times its standard error (a step time that
        varies more than sampling costs leaves the timers' figure in charge). A clear figure stands while
        later medians are not clear but at least half of it: a period raised on the step clock does not
        fall back at the next noisy review and rise again at the next check, and a fluke much higher than
        what follows does not stand. On a noisy clock the figure is rough (a 2-core VM's 30 ms CPU step
        varies by ±10% from step to step: 16 figures' median said 3.4 ms where the sampled and unsampled
        steps' medians differed by ~0.9 ms); it errs towards less sampling, the budget's side. A sampled
        step without :data:`NEAR` pairs after it yet waits for the next review."""
        if not self._clock:
            return self._measured_cost
        todo, last, lo = self._measured_to, self._clock[-1][0], self._clock[0][0]
        # a sampled step in the window after the last one measured, and not the newest step (the two
        # latest sampled steps tell: a loop over the window's 64 took ~5 µs a review)
        if not any(lo <= i and todo < i < last for i in self._sampled_at):
            return self._measured_cost          # nothing new since the last review
        clock = list(self._clock)
        pairs = []                # (position, first step's index, the two steps' wall time) of unsampled pairs
        for j in range(1, len(clock) - 1):
            i, t, was = clock[j]
            k, t2, was2 = clock[j + 1]
            # (not the step right after a sampled one: what spills from the sampled step is in its time)
            if not was and not was2 and k == i + 1 and t is not None and t2 is not None and not clock[j - 1][2]:
                pairs.append((j, i, t + t2))
        for j in range(len(clock) - 1):
            i, t, was = clock[j]
            k, t2, was2 = clock[j + 1]
            if not was or i <= self._measured_to:
                continue
            if was2 or k != i + 1 or t is None or t2 is None:
                self._measured_to = i           # never measurable (no unsampled step after it)
                continue
            # neighbours only: pairs within SPAN steps, NEAR after it and at least one before (a sampled
            # step of a run's slow first steps measured against pairs 30 steps later read as a 9 ms cost:
            # karpathy/makemore, where the period was 2 before the first check)
            after = [v for q, a, v in pairs if q > j + 1 and a <= i + SPAN][:NEAR]
            if len(after) < NEAR:
                if last <= i + SPAN:
                    break                       # its pairs may still come: the next review
                self._measured_to = i           # never measurable
                continue
            before = [v for q, a, v in pairs if q < j and a >= i - SPAN][-NEAR:]
            if not before:
                self._measured_to = i
                continue
            self._measured.append(t + t2 - _median(before + after))
            self._measured_to = i
        n = len(self._measured)
        if n < MEASURED_MIN:
            return None
        costs = list(self._measured)
        cost = _median(costs)
        # the standard error of that median: 1.2533 x the figures' standard deviation / sqrt(n), the
        # deviation from their median absolute deviation (an odd step does not widen it)
        noise = 1.2533 * 1.4826 * _median([abs(c - cost) for c in costs]) / math.sqrt(n)
        if cost > CLEAR * noise:
            self._measured_cost = cost
        elif self._measured_cost is not None and cost >= self._measured_cost / 2:
            pass    # not clear now, but near the last clear figure: that stands (no flapping)
        else:
            self._measured_cost = None
        return self._measured_cost

    def quiet_until(self) -> int:
        """The last step index, from the next one fed on, up to which feeding needs no decision: no review
        falls on those steps and none of the steps after them is sampled (0 when the next step is a
        review or is followed by a sampled one). The probe's lane (diag.probe.lane) feeds such steps in
        one call, :meth:`feed_quiet`, instead of one :meth:`after_step` each."""
        if self.share <= 0:
            return 0
        i = self.steps + 1
        first, review, period = self.first, self.review, self.period
        if period < CHECK_PERIOD:       # a check may fall in the steps ahead: ask is_sampled
            sampled = self.is_sampled
            for _ in range(review + CHECK_PERIOD + 1):
                if (i > first and (i - first) % review == 0) or sampled(i + 1):   # (periods under 4: every 16)
                    return i - 1
                i += 1
            return i - 1
        # the first step from i on that is followed by a sampled one, and the first that is a review
        sampled_at = i if i + 1 <= first else i + (first - i - 1) % period
        every, off = self._review_cycle(period)
        k = max(i - first, 1)
        review_at = first + k + (off - k) % every
        return min(sampled_at, review_at) - 1

    def feed_quiet(self, totals: list, cores: list) -> None:
        """Feed unsampled steps up to :meth:`quiet_until` (their wall times, the probe's core time on each;
        no extras): what :meth:`after_step` does for each, without its decision."""
        n = len(totals)
        if n and 0.0 < min(totals) and max(totals) < _INF and 0.0 <= min(cores) and max(cores) < _INF:
            # every value plain (the common case): the deques extended at C speed (a loop of appends cost
            # ~1,000 bytecodes a call, ~100 a step at a period of 10: issue 28)
            s = self.steps
            self.steps = s + n
            self._total.extend(totals)
            self._clock.extend(zip(range(s + 1, s + n + 1), totals, repeat(False, n)))
            self._core.extend(cores)
            self._extras.extend(repeat(_NO_EXTRAS, n))
        else:
            for total_s, core_s in zip(totals, cores):
                self.steps += 1
                ok = 0.0 < total_s < _INF
                if ok:
                    self._total.append(total_s)
                self._clock.append((self.steps, total_s if ok else None, False))
                self._core.append(core_s if 0.0 < core_s < _INF else 0.0)
                self._extras.append(_NO_EXTRAS)
        self.sampled = False

    def pop_changes(self) -> list[dict[str, Any]]:
        """The changes not yet taken (for the probe to emit), oldest first."""
        out = self.changes[self._taken:]
        self._taken = len(self.changes)
        return out

    def state(self) -> dict[str, Any]:
        """Where it stands: budget, period, rate, first, floor, steps, sampled."""
        return {"budget": self.share, "period": self.period, "rate": self.rate, "first": self.first,
                "floor": self.floor, "steps": self.steps, "sampled": self.sampled_steps}


__all__ = ["Budget", "CHECK_EVERY", "CORE_UNSEEN", "CHECK_FROM", "CHECK_LEN", "CHECK_PERIOD", "DEFAULT_SHARE", "ENV", "FIRST", "FLOOR", "MEASURED", "REVIEW",
           "REVIEW_FLOOR", "REVIEW_MAX", "UNSEEN", "WINDOW", "parse_share"]
