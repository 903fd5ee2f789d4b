"""One definition of the phases and one steady-steps rule (diag/evidence/phases.py, issue 28): every
reader takes its phases and its warm-up from there, and the rule drops instrumented steps, the warm-up
(the first step, and slow steps among the first 10% of the run, 20 at most, 3 kept) and, where asked,
the steps the probe did not sample."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from diag.evidence import EvalStepRecord, Evidence, RankEvidence, StepRecord
from diag.evidence import phases as ph
from diag.fold import fold


ROOT = Path(__file__).resolve().parents[1]


def _steps(n, instrumented=(), unsampled=(), start=1, slow=(), step_s=0.01):
    return [StepRecord(index=i, total_s=(10 * step_s if i in slow else step_s) * (1 + 0.01 * (i % 3)),
                       instrumented=i in instrumented, sampled=i not in unsampled)
            for i in range(start, start + n)]


def test_warmup_is_at_most_a_tenth_of_the_run_between_1_and_20_keeping_3():
    assert [ph.warmup_count(n) for n in (0, 1, 3, 4, 5, 10, 11, 40, 200, 201, 5000)] == \
        [0, 0, 0, 1, 1, 1, 2, 4, 20, 20, 20]


def test_the_first_step_is_warmup_and_later_ones_only_while_slow():
    steps = _steps(40, slow={1})
    assert [s.index for s in ph.steady_steps(steps)] == list(range(2, 41))
    # a compiled run: compile in step 1, a recompile in step 3 (step 2 at speed): both out
    steps = _steps(40, slow={1, 3})
    steady = ph.steady_steps(steps)
    assert [s.index for s in steady][:2] == [4, 5] and ph.warmup_dropped(steps, steady) == 3
    # but never more than 10% of the run: a slow step 30 is not warm-up
    steps = _steps(40, slow={1, 30})
    assert len(ph.steady_steps(steps)) == 39


def test_instrumented_steps_go_and_the_warmup_counts_timed_steps():
    steps = _steps(40, instrumented={2}, slow={1, 5})
    steady = ph.steady_steps(steps)
    # 39 timed steps, at most 4 of warm-up: step 5 is the 4th timed step, slow: 1, 3, 4, 5 go
    assert [s.index for s in steady][:2] == [6, 7] and len(steady) == 35


def test_a_trimmed_step_list_has_no_warmup_left():
    # a long run's evidence keeps its newest steps: their first ones are not the run's warm-up
    steps = _steps(50, start=3001, slow={3001})
    assert ph.steady_steps(steps) == steps


def test_short_runs_keep_three_steps_and_hand_made_indices_count_by_position():
    assert [s.index for s in ph.steady_steps(_steps(3))] == [1, 2, 3]
    assert [s.index for s in ph.steady_steps(_steps(4))] == [2, 3, 4]
    same = [StepRecord(index=0, total_s=1.0) for _ in range(12)]        # indices made by hand
    assert len(ph.steady_steps(same)) == 11


def test_an_explicit_warmup_keeps_the_old_meaning():
    steps = _steps(40, slow={1, 3})
    assert [s.index for s in ph.steady_steps(steps, warmup=1)][0] == 2
    assert ph.steady_steps(steps, warmup=0) == steps
    assert ph.steady_steps(_steps(3), warmup=1) == _steps(3)           # all or nothing: 3 must remain


def test_unsampled_steps_go_only_where_asked_and_after_the_warmup_is_counted():
    steps = _steps(40, unsampled={i for i in range(11, 41) if i % 8})
    all_steady = ph.steady_steps(steps)
    sampled = ph.steady_steps(steps, sampled=True)
    assert len(all_steady) == 39                       # timing figures: every step
    assert [s.index for s in sampled] == [2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 24, 32, 40]
    assert ph.is_sampled({"index": 3}) and not ph.is_sampled({"sampled": False})


def test_rank_evidence_readers_use_the_rule_and_keep_their_signatures():
    r = RankEvidence()
    r.steps = _steps(40, instrumented={2}, slow={1, 3})
    assert [s.index for s in r.timed_steps()] == [s.index for s in ph.steady_steps(r.steps)]
    assert r.timed_steps()[0].index == 4
    assert r.timed_steps(skip_warmup=1)[0].index == 3                  # the check API's old call
    med = r.median_step()
    assert med is not None and med["n"] == 37 and set(ph.STEP_FIELDS) <= set(med)
    r.eval_steps = [EvalStepRecord(index=i, total_s=1.0 if i == 1 else 0.1, forward_s=0.05) for i in range(1, 31)]
    r.eval_stats.count = r.eval_stats.timed = 30
    r.eval_stats.total_s = sum(s.total_s for s in r.eval_steps)
    tp = r.eval_throughput()
    assert tp is not None and tp["median_step_s"] == 0.1 and set(tp["phases"]) == set(ph.EVAL_FIELDS)


def test_step_events_carry_sampled_and_the_sampling_event_folds_into_the_probe_section():
    from diag.evidence import events as E
    from diag.evidence.probe import sampling_line

    ev = Evidence()
    for i in range(1, 41):
        data = {"kind": E.STEP, "rank": 0, "t": float(i), "index": i, "total_s": 0.01}
        if i > 10 and (i - 10) % 8:
            data["sampled"] = False
        fold(ev, data)
    fold(ev, {"kind": E.PROBE_SAMPLING, "rank": 0, "t": 11.0, "step": 11, "period": 8, "budget": 0.01,
              "first": 10, "step_s": 0.01, "core_s": 2e-4, "extras_s": 3e-4, "reason": "r"})
    r = ev.primary
    assert sum(s.sampled for s in r.steps) == 13 and r.steps[0].sampled
    assert r.probe.sampling["period"] == 8 and r.probe.sampling["rate"] == 0.125
    assert r.probe.sampling["changes"][0]["step"] == 11
    line = sampling_line(r)
    assert line is not None and "1 step in 8" in line and "13 of 40" in line and "1% of the step" in line
    # a bad event is a probe error, not a crash
    fold(ev, {"kind": E.PROBE_SAMPLING, "rank": 0, "period": "x"})
    assert r.extras["probe_errors"] and r.probe.sampling["period"] == 8
    # every step sampled (older evidence): nothing to say
    r2 = RankEvidence()
    r2.steps = _steps(20)
    assert sampling_line(r2) is None
    # period 1, but the budget's check left a few steps out: a share, not "1 step in 1"
    ev3 = Evidence()
    for i in range(1, 201):
        data = {"kind": E.STEP, "rank": 0, "t": float(i), "index": i, "total_s": 0.01}
        if 42 < i <= 106 and (i - 10) % 4:
            data["sampled"] = False
        fold(ev3, data)
    line = sampling_line(ev3.primary)
    assert line is not None and "1 step in" not in line and "76% of the steps (152 of 200 steps" in line
    assert "its checks of what sampling costs on the step clock" in line


def _literal_tuples(path: Path) -> list[str]:
    """Tuples of phase field names spelled in a module (the readers import them instead)."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Tuple):
            names = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if sum(n in ("data_s", "forward_s", "backward_s", "optimizer_s") for n in names) >= 3 \
                    or sum(n in ("data", "forward", "backward", "optimizer") for n in names) >= 4:
                hits.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return hits


