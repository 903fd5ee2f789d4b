"""The probe's cost budget (diag/probe/budget.py, issue 28), on synthetic step sequences, no torch:
it samples the first steps, then a deterministic, evenly spread pattern whose period keeps the probe's
core + extras within the budget where it can, never below the floor, and records each change."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from diag.probe import budget as B


def _feed(b: B.Budget, n: int, step_s: float, core_s: float, extras_s: float) -> list[int]:
    """Feed n steps (extras cost only on sampled steps); return the sampled steps' indices."""
    out = []
    for _ in range(n):
        i = b.steps + 1
        s = b.sampled
        if s:
            out.append(i)
        b.after_step(step_s, core_s, extras_s if s else 0.0)
    return out


def test_parse_share():
    assert B.parse_share(None) is None and B.parse_share(" ") is None
    assert B.parse_share("0.01") == 0.01 and B.parse_share("2%") == pytest.approx(0.02)
    for off in ("0", "off", "OFF", "none"):
        assert B.parse_share(off) == 0.0
    for bad in ("abc", "-1", "5", "nan", "70%"):
        with pytest.raises(ValueError, match="DIAG_PROBE_BUDGET"):
            B.parse_share(bad)


def test_from_env_reads_the_share_and_says_what_was_wrong():
    assert B.Budget.from_env({}).share == B.DEFAULT_SHARE
    assert B.Budget.from_env({"DIAG_PROBE_BUDGET": "0.05"}).share == 0.05
    off = B.Budget.from_env({"DIAG_PROBE_BUDGET": "off"})
    assert not off.on and _feed(off, 500, 0.002, 1e-3, 1e-3) == list(range(1, 501))
    bad = B.Budget.from_env({"DIAG_PROBE_BUDGET": "lots"})
    assert bad.share == B.DEFAULT_SHARE and bad.error and "DIAG_PROBE_BUDGET='lots'" in bad.error


def _check_steps(b: B.Budget, n: int) -> list[int]:
    """The steps up to n that a check leaves unsampled while the period is 1."""
    return [i for i in range(1, n + 1) if b.in_check(i) and (i - B.FIRST) % B.CHECK_PERIOD]


