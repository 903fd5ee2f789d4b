"""Pure planning logic: the bisection, gradient accumulation, allowances, the plan record, sizes."""
from __future__ import annotations

import math
import random

import pytest

from diag.errors import DiagError
from diag.memory import plan as P
from diag.memory.units import fmt_bytes, parse_size

MiB, GiB = 1 << 20, 1 << 30


class Counter:
    def __init__(self, limit: int):
        self.limit = limit
        self.calls: list[int] = []

    def __call__(self, b: int) -> bool:
        self.calls.append(b)
        return b <= self.limit


@pytest.mark.parametrize("limit,start", [(1, 1), (1, 64), (7, 1), (100, 32), (1000, 32), (12345, 7),
                                         (31, 32), (32, 32), (33, 32), (5000, 100000)])
def test_largest_fitting_finds_the_exact_limit_by_bisection(limit, start):
    f = Counter(limit)
    res = P.largest_fitting(f, start)
    assert res["max"] == limit
    assert res["first_fail"] == limit + 1
    # doubling/halving plus bisection: O(log) trials, never a scan
    bound = 2 * math.ceil(math.log2(max(limit, start) + 1)) + 2
    assert len(f.calls) <= bound, (f.calls, bound)
    assert len(set(f.calls)) == len(f.calls)          # no batch tried twice


def test_largest_fitting_random_thresholds_are_logarithmic():
    rnd = random.Random(0)
    for _ in range(200):
        limit = rnd.randint(1, 200000)
        start = rnd.randint(1, 5000)
        f = Counter(limit)
        res = P.largest_fitting(f, start)
        assert res["max"] == limit
        assert len(f.calls) <= 2 * math.ceil(math.log2(max(limit, start) + 1)) + 2


def test_largest_fitting_nothing_fits_and_everything_fits():
    f = Counter(0)
    res = P.largest_fitting(f, 16)
    assert res["max"] == 0 and res["first_fail"] == 1
    f = Counter(10 ** 9)
    res = P.largest_fitting(f, 16, limit=4096)
    assert res["max"] == 4096 and res["first_fail"] is None


def test_largest_fitting_stops_at_the_budget():
    f = Counter(10 ** 6)
    res = P.largest_fitting(f, 1, should_stop=lambda: len(f.calls) >= 3)
    assert not res["complete"] and res["max"] >= 1


@pytest.mark.parametrize("target,max_micro,micro,steps,exact", [
    (256, 100, 64, 4, True),      # 3 steps would need 86: not a divisor; 4 x 64 is exact
    (256, 256, 256, 1, True),
    (256, 300, 256, 1, True),
    (97, 40, 33, 3, False),       # a prime: 3 steps of 33, 33, 31
    (1000, 1, 1, 1000, True),
    (12, 5, 4, 3, True),
])
def test_accumulation_plan(target, max_micro, micro, steps, exact):
    plan = P.accumulation_plan(target, max_micro)
    assert plan["micro_batch"] == micro and plan["steps"] == steps and plan["exact"] is exact
    assert plan["micro_batch"] <= max_micro
    assert plan["effective_batch"] == target
    if exact:
        assert plan["micro_batch"] * plan["steps"] == target
    else:
        assert plan["micro_batch"] * (plan["steps"] - 1) + plan["last_micro_batch"] == target
    snippet = P.accumulation_snippet(plan)
    assert f"accum_steps = {steps}" in snippet and f"batch_size={micro}" in snippet
    assert "/ accum_steps" in snippet


def test_accumulation_plan_impossible():
    assert P.accumulation_plan(64, 0) is None


def test_allowances_follow_the_documented_figures():
    point = {"mode": "train", "peak": 10 * GiB}
    a = P.allowances(point, {"matmul": True, "conv": True, "ddp_grad_bytes": GiB}, capability=[8, 0])
    assert a["cublas_workspace"] == 2 * (4096 * 1024 * 2 + 16 * 1024 * 8)
    assert a["cudnn_workspace"] == 128 * MiB
    assert a["ddp_buckets"] == GiB
    assert a["cuda_context"] == 512 * MiB
    alloc = 10 * GiB + a["cublas_workspace"] + a["cudnn_workspace"] + GiB
    assert a["allocator_cache"] == int(alloc * 0.05)
    hopper = P.allowances(point, {"matmul": True}, capability=[9, 0])
    assert hopper["cublas_workspace"] == 2 * 32 * MiB
    unknown = P.allowances(point, {"matmul": True}, capability=None)
    assert unknown["cublas_workspace"] == 2 * 32 * MiB         # conservative when the GPU is unknown
    ev = P.allowances({"mode": "eval", "peak": GiB}, {"matmul": True, "ddp_grad_bytes": GiB}, capability=[8, 0])
    assert "ddp_buckets" not in ev and ev["cublas_workspace"] == 4096 * 1024 * 2 + 16 * 1024 * 8
    fig = P.device_figures(point, {"matmul": False}, None)
    assert fig["allocated"] == 10 * GiB
    assert fig["device"] == 10 * GiB + int(10 * GiB * 0.05) + 512 * MiB


