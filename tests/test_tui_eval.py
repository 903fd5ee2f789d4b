"""The TUI on evaluation runs: the Steps tab's evaluation rows (an evaluation-only run, and the
evaluation passes of a training run) and the Cost tab pricing evaluation from the measured throughput."""
from __future__ import annotations

import pytest

from diag.evidence import EvaluationPass
from diag.testing import EvidenceBuilder
from tui_support import freeze_catalogue, plain, replay_app, widget_text


def _eval_only():
    b = EvidenceBuilder().environment(cpu_count=8)
    b.eval_model(params=330_000).dataloader(batch_size=64, role="eval", batches=20, dataset_len=1280)
    b.eval_steps(20, total_s=0.004, data_s=0.001, h2d_s=0.0005, forward_s=0.002, samples=64)
    ev = b.build()
    ev.primary.flops["eval"] = {"flops": 2 * 330_000 * 64, "samples": 64, "params": 330_000, "eval_step": 3,
                                "device": "cpu"}
    ev.run.script = "evaluate.py"
    return ev


def _train_with_eval():
    b = EvidenceBuilder().environment(cpu_count=8).model().steps(40, total_s=0.01, samples=32)
    b.eval_model().eval_steps(12, total_s=0.005, samples=64)
    ev = b.build()
    for k in range(1, 5):
        ev.primary.evaluations.append(EvaluationPass(index=k, after_step=10 * k, time_s=0.015, forwards=3,
                                                     batches=3))
    return ev


def test_step_summary_of_an_evaluation_run():
    from diag.tui.models.steps import eval_phase_shares, summarize_steps

    s = summarize_steps(_eval_only())
    assert s.kind == "evaluation" and s.step == 0
    assert s.eval["steps"] == 20 and s.eval["samples_per_s"] == pytest.approx(64 / 0.004)
    rows = eval_phase_shares(s.eval)
    assert [r[1] for r in rows] == ["data wait", "host-to-device", "forward", "other (post-processing)"]
    assert sum(r[3] for r in rows) == pytest.approx(1.0)
    t = summarize_steps(_train_with_eval())
    assert t.kind == "training+evaluation" and t.eval_share["every"] == 10


async def test_steps_tab_shows_evaluation_rows():
    app = replay_app("steps", evidence=_eval_only(), findings=[])
    async with app.run_test(size=(110, 40)) as pilot:
        await pilot.pause(0.3)
        assert "evaluation step 20" in widget_text(app, "#header-1", 110)
        summary = widget_text(app, "#steps-summary", 110)
        assert "evaluation run" in summary and "no training step seen yet" not in summary
        rows = widget_text(app, "#steps-eval", 110)
        assert "20 evaluation step(s)" in rows and "batches/s" in rows and "samples/s" in rows
        assert "host-to-device" in rows and "post-processing" in rows
    app = replay_app("steps", evidence=_train_with_eval(), findings=[])
    async with app.run_test(size=(110, 40)) as pilot:
        await pilot.pause(0.3)
        rows = widget_text(app, "#steps-eval", 110)
        assert "in 4 pass(es)" in rows and "of training+evaluation time" in rows and "every 10 steps" in rows


async def test_cost_tab_prices_evaluation_from_the_measured_throughput(monkeypatch):
    freeze_catalogue(monkeypatch)
    app = replay_app("cost", evidence=_eval_only(), findings=[], scenario=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.5)
        pane = app.pane("cost")
        assert pane.result.error is None
        assert pane.inputs().eval == "1.28k"                    # the evaluation set's size (1,280)
        x = pane.result.eval_measured
        assert x is not None and x.units == 1280 and x.seconds == pytest.approx(1280 / (64 / 0.004))
        assert x.analytic_flops == pytest.approx(2 * 330_000 * 1280)   # 2·N·D
        text = widget_text(app, "#cost-main", 120)
        assert "evaluation at the measured rate" in text
        assert pane.result.main.eval is None        # not priced twice (the formula would call samples tokens)
        note = widget_text(app, "#cost-note", 120)
        assert "an evaluation run has no training step to measure" in note
        assert "formula only" not in note and "0 step(s)" not in note
    app = replay_app("cost", evidence=_train_with_eval(), findings=[], scenario=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.5)
        text = widget_text(app, "#cost-main", 120)
        assert "evaluation took" in text and "every 20 steps would save" in text


