"""Issue 20: the probe's own cost, from Evidence (diag/probe_cost.py, torch-free)."""
from __future__ import annotations

from diag import probe_cost


def _step(probe_s, total_s, instrumented=False):
    return {"probe_s": probe_s, "total_s": total_s, "instrumented": instrumented}


def test_the_share_is_the_median_over_timed_steps_and_leaves_out_instrumented_ones():
    steps = [_step(10e-6, 2e-3), _step(12e-6, 3e-3), _step(8e-6, 2e-3), _step(0.5, 1.0, instrumented=True),
             {"total_s": 2e-3}]     # an old event without probe_s
    s = probe_cost.summarize(steps, {"by_part": {"hooks": 1e-3, "sink": 5e-4}, "windows": 2})
    assert s["steps"] == 3
    assert abs(s["median_step_share"] - 0.004) < 1e-12    # shares 0.005, 0.004, 0.004
    assert s["median_probe_s"] == 10e-6 and s["median_step_s"] == 2e-3
    assert s["by_part"]["hooks"] == 1e-3 and s["windows"] == 2
    assert probe_cost.headline(s) == "diag's probe took 0.4% of the median step (10 µs of 2.0 ms)"


def test_no_timed_step_means_no_figure():
    assert probe_cost.summarize([{"total_s": 1.0}]) is None
    assert probe_cost.summarize([_step(1e-6, 1e-3, instrumented=True)]) is None
    assert probe_cost.headline(None) is None


def test_the_advice_names_the_extension_and_its_switch():
    s = {"by_part": {"hooks": 1e-4, "sink": 1e-4, "PerfProbe": 9e-4, "FlopCounter": 0.0}}
    msg = probe_cost.lighten(s)
    assert "PerfProbe" in msg and "DIAG_PROBE_DISABLE=perfprobe" in msg
    s = {"by_part": {"hooks": 9e-3, "sink": 1e-4}, "window_reasons": {"loader": 30, "install": 1}}
    assert '"loader"' in probe_cost.lighten(s)
    assert "writing events" in probe_cost.lighten({"by_part": {"sink": 1.0}})