def affine_replay(fixed: int, per_sample: int):
    calls = []

    def train(b, a=1):
        calls.append((b, a))
        extra = fixed // 4 if a > 1 else 0            # accumulation keeps gradients through the forward
        peak = fixed + extra + per_sample * b
        return {"mode": "train", "batch": b, "accumulation": a, "peak": peak,
                "categories": {"parameters": fixed // 4, "gradients": fixed // 4, "optimizer_state": fixed // 2,
                               "activations": per_sample * b, "other": extra},
                "peak_phase": "backward", "phase_peaks": {}, "seconds": 0.0}

    def evaluate(b):
        calls.append((b, "eval"))
        peak = fixed * 3 // 4 + per_sample * b // 8
        return {"mode": "eval", "batch": b, "accumulation": 1, "peak": peak,
                "categories": {"parameters": fixed // 4, "gradients": 0, "optimizer_state": fixed // 2,
                               "activations": per_sample * b // 8, "other": 0},
                "peak_phase": "eval", "phase_peaks": {}, "seconds": 0.0}

    return train, evaluate, calls


def test_make_plan_when_the_batch_fits():
    train, evaluate, calls = affine_replay(4 * GiB, 50 * MiB)
    plan = P.make_plan(train, evaluate, observed_batch=32, capacity=80 * GiB, facts={"matmul": True})
    usable = int(80 * GiB * 0.9)
    # brute force with the same rule: the device figure (replay peak + allowances) within 90%
    best = max(b for b in range(1, 5000) if P.device_figures(train(b), {"matmul": True})["device"] <= usable)
    assert plan["status"] == "ok" and plan["at_target"]["fits"] is True
    assert plan["max_batch"] == best
    assert plan["accumulation"] is None
    assert plan["eval"]["max_batch"] > plan["max_batch"]
    assert plan["monotonic"] is True
    assert plan["search"]["trials"] <= 2 * math.ceil(math.log2(best)) + 2
    batches = [p["batch"] for p in plan["points"]]
    assert batches == sorted(batches) and 32 in batches and best in batches and best + 1 in batches
    assert set(plan["table"]) <= set(batches) and len(plan["table"]) <= P.MAX_TABLE_ROWS + 3


def test_make_plan_when_the_batch_does_not_fit_gives_accumulation():
    train, evaluate, _ = affine_replay(2 * GiB, 200 * MiB)
    plan = P.make_plan(train, evaluate, observed_batch=8, target_batch=512, capacity=24 * GiB,
                       facts={"matmul": True}, capability=[8, 9])
    assert plan["at_target"]["fits"] is False
    mb = plan["max_batch"]
    assert 0 < mb < 512
    acc = plan["accumulation"]
    assert acc["effective_batch"] == 512
    assert acc["micro_batch"] <= acc["max_micro_batch"] <= mb
    assert acc["at_micro"]["fits"] is True and acc["at_micro"]["accumulation"] == 2
    assert "accum_steps" in acc["snippet"]


def test_make_plan_nothing_fits():
    train, evaluate, _ = affine_replay(30 * GiB, 10 * MiB)
    plan = P.make_plan(train, evaluate, observed_batch=8, capacity=24 * GiB)
    assert plan["max_batch"] == 0 and plan["accumulation"] is None
    assert any("not even one sample" in n for n in plan["notes"])


def test_make_plan_without_capacity_makes_only_the_table():
    train, evaluate, calls = affine_replay(GiB, MiB)
    plan = P.make_plan(train, evaluate, observed_batch=16, capacity=None)
    assert plan["max_batch"] is None and plan["usable"] is None
    assert "fits" not in plan["at_target"]
    assert len(plan["points"]) >= 3


def test_make_plan_counts_a_failing_batch_as_not_fitting():
    train, evaluate, _ = affine_replay(GiB, MiB)

    def picky(b, a=1):
        if b == 1:
            raise ValueError("Expected more than 1 value per channel when training")
        return train(b, a)

    plan = P.make_plan(picky, evaluate, observed_batch=16, capacity=GiB // 2)
    assert plan["max_batch"] == 0
    assert any("failed" in n for n in plan["notes"])


@pytest.mark.parametrize("text,expected", [("24GiB", 24 * GiB), ("80GB", 80 * 10 ** 9), ("512MiB", 512 * MiB),
                                           ("1.5 GiB", int(1.5 * GiB)), ("16g", 16 * GiB), ("1000", 1000)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "24 parsecs", "-1GiB", "0GiB"])
def test_parse_size_rejects(text):
    with pytest.raises(DiagError):
        parse_size(text)


def test_fmt_bytes():
    assert fmt_bytes(None) == "N/A"
    assert fmt_bytes(3 * GiB // 2) == "1.50 GiB"
    assert fmt_bytes(300 * MiB) == "300 MiB"
    assert fmt_bytes(-2 * GiB) == "-2.00 GiB"


def test_largest_fitting_with_a_guess_and_a_precision():
    rnd = random.Random(1)
    for _ in range(100):
        limit = rnd.randint(50, 100000)
        # a guess within 5% needs only a handful of trials
        f = Counter(limit)
        g = int(limit * rnd.uniform(0.96, 1.04))
        res = P.largest_fitting(f, 16, guess=g, precision=1 / 64)
        assert res["max"] <= limit <= res["max"] * (1 + 1 / 64) + 1
        assert len(f.calls) <= 10, (limit, g, f.calls)
        # a wild guess still converges (doubling/halving from the guess, then bisection)
        f = Counter(limit)
        res = P.largest_fitting(f, 16, guess=rnd.randint(1, 10 ** 6))
        assert res["max"] == limit


def test_predict_batch_is_linear():
    pts = [{"batch": 10, "device": 1000}, {"batch": 20, "device": 2000}]
    assert P.predict_batch(pts, 5000) == 50
    assert P.predict_batch(pts[:1], 5000) is None
    assert P.predict_batch([{"batch": 1, "device": 10}, {"batch": 2, "device": 10}], 50) is None


def test_plan_search_uses_few_replays():
    train, evaluate, calls = affine_replay(4 * GiB, 50 * MiB)
    plan = P.make_plan(train, evaluate, observed_batch=32, capacity=80 * GiB, facts={"matmul": True},
                       table=False)
    assert plan["search"]["trials"] <= 6 and plan["eval"]["search"]["trials"] <= 6
    assert plan["replays"] <= 12


# ---- issue 30: the text of the plan -------------------------------------------------------------------

def _rendered(fixed: int, per_sample: int, capacity: int, precision: float = P.SEARCH_PRECISION) -> str:
    import io

    from rich.console import Console

    from diag.evidence import Evidence, RankEvidence
    from diag.memory.verdict import build_memory_plan
    from diag.report.memory import render_plan

    train, evaluate, _ = affine_replay(fixed, per_sample)
    est = P.make_plan(train, evaluate, observed_batch=32, capacity=capacity, facts={"matmul": True},
                      precision=precision)
    ev = Evidence(ranks=[RankEvidence(rank=0, world_size=1)])
    ev.primary.memory = {"estimate": est}
    ev.primary.step_stats.count = 1
    plan = build_memory_plan(ev, {"name": "Test GPU", "memory": capacity, "source": "given"})
    c = Console(file=io.StringIO(), width=160, color_system=None, record=True)
    render_plan(plan, c)
    return c.export_text()


def test_plan_text_states_the_precision_the_search_reached():
    """'54,509 fits, 54,510 does not' is exact: the text never says 'within 1.6%' beside it."""
    exact = _rendered(4 * GiB, 50 * MiB, 80 * GiB, precision=0.0)
    line = next(ln for ln in exact.splitlines() if "largest training batch that fits" in ln)
    mb = int(line.split("fits: ")[1].split()[0].replace(",", ""))
    assert f"{mb + 1:,} does not fit" in line and "within" not in line and "lower bound" not in line
    coarse = _rendered(4 * GiB, 5 * MiB, 80 * GiB)
    line = next(ln for ln in coarse.splitlines() if "largest training batch that fits" in ln)
    assert "does not fit" in line and "within 1.6%" not in line


def test_plan_table_has_no_zero_gib_cells_for_a_small_model():
    """A 1.5 MiB model with large activations: its parameters in MiB, not 0.00 of a GiB column."""
    text = _rendered(6 * MiB, 40 * MiB, 80 * GiB)
    table = text[text.index("estimated peak per training step"):]
    assert " 0.00" not in table and "MiB" in table and "GiB" in table