async def test_checks_summary_of_an_evaluation_run_counts_evaluation_steps():
    ev = _eval_only()
    ev.run.status = "completed"
    app = replay_app("checks", evidence=ev, findings=[])
    async with app.run_test(size=(110, 40)) as pilot:
        await pilot.pause(0.3)
        text = widget_text(app, "#checks-summary", 110)
        assert "judged on the whole run (20 evaluation steps)" in text and "(0 steps)" not in text


# ---- issue 30: the Cost tab in the units of the run ---------------------------------------------------

def test_eval_interval_line_never_offers_a_negative_saving():
    """A run whose interval is irregular (every unknown): the line offers the nearest sparser interval
    that saves time, never one that costs more ("would save -89422.94 ms")."""
    from diag.cost.eval import EvalFrequency, IntervalRow
    from diag.tui.models.cost import CostResult
    from diag.tui.widgets.cost import eval_renderable

    rows = [IntervalRow(every=e, share=0.1, eval_s_per_1000_steps=0.0, delta_s_per_1000_steps=d,
                        delta_cost_per_1000_steps=None, current=(e == 10))
            for e, d in ((2.5, 90.0), (5, 30.0), (10, 0.0), (20, -15.0), (40, -22.5), (100, -27.0))]
    freq = EvalFrequency(passes=4, every=None, per_pass_s=0.1, step_s=0.01, eval_s=0.4, train_s=0.4,
                         share=0.5, rows=rows)
    text = eval_renderable(CostResult(), freq).plain
    assert "save -" not in text and "every 20 steps would save 15.0 s" in text
    only_costlier = EvalFrequency(passes=4, every=10, per_pass_s=0.1, step_s=0.01, eval_s=0.4, train_s=0.4,
                                  share=0.5, rows=rows[:3])
    assert "would save" not in eval_renderable(CostResult(), only_costlier).plain


async def test_cost_tab_on_a_cpu_run_speaks_wall_clock_and_derives_evaluate_on(monkeypatch):
    freeze_catalogue(monkeypatch)
    from diag.tui.models.cost import prefill

    ev = _train_with_eval()
    assert prefill(ev).inputs.eval == "192"           # formula basis (tokens), samples measured: one pass
    ev.primary.flops["measured"] = {
        "step": 3, "flops": 6e6 * 32, "model_flops": 6e6 * 32, "forward_flops": 2e6 * 32,
        "backward_flops": 4e6 * 32, "recompute_detected": False, "samples": 32, "tokens": None, "n_forward": 1,
        "params": 1e6, "precision": "fp32", "device": "cpu", "device_name": None, "gpu": None,
        "peak_flops": None, "peak_note": "CPU run: the catalogue has no CPU peaks", "world_size": 1,
        "compiled": False}
    pre = prefill(ev)
    # evaluation per training unit as the run did it: 3 batches of 64 samples a pass, a pass every 10
    # steps of 32 samples: 192 / 320 = 0.6
    assert pre.measured is not None and pre.eval_measured is not None
    assert any("the run's ratio" in n for n in pre.notes), pre.notes
    app = replay_app("cost", evidence=ev, findings=[], scenario=None)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.5)
        pane = app.pane("cost")
        train = pane.result.main.training.units
        assert pane.result.eval_measured.units == pytest.approx(0.6 * train, rel=0.01)   # 3-digit form text
        text = widget_text(app, "#cost-main", 120) + widget_text(app, "#cost-plan", 120)
        assert "GPU-hours" not in text and "$" not in text and "N/A (no price)" not in text
        assert "on this CPU" in text and "wall clock" in text
        assert "--" not in text                      # no command-line option inside the form
        # a price typed: the money comes back (asked for)
        field = app.query_one("#cost-price")
        field.focus()
        await pilot.press(*"2.5")
        await pilot.pause(0.2)
        text = widget_text(app, "#cost-main", 120)
        assert "GPU-hours" in text and "$" in text


def test_cost_form_never_says_pass_an_option():
    from diag.tui.models.cost import CostInputs, compute
    from diag.tui.widgets.cost import form_words, main_renderable

    res = compute(CostInputs(params="7B", work="140B", gpu="h100-sxm", count="8"))
    assert "pass --mfu" in res.main.mfu_basis                  # the engine's words, for the command line
    text = plain(main_renderable(res, "tokens"), 120)
    assert "--mfu" not in text and "MFU field" in text
    assert form_words("no price in the catalogue (pass --price)") == \
        "no price in the catalogue (type one in the price field)"
