"""Issue 33, unit level: no false alarms on real scripts (the rules and measurements behind each one,
on hand-built evidence in the shape of the run that showed it). End to end on the corpus scripts:
tests/test_corpus_public.py."""
from __future__ import annotations

import pytest

from check_support import ev_with, run_check, steps
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
