"""The checks judge on the device clock when the run has a device timeline (evidence in the shape a
CUDA run writes: the probe's step events and the timeline's events folded by diag's fold), and keep
the host clock otherwise."""
from __future__ import annotations

import copy
import importlib

import pytest

from diag.checks.dataloader import dataloader_main_thread_data, dataloader_workers
from diag.checks.distributed import straggler
from diag.checks.tuning import compile_unused
from diag.evidence import TimelineSection, load_evidence
from diag.registry import _specs_in
from diag.testing import EvidenceBuilder, run_check

from test_timeline_logic import _train
from timeline_support import run_loop

BAD = ("warning", "error")


def _hidden_run():
    return run_loop(30, lambda s, i: _train(s, data_s=0.020)).evidence(num_workers=4)


def _exposed_run():
    return run_loop(30, lambda s, i: _train(s, data_s=0.050, item=True)).evidence(num_workers=0)


def _host_only(ev):
    ev = copy.deepcopy(ev)
    for r in ev.ranks:
        r.timeline = TimelineSection()
    return ev


def _sev(f):
    return str(getattr(f.severity, "value", f.severity))


def test_hidden_data_wait_passes_with_a_note():
    ev = _hidden_run()
    (f,) = run_check(dataloader_workers, ev)
    assert _sev(f) == "pass"
    assert "hidden" in f.message and "device clock" in f.message
    assert f.evidence["clock"] == "device"
    assert f.evidence["host_data_share"] > 0.5 and f.evidence["gpu_idle_data_share"] < 0.01
    # the same run judged on the host clock alone is the false verdict the device clock avoids
    (h,) = run_check(dataloader_workers, _host_only(ev))
    assert _sev(h) in BAD and h.evidence.get("clock") == "host"


def test_exposed_data_wait_is_found_with_gpu_idle_numbers():
    (f,) = run_check(dataloader_workers, _exposed_run())
    assert _sev(f) in BAD
    assert f.evidence["clock"] == "device"
    assert 0.35 < f.evidence["gpu_idle_data_share"] < 0.5
    assert "GPU was idle" in f.message and "waiting for data" in f.message


def test_no_check_reports_a_data_stall_the_device_timeline_shows_hidden():
    ev = _hidden_run()
    findings = []
    for name in ("dataloader", "tuning", "cost", "sync", "eval", "amp", "parallel", "run", "gpu", "memory", "timeline"):
        mod = importlib.import_module(f"diag.checks.{name}")
        for spec in _specs_in(mod, name):
            findings += run_check(spec, ev)
    stalls = [f for f in findings if _sev(f) in BAD and
              (f.id.startswith("dataloader.") or "data" in (f.title or "").lower() and "wait" in f.message)]
    assert not [f for f in stalls if f.id in ("dataloader.workers", "dataloader.main-thread-data")]
    assert not [f for f in stalls if "waited for data" in f.message or "waits for data" in f.message]
    # and the registry did run the data checks on this evidence
    ids = {f.id for f in findings}
    assert "dataloader.workers" in ids and "compile.unused" in ids


def test_main_thread_work_hidden_on_device_passes():
    ev = _hidden_run()
    for s in ev.primary.steps:      # the perf extension's pre-forward gap: large on the host clock
        s.extra["pre_forward_s"] = 0.4 * s.total_s
    (f,) = run_check(dataloader_main_thread_data, ev)
    assert _sev(f) == "pass" and "hidden" in f.message
    (h,) = run_check(dataloader_main_thread_data, _host_only(ev))
    assert _sev(h) in BAD


def test_compile_unused_uses_device_data_share():
    ev = _hidden_run()
    ev.primary.extras["compile"] = {"calls": 0, "models": []}
    (f,) = run_check(compile_unused, ev)
    assert f.evidence["clock"] == "device"
    assert f.evidence["data_share"] < 0.01
    assert "fix the data pipeline first" not in f.message
    (h,) = run_check(compile_unused, _host_only(ev))
    assert h.evidence["clock"] == "host" and "fix the data pipeline first" in h.message


def _tl_steps(n, forward):
    return [{"index": i, "device_s": 0.1 + forward, "host_s": 0.1, "busy_s": 0.1 + forward, "idle_s": 0.0,
             "idle": {}, "phases": {"forward": forward, "backward": 0.06, "optimizer": 0.04}, "marks": 6}
            for i in range(1, n + 1)]


