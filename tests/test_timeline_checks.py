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

from test_timeline_logic import BWD, FWD, OPT, _train
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
    assert "over the device clock's busy time" in f.message and "on wall time" in f.message
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
    # a pass does not claim the GPU computes all the time: events cannot see gaps between kernels
    assert "not visible to events" in p.message and p.title == "No idle gap at the step's marks"
    sync = run_loop(20, lambda s, i: _train(s, data_s=0.0, item=True, after=0.020)).evidence(sync_per_step=1)
    (g,) = run_check(gpu_idle, sync)
    assert _sev(g) == "info" and "after host syncs" in g.message and "sync.host-device" in g.fix
    (k,) = run_check(gpu_idle, _host_only(_exposed_run()))
    assert _sev(k) == "skipped" and "No device timeline" in k.message
    cpu = EvidenceBuilder().model().steps(5).build()
    (c,) = run_check(gpu_idle, cpu)
    assert _sev(c) == "skipped"


# ---- every async case: no data stall the device shows hidden, the idle named by its cause ------------

def _all_findings(ev):
    findings = []
    for name in ("dataloader", "tuning", "cost", "sync", "eval", "amp", "parallel", "run", "gpu", "memory", "timeline"):
        mod = importlib.import_module(f"diag.checks.{name}")
        for spec in _specs_in(mod, name):
            findings += run_check(spec, ev)
    return findings


def _data_stalls(findings):
    """Findings that say the training waits for data."""
    return [f for f in findings if _sev(f) in BAD and (
        f.id in ("dataloader.workers", "dataloader.main-thread-data")
        or any(w in f.message for w in ("waited for data", "waits for data", "fix the data pipeline first",
                                        "points of it waiting for data")))]


def _item_run():        # fast loader, .item() and 20 ms of logging every step: idle after the sync
    return run_loop(30, lambda s, i: _train(s, data_s=0.001, item=True, after=0.020)).evidence(
        num_workers=4, sync_per_step=1)


def _pageable_run():    # pageable copies of 8 ms a step, hidden data wait
    return run_loop(30, lambda s, i: _train(s, data_s=0.010, h2d=0.008)).evidence(num_workers=4)


def _eval_run():        # an evaluation pass over a slow loader every 5th step; training data hidden
    def body(s, i):
        _train(s, data_s=0.010)
        if i % 5 == 4:
            s.eval_pass(0.030, batches=6, wait_s=0.015, item=True)
    return run_loop(30, body).evidence(num_workers=4)


def _ckpt_run():        # torch.save every 5th step; training data hidden
    def body(s, i):
        _train(s, data_s=0.010)
        if i % 5 == 4:
            s.ckpt(0.200)
    return run_loop(30, body).evidence(num_workers=4)


@pytest.mark.parametrize("case,cause", [
    ("hidden", None), ("item", "sync"), ("pageable", "h2d"), ("eval", "eval"), ("checkpoint", "checkpoint")])
def test_no_data_stall_where_the_device_shows_none(case, cause):
    ev = {"hidden": _hidden_run, "item": _item_run, "pageable": _pageable_run, "eval": _eval_run,
          "checkpoint": _ckpt_run}[case]()
    findings = _all_findings(ev)
    assert not _data_stalls(findings), [f.message for f in _data_stalls(findings)]
    ids = {f.id for f in findings}
    assert {"dataloader.workers", "compile.unused", "gpu.idle"} <= ids
    (dw,) = [f for f in findings if f.id == "dataloader.workers"]
    assert dw.evidence["clock"] == "device" and dw.evidence["gpu_idle_data_share"] < 0.05
    (idle,) = [f for f in findings if f.id == "gpu.idle"]
    causes = idle.evidence["idle_causes"]
    if cause is None:
        assert _sev(idle) == "pass"
    else:
        assert max(causes, key=causes.get) == cause, causes
        assert causes["data"] < 0.05


