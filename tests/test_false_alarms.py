"""Issue 33, unit level: no false alarms on real scripts (the rules and measurements behind each one,
on hand-built evidence in the shape of the run that showed it). End to end on the corpus scripts:
tests/test_corpus_public.py."""
from __future__ import annotations

import pytest

from check_support import ev_with, run_check
from test_attach_unit import _evidence as attach_evidence, judge
from diag.evidence import DataLoaderInfo, ModelInfo, RankEvidence, StepRecord
from diag.evidence.evaluation import EvalStepRecord
from diag.evidence.models import ForwardSite
from diag.evidence.gpu import GpuTelemetry
from diag.findings import Severity


def _host(ev, *, host_cpu, run_cpu, load=None, cpus=2, n=8):
    """The sampler's host and process series (what every run records beside it)."""
    ev.gpu = GpuTelemetry(provider="none", host={"cpu_count": cpus, "series": {
        "t": list(range(n)), "cpu": [None] + [host_cpu] * (n - 1), "mem_used": [0] * n,
        **({"load1": [load] * n} if load is not None else {})}},
        processes={"series": {"t": list(range(n)), "cpu": [None] + [run_cpu] * (n - 1)}, "gpu": []})
    return ev


def _cpu_run(data_shares, total=0.2, workers=0, cpus=2):
    st = [StepRecord(index=i + 1, total_s=total, data_s=total * d, forward_s=total * (1 - d) / 2,
                     backward_s=total * (1 - d) / 2) for i, d in enumerate(data_shares)]
    r = RankEvidence(steps=st, models=[ModelInfo(id=1, devices=["cpu"])],
                     forwards=[ForwardSite(key="m1@train.py:50", model=1, count=len(st), in_step=True, training=True)],
                     dataloaders=[DataLoaderInfo(id=1, num_workers=workers, batches=len(st), batch_size=32,
                                                 role="train", location={"file": "/w/train.py", "line": 40})])
    return ev_with(r, cpus=cpus)


# ---- host contention reshapes the data-worker advice ------------------------------------------------

def test_contended_host_says_workers_will_not_help():
    """The 2-core CPU run at load 6 (this run's CPU 37%): dataloader.workers predicted 204 -> 131 ms
    with num_workers=1 and diag compare measured +4.2%. On a contended host: no worker count, no
    prediction, info on a CPU run; host.contention says why."""
    ev = _host(_cpu_run([0.36] * 20), host_cpu=100.0, run_cpu=37.0, load=6.3)
    (f,) = run_check("dataloader.workers", ev)
    assert f.severity is Severity.INFO, f.message
    assert "will not help" in f.message and "load 6.3 on 2 CPUs" in f.message
    assert f.evidence["recommended_workers"] is None and f.evidence["predicted_step_s"] is None
    assert f.evidence["host"]["contended"] and f.evidence["workers_help"] is False
    assert "num_workers=0 and 1" in f.fix and "--runs 3" in f.fix and f.snippet is None
    (h,) = run_check("host.contention", ev)
    assert h.severity is Severity.INFO and "this run got 37% of one core" in h.message
    # a quiet host: the same waits get the worker advice and its prediction
    ev = _host(_cpu_run([0.36] * 20), host_cpu=45.0, run_cpu=90.0, load=0.9)
    (f,) = run_check("dataloader.workers", ev)
    assert f.severity is Severity.ERROR and f.evidence["recommended_workers"] == 1 and f.evidence["predicted_step_s"]
    assert run_check("host.contention", ev)[0].severity is Severity.PASS
    assert run_check("host.contention", _cpu_run([0.36] * 20))[0].severity is Severity.SKIPPED


def test_an_error_holds_under_the_runs_own_spread():
    """A median share past 30% made of a few long waits among short ones (a busy machine's stalls) is
    a warning, not an error: three steps in four must be past the line."""
    shares = [0.02] * 8 + [0.5] * 12            # median 0.5, lower quartile 0.02
    (f,) = run_check("dataloader.workers", _host(_cpu_run(shares), host_cpu=50.0, run_cpu=95.0))
    assert f.evidence["data_share"] >= 0.3 and f.evidence["data_share_q1"] < 0.3
    assert f.severity is Severity.WARNING
    (f,) = run_check("dataloader.workers", _host(_cpu_run([0.4] * 20), host_cpu=50.0, run_cpu=95.0))
    assert f.severity is Severity.ERROR