def test_straggler_uses_device_time_per_rank():
    b = EvidenceBuilder()
    for rank, fwd in ((0, 0.03), (1, 0.03), (2, 0.09)):
        b.rank(rank, world_size=3).cuda_training(device="NVIDIA H200").steps(12, total_s=0.2, forward_s=0.06,
                                                                            backward_s=0.1)
        b.section("distributed", backend="nccl", comm={"measured": True})
        b.section("timeline", clock="device", steps=_tl_steps(12, fwd))
    ev = b.build()
    findings = run_check(straggler, ev)
    bad = [f for f in findings if _sev(f) in BAD]
    assert bad, [f.message for f in findings]
    assert bad[0].evidence["rank"] == 2 and bad[0].evidence["clock"] == "device"
    # on the host clock the three ranks look alike
    host = [f for f in run_check(straggler, _host_only(ev)) if _sev(f) in BAD]
    assert not host


def test_timeline_round_trips_through_the_evidence_file(tmp_path):
    ev = _exposed_run()
    p = tmp_path / "evidence.json"
    p.write_text(ev.to_json())
    back = load_evidence(p)
    assert back.primary.timeline.clock == "device"
    assert back.primary.timeline.steps == ev.primary.timeline.steps
    (f,) = run_check(dataloader_workers, back)
    assert f.evidence["clock"] == "device"


def test_cpu_run_keeps_the_host_clock():
    ev = (EvidenceBuilder().model().dataloader(num_workers=0, role="train", batches=10)
          .steps(10, total_s=0.1, data_s=0.05).build())
    (f,) = run_check(dataloader_workers, ev)
    assert _sev(f) in BAD and f.evidence["clock"] == "host"
    assert "device clock" not in f.message


def _mfu_evidence(timeline: bool):
    b = (EvidenceBuilder().cuda_training(device="NVIDIA H100 80GB HBM3").steps(10, total_s=0.5, samples=64)
         .section("flops", status="measured step 3", measured={
             "step": 3, "flops": 1.2e14, "model_flops": 1.2e14, "forward_flops": 4e13, "backward_flops": 8e13,
             "precision": "bf16", "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "world_size": 1}))
    if timeline:   # the GPU was busy 0.25 s of each 0.5 s step (idle waiting for data the rest)
        b.section("timeline", clock="device", steps=[
            {"index": i, "device_s": 0.5, "host_s": 0.5, "busy_s": 0.25, "idle_s": 0.25, "idle": {"data": 0.25},
             "phases": {"data": 0.25, "forward": 0.08, "backward": 0.15, "optimizer": 0.02}, "marks": 6}
            for i in range(1, 11)])
    return b.build()


def test_mfu_reports_wall_and_busy_time_separately():
    from diag.checks.cost import cost_mfu

    (f,) = run_check(cost_mfu, _mfu_evidence(True))
    assert f.evidence["mfu_clock"] == "wall"
    assert f.evidence["device_busy_s"] == 0.25
    assert f.evidence["mfu_busy"] == pytest.approx(2 * f.evidence["mfu"], rel=1e-3)
    assert "over the GPU's busy time" in f.message and "on wall time" in f.message
    (h,) = run_check(cost_mfu, _mfu_evidence(False))
    assert "mfu_busy" not in h.evidence and "busy time" not in h.message
    assert h.evidence["mfu"] == f.evidence["mfu"]


def test_gpu_idle_headline_by_cause():
    from diag.checks.timeline import gpu_idle

    (f,) = run_check(gpu_idle, _exposed_run())
    assert _sev(f) == "warning"
    assert f.message.startswith("The GPU was idle 43% of the step; 43 points of it waiting for data")
    assert "device clock" in f.message and "num_workers" in (f.snippet or "")
    assert f.evidence["idle_causes"]["data"] == pytest.approx(0.43, abs=0.02)
    (p,) = run_check(gpu_idle, _hidden_run())
    assert _sev(p) == "pass" and "idle 0%" in p.message
    sync = run_loop(20, lambda s, i: _train(s, data_s=0.0, item=True, after=0.020)).evidence(sync_per_step=1)
    (g,) = run_check(gpu_idle, sync)
    assert _sev(g) == "info" and "after host syncs" in g.message and "sync.host-device" in g.fix
    (k,) = run_check(gpu_idle, _host_only(_exposed_run()))
    assert _sev(k) == "skipped" and "No device timeline" in k.message
    cpu = EvidenceBuilder().model().steps(5).build()
    (c,) = run_check(gpu_idle, cpu)
    assert _sev(c) == "skipped"