def test_exposed_data_wait_is_the_one_stall_reported():
    findings = _all_findings(_exposed_run())
    stalls = _data_stalls(findings)
    assert {f.id for f in stalls} >= {"dataloader.workers", "gpu.idle"}


def test_eval_loader_waits_are_not_training_data_waits():
    ev = _eval_run()
    (f,) = run_check(dataloader_workers, ev)
    # only the training fetch right after each pass is exposed (the pass's .item() drained the queue):
    # 10 ms in 5 steps; the pass's own 90 ms of fetches are evaluation's
    assert _sev(f) not in BAD and f.evidence["gpu_idle_data_share"] < 0.04
    from diag.checks.timeline import gpu_idle

    (g,) = run_check(gpu_idle, ev)
    assert g.evidence["idle_causes"]["eval"] > 0.05 and g.evidence["eval_share"] > g.evidence["idle_causes"]["eval"]
    assert "during evaluation" in g.message


def test_checkpoint_idle_named_with_its_fix():
    from diag.checks.timeline import gpu_idle

    (g,) = run_check(gpu_idle, _ckpt_run())
    assert _sev(g) in ("info", "warning") and g.message.rstrip(".").split(" (device clock")[0].endswith("checkpointing")
    assert "save less often" in g.fix
    assert g.evidence["idle_causes"]["host"] < 0.01


def test_pin_memory_is_sized_by_the_device_clock():
    from diag.checks.dataloader import dataloader_pin_memory

    ev = _pageable_run()
    ev.primary.extras["copies"] = {"h2d_copies": 20, "h2d_bytes": 20 << 20, "non_blocking_pageable": 20,
                                   "non_blocking_pinned": 0, "blocking": 0, "steps": 20, "sites": [],
                                   "watched": True}
    (f,) = run_check(dataloader_pin_memory, ev)
    assert _sev(f) == "warning" and f.evidence["clock"] == "device"
    share = 0.008 / (0.008 + FWD + BWD + OPT)
    assert f.evidence["gpu_idle_pageable_copy_share"] == pytest.approx(share, abs=0.02)
    assert f.evidence["copies_device"]["pageable"]["bytes_per_step"] == 1 << 20
    assert "on the device clock the GPU sat idle" in f.message and "pageable copies" in f.message
    # the same copies, 0.5 ms a step: below the warning share on the device, an info
    small = run_loop(30, lambda s, i: _train(s, data_s=0.010, h2d=0.0005)).evidence(num_workers=4)
    small.primary.extras["copies"] = ev.primary.extras["copies"]
    (g,) = run_check(dataloader_pin_memory, small)
    assert _sev(g) == "info" and g.evidence["clock"] == "device"
    # without the timeline: the estimate from bytes on the host clock, as before
    (h,) = run_check(dataloader_pin_memory, _host_only(ev))
    assert h.evidence["clock"] == "host" and "estimated" in h.message


def test_pinned_copies_pass_with_their_device_cost():
    from diag.checks.dataloader import dataloader_pin_memory

    sim = run_loop(30, lambda s, i: (s.data(0.010), s.h2d(0.002, pageable=False), s.forward(FWD),
                                     s.backward(BWD), s.optimizer(OPT)))
    ev = (EvidenceBuilder().cuda_training(device="NVIDIA H200").dataloader(num_workers=4, pin_memory=True,
                                                                        role="train", batches=30).build())
    src = sim.evidence(num_workers=4)
    ev.ranks[0].steps, ev.ranks[0].timeline = src.primary.steps, src.primary.timeline
    ev.primary.extras["copies"] = {"h2d_copies": 20, "h2d_bytes": 20 << 20, "non_blocking_pageable": 0,
                                   "non_blocking_pinned": 20, "blocking": 0, "steps": 20, "sites": [],
                                   "watched": True}
    (f,) = run_check(dataloader_pin_memory, ev)
    assert _sev(f) == "pass" and "pinned copies take" in f.message
    assert f.evidence["gpu_idle_pinned_copy_share"] > 0.02 and f.evidence["gpu_idle_pageable_copy_share"] == 0.0