def test_a_long_step_samples_every_step_but_a_check():
    # 100 ms step, 1 ms budget: 150 µs of core and 300 µs of extras fit: every step is sampled but the
    # check's (1 in 4 sampled, FIRST + 33 to FIRST + 80): the step clock shows nothing, the period stays
    b = B.Budget()
    sampled = _feed(b, 1300, 0.100, 150e-6, 300e-6)
    left = _check_steps(b, 1300)
    assert len(left) == 2 * (B.CHECK_LEN - B.CHECK_LEN // B.CHECK_PERIOD)   # two checks: steps 43-106, 1067-1130
    assert left[0] == B.FIRST + B.CHECK_FROM + 1 and left[-1] == B.FIRST + B.CHECK_FROM + B.CHECK_EVERY + B.CHECK_LEN - 1
    assert sampled == [i for i in range(1, 1301) if i not in set(left)]
    assert b.period == 1 and b.changes == []
    off = B.Budget(share=0)
    assert _feed(off, 1300, 0.100, 150e-6, 300e-6) == list(range(1, 1301))     # off: no check either


def test_a_short_step_samples_an_evenly_spread_pattern_within_the_budget():
    # 20 ms step: 200 µs budget; core 100 µs leaves 100 µs for 280 µs of extras: 1 step in 4
    b = B.Budget()
    sampled = _feed(b, 400, 0.020, 100e-6, 280e-6)
    assert sampled[:10] == list(range(1, 11))           # the first steps, always
    assert b.period == 4 and b.rate == 0.25
    late = [i for i in sampled if i > 100]
    assert late and all((i - B.FIRST) % 4 == 0 for i in late)
    assert {b - a for a, b in zip(late, late[1:])} == {4}        # evenly spread
    # the probe's average cost after the change is within the budget
    n = len([i for i in range(101, 401)])
    cost = 100e-6 + 280e-6 * len(late) / n
    assert cost <= 0.01 * 0.020 * 1.0001
    ch = b.changes[0]
    assert ch["period"] == 4 and ch["step"] == B.FIRST + B.REVIEW + 1 and ch["budget"] == 0.01
    assert "extras" in ch["reason"] and ch["extras_s"] == pytest.approx(280e-6)


def test_the_core_alone_over_the_budget_puts_the_extras_at_the_floor():
    b = B.Budget()
    sampled = _feed(b, 2000, 0.002, 150e-6, 300e-6)     # 2 ms step: 20 µs budget < 150 µs core
    assert b.period == B.FLOOR
    late = [i for i in sampled if i > 100]
    assert {b - a for a, b in zip(late, late[1:])} == {B.FLOOR}
    assert "alone" in b.changes[-1]["reason"]


def test_the_core_is_priced_with_what_its_timers_miss():
    # the 101-call CPU step of bench_depth: 1.4 ms, the probe's timers see 8 µs of core, a sampled step
    # brings 150 µs of extras. As fed (core_unseen 1), 6 µs of room: 1 in 32. Priced as the probe prices
    # it (CORE_UNSEEN, 3x: the core measured 3.3-3.7x its timers), the core alone is over the 14 µs
    # budget: the floor. Both record the figure the timers gave and the priced one.
    as_fed = B.Budget()
    _feed(as_fed, 400, 0.0014, 8e-6, 150e-6)
    assert as_fed.period == 32 and as_fed.changes[-1]["core_s"] == pytest.approx(8e-6)
    priced = B.Budget(core_unseen=B.CORE_UNSEEN)
    _feed(priced, 400, 0.0014, 8e-6, 150e-6)
    assert B.CORE_UNSEEN >= 3.0 and priced.period == B.FLOOR
    ch = priced.changes[-1]
    assert ch["core_s"] == pytest.approx(8e-6 * B.CORE_UNSEEN) and ch["core_timed_s"] == pytest.approx(8e-6)
    assert "alone" in ch["reason"] and f"{B.CORE_UNSEEN:g}x the 8 µs its timers saw" in ch["reason"]
    # a long step has room for both: the factor changes nothing there (every step sampled)
    long = B.Budget(core_unseen=B.CORE_UNSEEN)
    _feed(long, 300, 0.100, 100e-6, 300e-6)     # (300 µs of core, priced: 700 of room for 2x 300 of extras)
    assert long.period == 1 and long.changes == []
    # the probe builds its budget with the factor (from_env passes it on); a factor under 1 is 1
    assert B.Budget.from_env({}, core_unseen=B.CORE_UNSEEN).core_unseen == B.CORE_UNSEEN
    assert B.Budget(core_unseen=0.5).core_unseen == 1.0


def test_the_pattern_is_deterministic_and_reproducible():
    runs = [_feed(B.Budget(), 1000, 0.005, 30e-6, 200e-6) for _ in range(2)]
    assert runs[0] == runs[1]


def test_the_period_follows_a_change_of_step_time_without_flapping():
    b = B.Budget()
    _feed(b, 200, 0.004, 10e-6, 200e-6)                 # 40 µs budget, 30 µs room: 200/30 -> 8
    assert b.period == 8
    _feed(b, 300, 0.100, 10e-6, 200e-6)                 # the step grows: everything fits again
    assert b.period == 1
    periods = [c["period"] for c in b.changes]
    assert periods == [8, 1]
    # at a boundary (room just above extras / 4), the period stays where it is
    c = B.Budget()
    _feed(c, 200, 0.004, 10e-6, 4 * 30e-6 * 1.1)        # needs 4.4 -> 8
    assert c.period == 8
    _feed(c, 400, 0.004, 10e-6, 4 * 30e-6 * 0.95)        # needs 3.8 -> 4 fits, but not with a 25% margin
    assert c.period == 8 and len(c.changes) == 1


def test_extras_counted_a_step_late_still_count():
    # the probe may learn a sampled step's extras time only at the next step: summed over the window
    b = B.Budget()
    pending = 0.0
    for _ in range(400):
        s = b.sampled
        b.after_step(0.020, 100e-6, pending)
        pending = 280e-6 if s else 0.0
    assert b.period == 4


def test_changes_are_handed_out_once_and_state_says_where_it_stands():
    b = B.Budget()
    _feed(b, 200, 0.002, 150e-6, 300e-6)
    first = b.pop_changes()
    assert first and b.pop_changes() == []
    st = b.state()
    assert st["period"] == B.FLOOR and st["steps"] == 200 and st["budget"] == 0.01
    assert 10 < st["sampled"] < 200


def test_bad_step_times_are_ignored():
    b = B.Budget()
    for _ in range(100):
        b.after_step(float("nan"), float("inf"), -1.0)
    assert b.period == 1


def test_after_step_is_cheap():
    b = B.Budget()
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        b.after_step(0.002, 150e-6, 300e-6 if b.sampled else 0.0)
    per = (time.perf_counter() - t0) / n
    # a few appends and a modulo: far under the probe's own per-step cost (150-550 µs on a GPU step)
    assert per < 20e-6, f"{per * 1e6:.1f} µs a step"


def test_budget_imports_nothing_of_torch_or_the_probe():
    code = ("import sys, diag.probe.budget; "
            "print(sorted(m for m in sys.modules if m.startswith(('torch', 'diag.probe.core', 'diag.evidence.'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_changes_and_the_state_fold_into_the_probe_section():
    """What the probe emits (a probe_sampling event per change, the state merged at exit) is what the
    reports read."""
    from diag.evidence import Evidence
    from diag.evidence import events as E
    from diag.fold import fold

    ev = Evidence()
    b = B.Budget()
    _feed(b, 200, 0.002, 150e-6, 300e-6)
    for ch in b.pop_changes():
        fold(ev, {"kind": E.PROBE_SAMPLING, "rank": 0, "t": 1.0, **ch})
    fold(ev, {"kind": E.MERGE, "rank": 0, "t": 2.0, "path": "probe.sampling", "value": b.state()})
    s = ev.primary.probe.sampling
    assert s["period"] == B.FLOOR and s["rate"] == 1 / B.FLOOR and s["steps"] == 200 and s["budget"] == 0.01
    assert s["changes"][0]["step"] == B.FIRST + B.REVIEW + 1 and "alone" in s["changes"][0]["reason"]
    assert not ev.primary.extras.get("probe_errors")


def test_a_one_off_cost_does_not_set_the_rate():
    # step 1 spends 200 ms in the extensions (a first record, a breakdown): the rate follows the
    # typical step's extras (100 µs on a 100 ms step: everything fits), not the spike
    b = B.Budget()
    b.after_step(0.100, 100e-6, 0.200)
    sampled = _feed(b, 300, 0.100, 100e-6, 100e-6)
    assert b.period == 1 and b.changes == []
    assert len(sampled) == 300 - len(_check_steps(b, 301))     # every step but the check's (step 1 fed apart)


def test_a_short_run_is_sampled_throughout():
    # the first decision is at step FIRST + REVIEW: a test run, a --steps 20 check, loses nothing
    b = B.Budget()
    n = B.FIRST + B.REVIEW
    assert _feed(b, n, 0.002, 150e-6, 300e-6) == list(range(1, n + 1))
    assert not b.sampled and b.period == B.FLOOR      # the next one is the first left out


def _feed_clock(b: B.Budget, n: int, step_s: float, core_s: float, timed_s: float, wall_s: float,
                spill: float = 0.5, odd: dict | None = None) -> list[int]:
    """Feed n steps where sampling costs ``wall_s`` on the step clock (``1 - spill`` of it in the sampled
    step, ``spill`` in the unsampled one after it) while the probe's timers see ``timed_s``; ``odd``:
    {sampled-step index: extra wall time} for a one-off."""
    out, after = [], False
    odd = odd or {}
    for _ in range(n):
        i = b.steps + 1
        s = b.sampled
        total = step_s
        if s:
            out.append(i)
            total += (1 - spill) * wall_s + odd.get(i, 0.0)
        elif after:
            total += spill * wall_s
        after = s
        b.after_step(total, core_s, timed_s if s else 0.0)
    return out


def test_sampling_is_priced_by_what_it_costs_on_the_step_clock_when_that_is_more():
    # 2 ms step: 20 µs budget, 13 µs core leaves 7 µs; the timers see 90 µs a sampled step (period 16),
    # the step clock 170 µs (the sampled step and, spilled over, the one after it): period 32
    timed = B.Budget()
    _feed(timed, 2000, 0.002, 13e-6, 90e-6)
    assert timed.period == 16
    b = B.Budget()
    sampled = _feed_clock(b, 2000, 0.002, 13e-6, 90e-6, 170e-6)
    assert b.period == 32
    late = [i for i in sampled if i > 1000]
    assert {y - x for x, y in zip(late, late[1:])} == {32}
    ch = b.changes[-1]
    assert ch["extras_s"] == pytest.approx(170e-6, rel=0.02)
    assert "step clock" in ch["reason"] and "timers saw 90 µs" in ch["reason"]
    # where the step clock shows less than the timers (they are a lower bound), the timers' figure holds
    c = B.Budget()
    _feed_clock(c, 2000, 0.002, 13e-6, 90e-6, 30e-6)
    assert c.period == 16 and "step clock" not in c.changes[-1]["reason"]


def test_one_slow_sampled_step_does_not_set_the_measured_cost():
    # a collection in one sampled step (50 ms): the median of the last sampled steps holds
    b = B.Budget()
    _feed_clock(b, 300, 0.002, 13e-6, 90e-6, 170e-6, odd={B.FIRST + 16 * 3: 0.050})
    assert max(b._measured) > 0.049                     # it was measured ...
    assert b.period == 32                               # ... and did not set the period (that is 64)
    assert max(c["extras_s"] for c in b.changes) < 250e-6


def test_a_step_time_that_varies_does_not_read_as_a_cost_of_sampling():
    # steps of 2 ms with a long right tail (lognormal, sigma 0.3: some steps 4 ms) and no cost of
    # sampling on the clock: the measured figure stays near 0, the timers' 90 µs set the period
    import random

    rnd = random.Random(7)
    b = B.Budget()
    for _ in range(3000):
        s = b.sampled
        b.after_step(0.002 * rnd.lognormvariate(0, 0.3), 13e-6, 90e-6 if s else 0.0)
    assert b.period == 16
    assert len(b._measured) == B.MEASURED and b._measure() is None


def test_a_check_prices_sampling_on_the_step_clock_where_the_timers_say_everything_fits():
    # a 24 ms step (karpathy/makemore on the CPU): 240 µs budget, the timers see 150 µs of core and 50 µs
    # of extras (everything fits by them: period 1; priced at UNSEEN times that below 1 in 4, where the step
    # clock has nothing to measure with, 100 µs: 1 in 2), but a sampled step costs 600 µs more than an
    # unsampled one on the step clock (the full path against the lane, torch's dispatch of the hooks): the
    # first check measures it and the review at its end raises the period
    b = B.Budget()
    check_start = B.FIRST + B.CHECK_FROM + 1
    _feed_clock(b, check_start - 1, 0.024, 150e-6, 50e-6, 600e-6)
    assert b.period == 2 and [c["period"] for c in b.changes] == [2]
    assert "2x the probe's timers" in b.changes[0]["reason"]
    _feed_clock(b, B.CHECK_LEN, 0.024, 150e-6, 50e-6, 600e-6)
    assert b.period == 8                                 # 600 µs / (240 - 150) µs of room -> 8
    ch = b.changes[-1]
    # decided at a review inside the check, once MEASURED_MIN sampled steps had their unsampled pairs
    assert check_start < ch["step"] <= check_start + B.CHECK_LEN and (ch["step"] - 1 - B.FIRST) % B.REVIEW == 0
    assert ch["extras_s"] == pytest.approx(600e-6, rel=0.02)
    assert "step clock" in ch["reason"] and "timers saw 50 µs" in ch["reason"]
    sampled = _feed_clock(b, 1000, 0.024, 150e-6, 50e-6, 600e-6)
    assert b.period == 8 and {y - x for x, y in zip(sampled, sampled[1:])} == {8}   # no more checks: p >= 4
    # the same run where the step clock agrees with the timers: once the check has its figure, the timers'
    # 50 µs stand (no UNSEEN factor) and every step is sampled again
    c = B.Budget()
    _feed_clock(c, 1100, 0.024, 150e-6, 50e-6, 50e-6)
    assert c.period == 1 and [x["period"] for x in c.changes] == [2, 1]
    # (at the second review in a row that finds it fits: a shorter period waits for DOWN_REVIEWS)
    assert check_start < c.changes[1]["step"] <= check_start + B.CHECK_LEN + B.DOWN_REVIEWS * B.REVIEW
    assert "fit in" in c.changes[1]["reason"]


def test_a_check_on_a_varying_step_time_leaves_the_timers_in_charge():
    # 24 ms steps that vary by 5% and sampling that costs nothing on the clock: the check's figure is not
    # clear of the noise, the timers' 50 µs stay in charge, priced at UNSEEN below 1 in 4 (100 µs against
    # 90 µs of room: 1 in 2), from the first decision on; no false cost beyond that, no flapping
    import random

    for seed in range(5):
        rnd = random.Random(seed)
        b = B.Budget()
        for _ in range(1200):
            s = b.sampled
            b.after_step(0.024 * rnd.lognormvariate(0, 0.05), 150e-6, 50e-6 if s else 0.0)
        assert b.period == 2 and [c["period"] for c in b.changes] == [2], seed


def test_below_1_in_4_the_timers_are_priced_with_what_they_miss(monkeypatch):
    # 1% of a 30 ms step less a 50 µs core: 250 µs of room; the timers see 200 µs a sampled step. At 1 or
    # 2 no unsampled pairs are left for the step clock, and the timers see the probe's code only (2x low
    # on bench_depth's 801-call step): priced at UNSEEN times theirs there, 1 step in 2, not every step
    b = B.Budget()
    _feed(b, 300, 0.030, 50e-6, 200e-6)
    assert b.period == 2 and [c["period"] for c in b.changes] == [2]
    # with a clear figure on the step clock that agrees, the timers stand: every step sampled
    c = B.Budget()
    c._measure = lambda: 200e-6
    _feed(c, 300, 0.030, 50e-6, 200e-6)
    assert c.period == 1 and c.changes == []
    # from 1 in 4 on, the step clock can measure: the timers' figure is not multiplied (900 µs: 1 in 4)
    d = B.Budget()
    _feed(d, 300, 0.030, 50e-6, 900e-6)
    assert d.period == 4
    monkeypatch.setattr(B, "UNSEEN", 1.0)     # without the rule: every step sampled on the timers' word
    e = B.Budget()
    _feed(e, 300, 0.030, 50e-6, 200e-6)
    assert e.period == 1 and e.changes == []


def test_quiet_until_stops_before_a_checks_sampled_step():
    # the lane feeds the steps before the next decision together: in a check, that is the next sampled one
    b = B.Budget()
    _feed(b, B.FIRST + B.CHECK_FROM + 1, 0.100, 150e-6, 300e-6)     # step 43 fed: unsampled, in the check
    nxt = b.steps + 1
    q = b.quiet_until()
    assert q >= b.steps and b.is_sampled(q + 2) and all(not b.is_sampled(i) for i in range(nxt, q + 2))


def test_every_step_sampled_again_only_with_the_margin(monkeypatch):
    # 1% of a 30 ms step is 300 µs; core 150 µs leaves 150 µs of room; a sampled step's extras 160 µs
    # (period 2), then 140 µs: 1 fits, but not with the 25% margin: the period stays 2 (it used to go
    # 2, 1, 2, 1 on the 801-call CPU step, whose extras sat at the boundary); the margin alone (the
    # UNSEEN factor below 1 in 4 has its own test)
    monkeypatch.setattr(B, "UNSEEN", 1.0)
    b = B.Budget()
    _feed(b, 200, 0.030, 150e-6, 160e-6)
    assert b.period == 2
    _feed(b, 400, 0.030, 150e-6, 140e-6)
    assert b.period == 2 and [c["period"] for c in b.changes] == [2]
    _feed(b, 200, 0.030, 150e-6, 100e-6)                 # 125 µs with the margin: fits, every step again
    assert b.period == 1 and "fit in" in b.changes[-1]["reason"]


def test_a_figure_that_varies_from_review_to_review_does_not_flap_the_period(monkeypatch):
    # 1% of a 30 ms step less a 50 µs core: 250 µs of room. The timers see 300 µs a sampled step (1 in 2
    # fits with the margin); the step clock's figure is clear at one review (900 µs: 1 in 4) and not at
    # the next (the timers again). The period goes to 4 and stays: a shorter one must fit at two reviews
    # in a row (the UNSEEN factor below 1 in 4 has its own test)
    monkeypatch.setattr(B, "UNSEEN", 1.0)
    b = B.Budget()
    reviews = []

    def measure():
        reviews.append(len(reviews))
        return 900e-6 if len(reviews) % 2 else None

    b._measure = measure
    _feed(b, 1200, 0.030, 50e-6, 300e-6)
    assert len(reviews) > 50
    assert [c["period"] for c in b.changes] == [4]
    # the timers' figure at two reviews in a row: the period goes down
    b._measure = lambda: None
    _feed(b, 3 * B.REVIEW, 0.030, 50e-6, 300e-6)
    assert b.period == 2 and [c["period"] for c in b.changes] == [4, 2]


def test_a_period_that_cost_more_when_the_run_was_there_is_not_taken_again_soon(monkeypatch):
    # a sampled step costs more when sampled steps are closer (the 801-call CPU step: ~560 µs at 1 in 2,
    # ~380 at 1 in 4; 250 µs of room): from 4, 1 in 2 looks as if it fits (380 x 1.25 / 2 < 250); once
    # there it does not. Priced with what it cost the last time, it is not tried again within SEEN_FOR
    # (the memory alone: the UNSEEN factor below 1 in 4 has its own test)
    monkeypatch.setattr(B, "UNSEEN", 1.0)
    b = B.Budget()
    for _ in range(1500):
        s = b.sampled
        x = {1: 600e-6, 2: 560e-6}.get(b.period, 380e-6)
        b.after_step(0.030, 50e-6, x if s else 0.0)
    periods = [c["period"] for c in b.changes]
    # the first try, then one more each time the figure at 1 in 2 is older than SEEN_FOR (512) steps:
    # three in 1,500 steps (without the memory: fifteen, every 96 steps)
    assert b.period == 4 and periods.count(2) == 3, periods


def test_quiet_until_agrees_with_the_pattern_at_every_period():
    # the steps it hands out need no decision: none is a review, and none is followed by a sampled step
    for period in (1, 2, 4, 16, 64):
        b = B.Budget()
        b.period = period
        for steps in range(0, 1200, 7):
            b.steps = steps
            q = b.quiet_until()
            for i in range(steps + 1, q + 1):
                assert not b.is_review(i), (period, steps, i)
                assert not b.is_sampled(i + 1), (period, steps, i)
            nxt = q + 1      # the step after them decides: a review, or one followed by a sampled step
            assert b.is_review(nxt) or b.is_sampled(nxt + 1), (period, steps)


def test_at_the_floor_reviews_come_every_256_steps_half_way_between_sampled_steps():
    # at 1 in 64 (the core alone over the budget) a review can only decide more sampling: every
    # REVIEW_FLOOR steps, on review steps of the floor's own cycle (32 past a sampled step)
    b = B.Budget()
    b.period = B.FLOOR
    reviews = [i for i in range(B.FIRST + 1, B.FIRST + 2000) if b.is_review(i)]
    assert {y - x for x, y in zip(reviews, reviews[1:])} == {B.REVIEW_FLOOR}
    assert all((i - B.FIRST) % B.FLOOR == B.FLOOR // 2 for i in reviews)
    # they are review steps of the floor's own cycle (1 in 64, every 64 steps) and of every 16
    c = B.Budget(floor=128)  # (a budget whose floor is further: 64 is an ordinary period there)
    c.period = B.FLOOR
    reviews64 = [i for i in range(B.FIRST + 1, B.FIRST + 2000) if c.is_review(i)]
    assert {y - x for x, y in zip(reviews64, reviews64[1:])} == {64}
    c.period = 16
    reviews16 = [i for i in range(B.FIRST + 1, B.FIRST + 2000) if c.is_review(i)]
    assert set(reviews) <= set(reviews64) <= set(reviews16)