def test_eval_only_error_needs_to_hold_on_a_busy_machine():
    """An evaluation-only script (data 1 ms of a 32 ms step on a quiet machine) got a dataloader.workers
    ERROR (exit 1) on a busy one: with the host contended it is at most info on a CPU run."""
    r = RankEvidence(models=[ModelInfo(id=1, devices=["cpu"])],
                     dataloaders=[DataLoaderInfo(id=1, num_workers=0, batches=24, batch_size=64, role="eval",
                                                 wait_s=24 * 0.02)])
    r.eval_steps = [EvalStepRecord(index=i + 1, total_s=0.05, data_s=0.02, forward_s=0.03, samples=64)
                    for i in range(24)]
    r.eval_stats.count = 24
    r.eval_stats.total_s = 24 * 0.05
    r.eval_stats.samples = 24 * 64
    ev = _host(ev_with(r, cpus=2), host_cpu=100.0, run_cpu=60.0, load=5.0)
    (f,) = run_check("dataloader.workers", ev)
    assert f.severity is Severity.INFO and "will not help" in f.message, (f.severity, f.message)


def test_attach_and_check_share_the_advice_on_a_cpu_run():
    """diag attach advised num_workers=4, pin_memory=True and "the GPU has nothing queued" on a CPU-only
    2-core run where diag check advised num_workers=1: one advice function now."""
    ev = attach_evidence({"data": 0.6, "forward": 0.2, "backward": 0.2})
    ev.environment.cpu_count = 2
    (f,) = [x for x in judge(ev, select=["dataloader.workers"]) if x.id == "dataloader.workers"]
    assert "pin_memory" not in (f.fix or "") and "GPU" not in f.why, (f.fix, f.why)
    assert "num_workers=1" in f.fix and f.evidence["recommended_workers"] == 1
    probe = _host(_cpu_run([0.6] * 20), host_cpu=50.0, run_cpu=95.0)
    (g,) = run_check("dataloader.workers", probe)
    assert g.evidence["recommended_workers"] == f.evidence["recommended_workers"]
    assert "pin_memory" not in (g.fix or "") + (g.snippet or "")
    # contended while attached: no worker count either
    _host(ev, host_cpu=100.0, run_cpu=30.0, load=6.0)
    (f,) = [x for x in judge(ev, select=["dataloader.workers"]) if x.id == "dataloader.workers"]
    assert f.severity is Severity.INFO and "will not help" in f.message


# ---- eval.small-batch: a measured per-batch fixed cost on the CPU --------------------------------------

def _cpu_eval(sizes_and_times, grad=False):
    from diag.testing import EvidenceBuilder

    b = EvidenceBuilder().environment(cpu_count=2)
    b.eval_model(grad_enabled=grad, inference_mode=not grad)
    b.dataloader(batch_size=8, role="eval", batches=len(sizes_and_times), wait_s=0.001,
                 location={"file": "/w/train.py", "line": 60})
    ev = b.eval_steps(len(sizes_and_times), total_s=0.01, samples=8).build()
    for s, (n, t) in zip(ev.primary.eval_steps, sizes_and_times):
        s.samples, s.total_s, s.data_s, s.forward_s = n, t, 0.0, t
    if grad:
        ev.primary.forwards[0].output_requires_grad = True
    return ev


def test_small_batch_on_the_cpu_is_judged_on_a_measured_fixed_cost():
    """llm.c validates at the training batch and run_clm_no_trainer at batch 8: a warning on the CPU,
    where batch 8 and 64 measured the same throughput (1,389 vs 1,391 samples/s)."""
    # all batches one size: the fixed cost is not measured -> pass
    (f,) = run_check("eval.small-batch", _cpu_eval([(8, 0.010)] * 40))
    assert f.severity is Severity.PASS and "not measured" in f.message
    # a last partial batch of 2 at a quarter of the time: cost proportional to the batch -> pass
    (f,) = run_check("eval.small-batch", _cpu_eval([(8, 0.010)] * 39 + [(2, 0.0025)]))
    assert f.severity is Severity.PASS and f.evidence["fixed_share"] < 0.1
    # a partial batch of 2 nearly as slow as a full one: the per-call cost dominates -> warning, with it
    ev = _cpu_eval([(8, 0.010)] * 39 + [(2, 0.009)])
    (f,) = run_check("eval.small-batch", ev)
    assert f.severity is Severity.WARNING and f.evidence["fixed_share"] > 0.5 and "measured:" in f.message


def test_small_batch_does_not_contradict_eval_no_grad():
    """The same report said eval.no-grad keeps 7.9 MiB per forward and eval.small-batch "an evaluation
    forward keeps no activations": with graphs built, the text says so."""
    ev = _cpu_eval([(8, 0.010)] * 39 + [(2, 0.009)], grad=True)
    (f,) = run_check("eval.small-batch", ev)
    assert "under no_grad (see eval.no-grad" in f.message


