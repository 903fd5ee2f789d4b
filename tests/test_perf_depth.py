"""Issue 20: the depth benchmark (bench/bench_depth.py) runs in its quick mode and measures both sides,
the probe with the hand-over and with global hooks throughout, and the probe really ran in its blocks.
The hand-over's behaviour itself is tested on the real probe in tests/test_handover.py."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

torch = pytest.importorskip("torch")

import bench_depth  # noqa: E402


def test_depth_bench_quick_mode_measures_both_sides_and_the_probe_really_ran():
    raw = bench_depth.measure("10,100", "bare,probe,probe-global", rounds=2, steps=4, warmup=2, timeout=600)
    res = bench_depth.summarise(raw)
    assert set(res) == {"10", "100"}
    assert res["10"]["module_calls"] == 11 and res["100"]["module_calls"] == 101
    for row in res.values():
        assert row["bare_step_median_ms"] > 0
        for side in ("probe", "probe-global"):
            r = row[side]
            assert r["step_median_ms"] > 0 and r["pairs"] == 2
            lo, hi = r["overhead_iqr_pct"]
            assert lo <= hi
            assert "us_per_module_call" in r and "wall" in r
            # 2 blocks of 6 steps under the probe: its own step events prove it was installed
            assert r["steps_recorded"] >= 8
            assert r["self_reported_us"] > 0
