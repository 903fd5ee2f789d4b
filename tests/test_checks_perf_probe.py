"""The perf probe extension (diag/probe/perf.py) in this process: what it records, that it undoes
every patch, and the CUDA-only paths (sync warnings, pageable copies) driven by hand."""
from __future__ import annotations

import warnings

import torch
from torch import nn

import diag
from diag.evidence import Evidence
from diag.fold import fold
from diag.probe.core import Probe
from diag.probe.perf import SYNC_MSG, PerfProbe, graph_saved_bytes, h2d_target


def _patched_state():
    return (torch.compile, torch.autograd.set_detect_anomaly, torch.autograd.detect_anomaly,
            torch.amp.GradScaler.__dict__.get("__init__"), torch.amp.GradScaler.__dict__.get("scale"),
            nn.Module.__dict__.get("zero_grad"), torch.profiler.profile.__dict__.get("__init__"),
            torch.Tensor.__dict__.get("to"), warnings.showwarning)


def test_records_scaler_debug_zero_grad_eval_graph_and_undoes_patches():
    before = _patched_state()
    try:
        with diag.watch() as run:
            assert _patched_state() != before
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = torch.amp.GradScaler("cpu")
            torch.autograd.set_detect_anomaly(True)
            with torch.profiler.profile():
                for _ in range(4):
                    model.zero_grad(set_to_none=False)
                    with torch.autocast("cpu", dtype=torch.float16):
                        loss = nn.functional.cross_entropy(model(torch.randn(8, 16)), torch.zeros(8, dtype=torch.long))
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
            torch.autograd.set_detect_anomaly(False)
            model.eval()
            out = model(torch.randn(64, 16))       # eval without no_grad: the graph keeps 64x32 fp32
            del out
    finally:
        torch.autograd.set_detect_anomaly(False)
    assert _patched_state() == before
    r = run.evidence.primary
    sc = r.amp["scaler"]
    assert sc["created"] == 1 and sc["enabled"] and sc["scale_calls"] == 4 and sc["step_calls"] == 4
    assert sc["location"]["file"] == __file__
    dbg = r.extras["debug"]
    assert dbg["anomaly_steps"] == 4 and dbg["profiler_steps"] == 4
    assert dbg["anomaly_location"]["file"] == __file__ and "set_detect_anomaly(True)" in dbg["anomaly_location"]["code"]
    mz = r.extras["module_zero_grad"]
    assert mz["calls"] == 4 and mz["set_to_none_false"] == 4 and mz["location"]["file"] == __file__
    (rec,) = r.extras["eval_graph"].values()
    assert rec["bytes"] == 64 * 32 * 4 and rec["code"] == "out = model(torch.randn(64, 16))       # eval without no_grad: the graph keeps 64x32 fp32"
    opt_rec = r.extras["optimizers"]["1"]
    assert opt_rec["cls"] == "SGD" and opt_rec["device"] == "cpu" and opt_rec["supports_fused"]
    assert all("pre_forward_s" in s.extra for s in r.steps)
    assert r.extras["perf"]["cpu_capability"]
    findings = {f.id: f for f in run.findings()}
    assert findings["eval.no-grad"].evidence["graph_bytes_per_forward"] == 64 * 32 * 4
    assert findings["amp.fp16-without-scaler"].severity.value == "pass"



def _debug_after(steps: int, switch_on_at: int) -> dict:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        with diag.watch() as run:
            for i in range(1, steps + 1):
                if i == switch_on_at:
                    torch.set_anomaly_enabled(True)     # torch's C switch: not through the patched API
                opt.zero_grad()
                nn.functional.cross_entropy(model(torch.randn(4, 4)), torch.zeros(4, dtype=torch.long)).backward()
                opt.step()
    finally:
        torch.set_anomaly_enabled(False)
    return run.evidence.primary.extras["debug"]


def test_debug_state_switched_on_behind_the_patches_is_found_by_the_sampled_reads():
    """Until anomaly detection or a profiler is seen on, the per-step reads are sampled (steps 1, 9,
    17, ...: issue 20); once one is seen every step is read. Switched on before the first step, every
    step counts; switched on at step 5 without the patched API, counting starts at the next sampled
    step (9): an undercount of at most DEBUG_EVERY - 1 steps."""
    from diag.probe.perf import DEBUG_EVERY

    dbg = _debug_after(20, 1)
    assert dbg["steps"] == 20 and dbg["anomaly_steps"] == 20
    dbg = _debug_after(20, 5)
    assert dbg["steps"] == 20 and 20 - 5 + 1 - (DEBUG_EVERY - 1) <= dbg["anomaly_steps"] <= 20 - 5 + 1
    assert dbg["anomaly_steps"] == 12
    dbg = _debug_after(20, 0)
    assert dbg["anomaly_steps"] == 0 and dbg["profiler_steps"] == 0

def test_graph_saved_bytes_excludes_parameters_and_inputs():
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8), nn.Sigmoid())
    x = torch.randn(10, 16)
    y = model(x)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    nbytes, nodes, complete = graph_saved_bytes(y, params | {x.untyped_storage().data_ptr()})
    # tanh output (10x32) saved once (Tanh and the second addmm share it) + sigmoid output (10x8)
    assert nbytes == (10 * 32 + 10 * 8) * 4 and complete and nodes >= 4
    assert graph_saved_bytes(y, params)[0] == nbytes + 10 * 16 * 4     # the input, when not excluded