def test_no_inference_mode_pass_beside_a_no_grad_warning():
    """"pass: Evaluation under inference_mode" stood next to "WARNING: Evaluation without no_grad"."""
    from diag.testing import EvidenceBuilder

    b = EvidenceBuilder().environment(cpu_count=2)
    ev = b.eval_model(grad_enabled=True, inference_mode=False).eval_steps(10, samples=8).build()
    ev.primary.forwards[0].output_requires_grad = True
    (ng,) = run_check("eval.no-grad", ev)
    (im,) = run_check("eval.inference-mode", ev)
    assert ng.severity is Severity.WARNING
    assert im.severity is Severity.SKIPPED and "gradients enabled" in im.message


# ---- compile.unused: the run's own length, load, and the script's own flag -----------------------------

def _train(n=200, fwd=0.004, bwd=0.006, status="completed", stop=None, facts=None, stalls=0):
    st = [StepRecord(index=i + 1, total_s=0.012 + (0.2 if i < stalls else 0.0), data_s=0.001,
                     forward_s=fwd + (0.1 if i < stalls else 0.0), backward_s=bwd + (0.1 if i < stalls else 0.0),
                     optimizer_s=0.001) for i in range(n)]
    r = RankEvidence(steps=st, models=[ModelInfo(id=1, devices=["cpu"])],
                     forwards=[ForwardSite(key="s1", model=1, count=n, in_step=True, training=True)])
    r.step_stats.count = r.step_stats.timed = n
    ev = ev_with(r, cpus=2)
    ev.run.status, ev.run.stop_reason, ev.run.script_facts = status, stop, facts
    return ev


def test_compile_unused_silent_beyond_the_runs_own_length():
    """Break-evens of 17,903 steps for a 200-epoch script and 769,344 for the DDP tutorial: a run that
    ended by itself before its break-even passes; one diag stopped still gets the condition."""
    (f,) = run_check("compile.unused", _train())
    assert f.severity is Severity.PASS and f.evidence["break_even_steps"] > 200
    (f,) = run_check("compile.unused", _train(status="stopped", stop="--steps 200 reached"))
    assert f.severity is Severity.INFO and "stopped after 200" in f.message


def test_compile_unused_break_even_is_stable_under_load():
    """Swinging 10x with machine load: a quarter of the steps stalled by 100 ms each does not move it."""
    quiet = run_check("compile.unused", _train(status="stopped", stop="x"))[0].evidence["break_even_steps"]
    loaded = run_check("compile.unused", _train(status="stopped", stop="x", stalls=45))[0].evidence["break_even_steps"]
    assert quiet == loaded


def test_compile_unused_names_the_scripts_own_flag():
    import textwrap

    from diag.scriptfacts import read

    src = textwrap.dedent('''
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("--compile", action="store_true")
        p.add_argument("--num-workers", type=int, default=0)
        args = p.parse_args()
    ''')
    import tempfile, os
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(src)
    try:
        facts = read(fh.name)
    finally:
        os.unlink(fh.name)
    (f,) = run_check("compile.unused", _train(status="stopped", stop="x", facts=facts))
    assert "--compile" in f.fix and "line 4" in f.fix and f.location.line == 4 and f.snippet is None


# ---- phases add up to the step in every report (DDP's collective wait) ---------------------------------

def _ddp_evidence():
    st = [StepRecord(index=i + 1, total_s=0.0016, data_s=0.0001, forward_s=0.0001, backward_s=0.0002,
                     optimizer_s=0.0, other_s=0.00025, extra={"comm_wait_s": 0.00095}) for i in range(20)]
    r = RankEvidence(steps=st, models=[ModelInfo(id=1, devices=["cpu"])])
    r.step_stats.count = r.step_stats.timed = 20
    ev = ev_with(r)
    ev.run.status = "completed"
    return ev


def test_ddp_collective_wait_is_a_phase_in_every_report():
    """DDP's text summary said "median step 1.6 ms (data 0.1 / fwd 0.1 / bwd 0.2 / opt 0.0 / other 0.2)":
    0.6 ms; the 0.95 ms of all-reduce wait (59%) was in the evidence and nowhere in the report."""
    from diag.report import console as rcon, json as rjson
    from diag.report.html import render_html
    from diag.tui.models.steps import phase_shares

    ev = _ddp_evidence()
    med = ev.primary.median_step()
    parts = sum(v for k, v in med.items() if k.endswith("_s") and k != "total_s")
    assert med["comm_s"] == pytest.approx(0.00095) and parts == pytest.approx(med["total_s"], rel=1e-6)
    text = rcon.run_header(ev).plain
    assert "/ comm 0.9 ms /" in text, text[:500]
    summ = rjson.summary(ev, [])
    assert summ["step_phases_median_s"]["comm_s"] == pytest.approx(0.00095)
    rows = phase_shares(med)
    assert ("comm_s", "collective wait") in [(k, lbl) for k, lbl, _, _ in rows]
    assert sum(v for _, _, v, _ in rows) == pytest.approx(med["total_s"], rel=1e-6)
    assert "collective wait" in render_html(ev, [], 0)


