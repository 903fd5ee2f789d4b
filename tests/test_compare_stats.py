"""diag.compare.stats on synthetic distributions with known answers."""
import numpy as np
import pytest

from diag.compare.stats import block_resample, compare, verdict


def _rng(seed=1):
    return np.random.default_rng(seed)


def test_equal_distributions_contain_no_change():
    r = _rng()
    a = r.normal(0.020, 0.001, 200)
    b = r.normal(0.020, 0.001, 200)
    e = compare(a, b)
    assert e.low < 1.0 < e.high
    assert not e.significant
    assert verdict(e, 0.05) == "unchanged"
    assert abs(e.change) < 0.02


def test_shift_of_25_percent_is_found_and_bounded():
    r = _rng(2)
    a = r.normal(0.020, 0.001, 100)
    b = r.normal(0.025, 0.00125, 100)
    e = compare(a, b)
    assert e.low < 1.25 < e.high
    assert e.low > 1.05
    assert verdict(e, 0.05) == "regression"
    # higher is better (throughput): the same numbers read as an improvement
    assert verdict(e, 0.05, higher_is_better=True) == "improved"


def test_small_shift_below_threshold_is_worse_but_not_a_regression():
    r = _rng(3)
    a = r.normal(0.020, 0.0002, 400)
    b = r.normal(0.0206, 0.0002, 400)      # +3%, very precise
    e = compare(a, b)
    assert e.significant and e.low > 1.0
    assert verdict(e, 0.05) == "worse"


def test_heavy_tails_do_not_make_a_difference():
    r = _rng(4)
    def side():
        x = r.normal(0.020, 0.0005, 150)
        spikes = r.random(150) < 0.08
        x[spikes] *= r.pareto(1.5, spikes.sum()) + 3      # rare 3x-100x stalls
        return x
    e = compare(side(), side())
    assert e.low < 1.0 < e.high
    assert verdict(e, 0.05) == "unchanged"


def test_few_steps_give_a_wide_interval_and_no_false_regression():
    r = _rng(5)
    a = r.normal(0.020, 0.002, 4)
    b = r.normal(0.020, 0.002, 4)
    e = compare(a, b)
    assert e.notes and "few steps" in e.notes[0]
    assert e.high - e.low > 0.02
    assert verdict(e, 0.05) != "regression"
    assert compare([0.1, 0.2], [0.1, 0.2, 0.3]) is None
    assert verdict(None, 0.05) == "unknown"


def test_false_positive_rate_on_equal_distributions_is_near_nominal():
    """95% intervals on identical distributions exclude 'no change' in about 5% of the pairs."""
    r = _rng(6)
    hits = 0
    trials = 200
    for i in range(trials):
        e = compare(r.lognormal(-4, 0.2, 60), r.lognormal(-4, 0.2, 60), resamples=500, seed=i)
        hits += e.significant
    assert hits / trials < 0.12


def test_repeats_bring_run_to_run_variation_in():
    """Each run has its own offset (machine load): with one run per side a 4% offset looks
    significant; with five runs per side the run-to-run spread widens the interval."""
    r = _rng(7)
    offsets_a = [1.00, 1.04, 0.97, 1.02, 0.99]
    offsets_b = [1.03, 0.98, 1.01, 0.96, 1.04]
    a = [r.normal(0.02 * o, 0.0002, 80) for o in offsets_a]
    b = [r.normal(0.02 * o, 0.0002, 80) for o in offsets_b]
    single = compare(a[1], b[3])
    assert single.significant                        # a 8% gap between two single runs
    many = compare(a, b)
    assert many.runs_a == 5 and many.run_spread_a > 0.01
    assert not many.significant
    assert verdict(many, 0.05) == "unchanged"


def test_difference_kind_and_determinism():
    r = _rng(8)
    a = r.normal(0.10, 0.01, 50)
    b = r.normal(0.30, 0.01, 50)
    e1 = compare(a, b, kind="diff", seed=3)
    e2 = compare(a, b, kind="diff", seed=3)
    assert (e1.low, e1.high) == (e2.low, e2.high)
    assert e1.low < 0.2 < e1.high
    with pytest.raises(ValueError):
        compare(a, b, kind="odd")


def test_block_resample_keeps_neighbours_together():
    v = np.arange(27, dtype=float)
    out = block_resample(v, 50, np.random.default_rng(0))
    assert out.shape == (50, 27)
    diffs = np.diff(out, axis=1)
    assert (diffs == 1).mean() > 0.6                 # blocks of 3 consecutive steps