def test_readers_do_not_spell_the_phases_again():
    readers = ["diag/tui/models/steps.py", "diag/report/html.py", "diag/compare/extract.py", "diag/attach/phases.py",
               "diag/evidence/rank.py", "diag/timeline.py"]
    hits = [h for p in readers for h in _literal_tuples(ROOT / p)]
    assert not hits, "phase tuples spelled outside diag/evidence/phases.py:\n" + "\n".join(hits)


def test_the_probes_own_cost_under_sampling_is_what_the_run_paid_per_step():
    """An unsampled step is the typical one; the sampled steps' extras are spread over every step (the
    median alone would hide them, the mean would be the sampled steps' outliers too)."""
    from diag.evidence.probe import summarize

    steps = []
    for i in range(1, 201):
        sampled = i <= 10 or (i - 10) % 8 == 0
        steps.append(StepRecord(index=i, total_s=0.010, probe_s=3e-4 if sampled else 1e-4, sampled=sampled))
    s = summarize(steps)
    frac = sum(1 for x in steps[5:] if x.sampled) / 195
    assert s["sampled_share"] == pytest.approx(frac)
    assert s["median_probe_s"] == pytest.approx(1e-4 + frac * 2e-4)
    assert s["median_step_share"] == pytest.approx((1e-4 + frac * 2e-4) / 0.010)
    # every step sampled (older evidence): the plain medians, as before
    full = summarize([StepRecord(index=i, total_s=0.010, probe_s=3e-4) for i in range(1, 50)])
    assert full["median_probe_s"] == pytest.approx(3e-4) and "sampled_share" not in full