# ---- forwards after training (generation) in train mode or with grad -----------------------------------

def test_generation_after_training_in_train_mode_with_grad():
    """500 forwards of a generation loop after the last step, dropout active, grad on: recorded with
    their site, judged by nobody. Forwards of the steps themselves and of evaluation passes are not."""
    st = [StepRecord(index=i + 1, total_s=0.01, forward_s=0.004, backward_s=0.005) for i in range(30)]
    train = ForwardSite(key="s1", model=1, module="GPT", count=30, in_step=True, training=True, first_step=1,
                        output_requires_grad=True, location={"file": "/w/gpt.py", "line": 80})
    gen = ForwardSite(key="s2", model=1, module="GPT", count=500, in_step=True, training=True, first_step=31,
                      grad_enabled=True, output_requires_grad=True, location={"file": "/w/gpt.py", "line": 95})
    r = RankEvidence(steps=st, forwards=[train, gen],
                     models=[ModelInfo(id=1, cls="GPT", devices=["cpu"], module_types={"Dropout": 7})])
    r.step_stats.count = 30
    ev = ev_with(r)
    (f,) = run_check("inference.after-training", ev)
    assert f.severity is Severity.WARNING and f.location.line == 95 and f.evidence["forwards"] == 500
    assert "training mode" in f.message and "gradients enabled" in f.message and "Dropout x7" in f.message
    gen.training, gen.grad_enabled, gen.inference_mode, gen.output_requires_grad = False, False, True, False
    assert run_check("inference.after-training", ev)[0].severity is Severity.PASS
    ev.run.stop_reason = "--steps 30 reached"
    assert run_check("inference.after-training", ev)[0].severity is Severity.SKIPPED


def test_zero_grad_is_located_at_the_call():
    """optim.zero-grad came with "location": null: the script's zero_grad(set_to_none=False) line."""
    import os
    import tempfile
    import textwrap

    from diag.evidence import OptimizerInfo
    from diag.scriptfacts import read

    src = textwrap.dedent('''
        for x, y in loader:
            opt.zero_grad(set_to_none=False)
            loss.backward()
    ''')
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(src)
    try:
        facts = read(fh.name)
    finally:
        os.unlink(fh.name)
    ev = _train(status="completed", facts=facts)
    ev.primary.optimizers = [OptimizerInfo(id=1, cls="SGD", zero_grad_calls=200, zero_grad_set_to_none=False,
                                           zero_grad_s=0.02)]
    (f,) = run_check("optim.zero-grad", ev)
    assert f.location is not None and f.location.line == 3, f.location


def test_the_evaluation_loaders_own_wait_in_a_training_run():
    """The evaluation loader's data wait (73% of an evaluation step) was never flagged in a
    training+evaluation run: an info beside the training loader's verdict, once."""
    from diag.evidence import EvaluationPass

    ev = _host(_cpu_run([0.02] * 20), host_cpu=50.0, run_cpu=95.0)
    r = ev.primary
    r.dataloaders.append(DataLoaderInfo(id=2, num_workers=0, batches=24, batch_size=64, role="eval", wait_s=0.5,
                                        location={"file": "/w/train.py", "line": 70}))
    r.eval_steps = [EvalStepRecord(index=i + 1, total_s=0.03, data_s=0.022, forward_s=0.008, samples=64)
                    for i in range(24)]
    r.eval_stats.count, r.eval_stats.total_s, r.eval_stats.samples = 24, 24 * 0.03, 24 * 64
    r.evaluations = [EvaluationPass(index=1, after_step=10, time_s=0.36, forwards=12),
                     EvaluationPass(index=2, after_step=20, time_s=0.36, forwards=12)]
    r.step_stats.count, r.step_stats.total_s = 20, 4.0
    out = run_check("dataloader.workers", ev)
    assert [f.severity for f in out] == [Severity.PASS, Severity.INFO], [(f.severity, f.message) for f in out]
    assert out[1].title == "Evaluation waits for data" and "73%" in out[1].message and out[1].location.line == 70