def test_h2d_target_parsing():
    dev = torch.device("cuda", 1)
    t = torch.empty(1)
    assert h2d_target(("cuda",), {}) == ("cuda", False)
    assert h2d_target(("cuda:0",), {"non_blocking": True}) == ("cuda", True)
    assert h2d_target((dev, torch.float16, True), {}) == ("cuda", True)
    assert h2d_target((0,), {}) == ("cuda", False)
    assert h2d_target((), {"device": "cuda", "non_blocking": True}) == ("cuda", True)
    assert h2d_target((torch.float16,), {}) == (None, False)
    assert h2d_target((t, True), {}) == ("cpu", True)
    assert h2d_target(("cpu",), {}) == ("cpu", False)


def _sync_here():
    warnings.warn(SYNC_MSG)     # what torch's sync debug mode raises from C++ on every sync


def test_sync_capture_counts_per_step_locates_and_restores():
    """On CUDA the warnings come from torch.cuda.set_sync_debug_mode("warn"); here the same warning
    is issued by hand, so the capture, counting, location and clean-up are the real code."""
    events = []
    probe = Probe(events.append)
    probe.active = True
    ext = PerfProbe()
    ext._probe = probe
    ext._torch = torch
    seen = []
    orig_show, n_filters = warnings.showwarning, len(warnings.filters)
    warnings.showwarning = lambda *a, **k: seen.append(str(a[0]))
    try:
        ext.start_sync_capture(2)
        for step in (2, 3, 4):
            for _ in range(step - 1):
                _sync_here()
            ext.on_step_end(probe, {"index": step, "extra": {}})
        warnings.warn("an unrelated warning")          # passes through to the previous handler
        ext._close_sync(probe)
        assert warnings.showwarning is not ext._hook
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _sync_here()                                # after the window: no longer counted
        assert [str(w.message) for w in caught] == [SYNC_MSG]
    finally:
        hook = warnings.showwarning
        warnings.showwarning = orig_show
    assert len(warnings.filters) == n_filters
    assert seen == ["an unrelated warning"] and hook is not ext._hook
    ev = Evidence()
    for e in events:
        fold(ev, e)
    s = ev.primary.sync
    assert s["state"] == "sampled" and s["per_step"] == [1, 2, 3] and s["total"] == 6 and s["steps"] == 3
    site = s["sites"][0]
    assert site["file"] == __file__ and site["function"] == "_sync_here" and site["count"] == 6
    assert "warnings.warn(SYNC_MSG)" in site["code"]


def test_record_copy_counts_pageable_non_blocking_copies():
    events = []
    probe = Probe(events.append)
    ext = PerfProbe()
    ext._probe = probe
    t = torch.zeros(256)                  # pageable CPU memory (a CPU-only build cannot pin)
    ext.record_copy(t, non_blocking=True)
    ext.record_copy(t, non_blocking=False)
    c = ext.copies
    assert c["h2d_copies"] == 2 and c["h2d_bytes"] == 2 * 256 * 4
    assert c["non_blocking_pageable"] == 1 and c["blocking"] == 1
    (site,) = ext._copy_sites.values()
    assert site["file"] == __file__ and "ext.record_copy(t, non_blocking=True)" in site["code"]


class _StandInCuda:
    """Stands in for a CUDA build's torch.cuda sync-debug API (this machine has a CPU-only build):
    records the modes the extension sets, so the window's plumbing can be checked."""

    def __init__(self, mode=0):
        self.mode, self.calls = mode, []

    def get_sync_debug_mode(self):
        return self.mode

    def set_sync_debug_mode(self, mode):
        self.calls.append(mode)
        self.mode = 0 if mode in (0, "default") else 1

    def is_initialized(self):
        return True


class _StandInTorch:
    def __init__(self, cuda):
        self.cuda = cuda
        self.Tensor = type("Tensor", (), {"to": lambda self, *a, **k: self, "cuda": lambda self, *a, **k: self})
        self._C = torch._C

    def is_anomaly_enabled(self):
        return False


def test_sync_window_opens_after_step_one_counts_twenty_steps_and_restores():
    events = []
    probe = Probe(events.append)
    probe.active = True
    ext = PerfProbe()
    ext._probe = probe
    cuda = _StandInCuda()
    ext._torch = _StandInTorch(cuda)
    ext._cuda_training = True                    # as on_model sets it for a model on cuda:0
    orig_to = ext._torch.Tensor.to
    show = warnings.showwarning
    try:
        ext.on_step_end(probe, {"index": 1, "extra": {}})
        assert cuda.calls == ["warn"] and ext._sync_open and ext._copy_watch
        assert ext._torch.Tensor.__dict__["to"] is not orig_to           # copies watched in the window
        for i in range(2, 22):
            _sync_here()
            ext.on_step_end(probe, {"index": i, "extra": {}})
        assert cuda.calls == ["warn", 0] and not ext._sync_open and not ext._copy_watch
        assert ext._torch.Tensor.__dict__["to"] is orig_to
        assert warnings.showwarning is show
    finally:
        ext._close_sync(probe)
        warnings.showwarning = show
    assert ext.sync["steps"] == 20 and ext.sync["total"] == 20 and ext.sync["first_step"] == 2
    assert ext.sync["per_step"] == [1] * 20 and ext.copies["watched"]


def test_sync_window_leaves_a_mode_the_script_set_alone():
    probe = Probe([].append)
    probe.active = True
    ext = PerfProbe()
    ext._probe = probe
    cuda = _StandInCuda(mode=1)
    ext._torch = _StandInTorch(cuda)
    ext._cuda_training = True
    ext.on_step_end(probe, {"index": 1, "extra": {}})
    assert cuda.calls == [] and not ext._sync_open
    assert ext.sync["state"].startswith("not sampled: the script set sync debug mode 1")
