"""Memory checks on hand-built Evidence.

The ``memory`` sections below have the shape the probe's memory extension writes on a CUDA run
(``memory.steps`` from torch.cuda.memory_stats(), ``memory.device``, ``memory.breakdown``,
``memory.oom``; see docs/memory.md): this CPU-only machine cannot produce them, so they are built
here, with numbers of the size a real A100 run gives.
"""
from __future__ import annotations

import json

import pytest

from diag.checks.memory import memory_eval_batch, memory_fragmentation, memory_headroom, memory_oom
from diag.evidence import (DeviceInfo, Environment, Evidence, ExceptionInfo, ForwardSite, RankEvidence,
                           StepRecord)
from diag.findings import Severity
from diag.memory.breakdown import fragmentation, live_breakdown, step_record
from diag.memory.plan import make_plan

MiB, GiB = 1 << 20, 1 << 30
A100 = 85_196_275_712     # torch.cuda.get_device_properties(0).total_memory on an A100-SXM4-80GB

OOM_MSG = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.35 GiB of which "
           "1.10 GiB is free. Including non-PyTorch memory, this process has 78.24 GiB memory in use. Of the "
           "allocated memory 75.20 GiB is allocated by PyTorch, and 1.50 GiB is reserved by PyTorch but "
           "unallocated. If reserved but unallocated memory is large try setting "
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.")


def cuda_stats(allocated, peak, reserved, reserved_peak, retries=0, inactive=0):
    """A dict with the keys torch.cuda.memory_stats() returns (the subset diag reads)."""
    return {"allocated_bytes.all.current": allocated, "allocated_bytes.all.peak": peak,
            "reserved_bytes.all.current": reserved, "reserved_bytes.all.peak": reserved_peak,
            "inactive_split_bytes.all.current": inactive, "num_alloc_retries": retries, "num_ooms": 0,
            "active_bytes.all.peak": peak}


def cuda_evidence(steps_stats=(), breakdown=None, env=None, batch=64) -> Evidence:
    ev = Evidence()
    ev.environment = Environment(cuda_available=True, device_count=1, torch="2.13.0",
                                 devices=[DeviceInfo(index=0, name="NVIDIA A100-SXM4-80GB", total_memory=A100)],
                                 env=dict(env or {}))
    r = RankEvidence()
    for i, st in enumerate(steps_stats, start=1):
        r.steps.append(StepRecord(index=i, total_s=0.2, samples=batch))
        r.step_stats.count += 1
        r.memory.setdefault("steps", []).append(step_record(st, i))
    if steps_stats:
        r.memory["device"] = {"type": "cuda", "index": 0, "name": "NVIDIA A100-SXM4-80GB", "total": A100,
                              "capability": [8, 0]}
    if breakdown:
        r.memory["breakdown"] = breakdown
    ev.ranks.append(r)
    return ev


def one(gen):
    out = list(gen)
    assert len(out) == 1
    return out[0]


def affine_estimate(fixed, per_sample, observed, capacity, target=None):
    def train(b, a=1):
        extra = fixed // 4 if a > 1 else 0
        return {"mode": "train", "batch": b, "accumulation": a, "peak": fixed + extra + per_sample * b,
                "categories": {"parameters": fixed // 4, "gradients": fixed // 4, "optimizer_state": fixed // 2,
                               "activations": per_sample * b, "other": extra},
                "peak_phase": "backward", "phase_peaks": {}, "seconds": 0.01}

    def evaluate(b):
        return {"mode": "eval", "batch": b, "accumulation": 1, "peak": fixed * 3 // 4 + per_sample * b // 10,
                "categories": {"parameters": fixed // 4, "gradients": 0, "optimizer_state": fixed // 2,
                               "activations": per_sample * b // 10, "other": 0},
                "peak_phase": "eval", "phase_peaks": {}, "seconds": 0.01}

    est = make_plan(train, evaluate, observed_batch=observed, target_batch=target, capacity=capacity,
                    facts={"matmul": True}, capability=[8, 0])
    est["capacity_source"] = "NVIDIA A100 80GB"
    return est


# ---- the pure helpers ------------------------------------------------------------------------------

def test_step_record_and_breakdown_from_cuda_stats():
    rec = step_record(cuda_stats(30 * GiB, 62 * GiB, 40 * GiB, 70 * GiB, retries=2), 5)
    assert rec == {"step": 5, "allocated": 30 * GiB, "peak": 62 * GiB, "reserved": 40 * GiB,
                   "reserved_peak": 70 * GiB, "inactive_split": 0, "retries": 2, "ooms": 0}
    assert step_record({}, 1) is None                      # CUDA not initialised: nothing recorded
    b = live_breakdown(rec, {"params": 7 * GiB, "buffers": GiB, "grads": 7 * GiB, "optimizer_state": 14 * GiB})
    c = b["categories"]
    assert c == {"parameters": 8 * GiB, "gradients": 7 * GiB, "optimizer_state": 14 * GiB,
                 "other": GiB, "activations": 32 * GiB}
    assert sum(c.values()) == b["peak"] == 62 * GiB
    f = fragmentation(rec)
    assert f["overhead"] == 8 * GiB and f["retries"] == 2


# ---- memory.oom -----------------------------------------------------------------------------------

def oom_evidence(**kw):
    ev = cuda_evidence([cuda_stats(30 * GiB, 70 * GiB, 72 * GiB, 76 * GiB)] * 2, batch=64, **kw)
    r = ev.primary
    r.exceptions.append(ExceptionInfo(type="OutOfMemoryError", message=OOM_MSG, is_oom=True, step=2,
                                       location={"file": "/w/train.py", "line": 41, "function": "main"}))
    r.memory["oom"] = {"step": 3, "parsed": {}, "total": A100, "batch": 64, "batch_source": "failing forward",
                       "stats": step_record(cuda_stats(75 * GiB, 77 * GiB, 76 * GiB, 78 * GiB), 3)}
    ev.run.status = "oom"
    return ev


def test_oom_with_the_estimate_gives_accumulation_with_numbers():
    ev = oom_evidence()
    r = ev.primary
    r.memory["estimate"] = affine_estimate(16 * GiB, GiB, observed=64, capacity=A100)
    f = one(memory_oom(ev))
    assert f.severity is Severity.ERROR
    assert "at step 3 with batch size 64" in f.message and "asked for 2.00 GiB" in f.message
    mb = r.memory["estimate"]["max_batch"]
    assert 0 < mb < 64
    acc = f.evidence["accumulation"]
    assert acc["effective_batch"] == 64 and acc["micro_batch"] <= mb
    assert f"micro-batch {acc['micro_batch']} x {acc['steps']}" in f.fix and f"is {mb}" in f.fix
    assert f"accum_steps = {acc['steps']}" in f.snippet
    # the failing batch unknown (the allocation failed before the step's forward): the steps' batch is
    # said as theirs
    del r.memory["oom"]["batch"]
    f = one(memory_oom(ev))
    assert "at step 3 (the steps before it took batch size 64)" in f.message
    assert "expandable_segments" not in f.fix            # 1.5 GiB unallocated < 2 GiB requested
    assert f.location.line == 41


def test_oom_with_a_live_breakdown_only_gives_a_linear_estimate():
    bd = {"step": 2, "peak": 70 * GiB, "allocated": 30 * GiB, "categories": {
        "parameters": 7 * GiB, "gradients": 7 * GiB, "optimizer_state": 14 * GiB, "activations": 40 * GiB,
        "other": 2 * GiB}}
    ev = oom_evidence(breakdown=bd)
    f = one(memory_oom(ev))
    assert "activations 40.00 GiB" in f.message and "optimizer state 14.00 GiB" in f.message
    # 0.9 x 79.35 GiB - 30 GiB that is not per-sample leaves room for 66 samples at 0.625 GiB each:
    # the breakdown alone cannot explain the OOM, so the advice falls back to halving
    assert "linear_fit_batch" not in f.evidence
    assert "halve the micro-batch to 32" in f.fix and "accum_steps = 2" in f.snippet
    assert f.evidence["breakdown"]["activations"] == 40 * GiB


def test_oom_linear_estimate_numbers():
    bd = {"step": 2, "peak": 76 * GiB, "allocated": 30 * GiB, "categories": {
        "parameters": 7 * GiB, "gradients": 7 * GiB, "optimizer_state": 14 * GiB, "activations": 46 * GiB,
        "other": 2 * GiB}}
    ev = oom_evidence(breakdown=bd)
    f = one(memory_oom(ev))
    budget = 0.9 * 79.35 * GiB - 30 * GiB          # capacity from the message, minus what is not per-sample
    expected_fit = int(budget // (46 * GiB / 64))
    assert f.evidence["linear_fit_batch"] == expected_fit
    assert f"roughly {expected_fit} samples" in f.fix
    assert "accum_steps" in f.snippet


def test_oom_when_the_estimate_says_it_fits_explains_what_else_it_can_be():
    ev = oom_evidence()
    ev.primary.memory["estimate"] = affine_estimate(4 * GiB, 100 * MiB, observed=64, capacity=A100)
    f = one(memory_oom(ev))
    assert "one step does not explain" in f.fix and "loss.item()" in f.fix
    assert f.evidence["estimated_peak_at_batch"] > 0


def test_oom_fragmentation_advice_and_already_set():
    msg = OOM_MSG.replace("1.50 GiB is reserved", "3.00 GiB is reserved")
    ev = oom_evidence()
    ev.primary.exceptions[0].message = msg
    f = one(memory_oom(ev))
    assert "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in f.fix
    ev = oom_evidence(env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    ev.primary.exceptions[0].message = msg
    f = one(memory_oom(ev))
    assert "even with expandable segments" in f.fix


def test_no_oom_passes():
    ev = cuda_evidence([cuda_stats(GiB, 2 * GiB, 2 * GiB, 3 * GiB)])
    assert one(memory_oom(ev)).severity is Severity.PASS


# ---- memory.headroom ------------------------------------------------------------------------------

def test_headroom_from_allocator_stats():
    ev = cuda_evidence([cuda_stats(40 * GiB, 70 * GiB, 72 * GiB, 76 * GiB)])
    f = one(memory_headroom(ev))
    assert f.severity is Severity.WARNING
    assert f.evidence["source"] == "allocator" and f.evidence["ratio"] > 0.9
    assert "76.00 GiB" in f.message and "79.35 GiB" in f.message
    ev = cuda_evidence([cuda_stats(40 * GiB, 50 * GiB, 52 * GiB, 55 * GiB)])
    f = one(memory_headroom(ev))
    assert f.severity is Severity.PASS


def nvml_gpu(used, total=A100, run_mem=None, simulated=False, used_by_run=True):
    return {"provider": "simulated" if simulated else "nvml", "simulated": simulated, "devices": [
        {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "memory_total": total, "used_by_run": used_by_run,
         "stats": {"mem_used_max": used, "run_mem_max": run_mem}, "series": {"mem_used": [used]}}]}


def test_headroom_from_the_nvml_series_when_the_allocator_is_silent():
    ev = Evidence()
    ev.ranks.append(RankEvidence())
    ev.gpu = nvml_gpu(used=78 * GiB, run_mem=77 * GiB, simulated=True)
    f = one(memory_headroom(ev))
    assert f.severity is Severity.WARNING and f.evidence["source"] == "nvml"
    assert "held by the run's processes" in f.message and "simulated" in f.message
    ev.gpu = nvml_gpu(used=30 * GiB, run_mem=None, used_by_run=True)
    f = one(memory_headroom(ev))
    assert f.severity is Severity.PASS and "all processes" in f.message


def test_headroom_takes_the_higher_of_allocator_and_nvml():
    ev = cuda_evidence([cuda_stats(40 * GiB, 50 * GiB, 52 * GiB, 60 * GiB)])
    ev.gpu = nvml_gpu(used=78 * GiB, run_mem=77 * GiB)       # context + other libraries on top
    f = one(memory_headroom(ev))
    assert f.severity is Severity.WARNING and f.evidence["source"] == "nvml"
    assert f.evidence["allocator"]["ratio"] < 0.9


def test_headroom_from_the_estimate_and_skipped_without_anything():
    ev = Evidence()
    ev.ranks.append(RankEvidence())
    f = one(memory_headroom(ev))
    assert f.severity is Severity.SKIPPED
    ev.primary.memory["estimate"] = affine_estimate(16 * GiB, GiB, observed=60, capacity=A100)
    f = one(memory_headroom(ev))
    assert f.evidence["source"] == "estimate"
    assert f.severity is (Severity.WARNING if f.evidence["ratio"] > 0.9 else Severity.PASS)
    ev.primary.memory["estimate"] = affine_estimate(16 * GiB, GiB, observed=8, capacity=A100)
    assert one(memory_headroom(ev)).severity is Severity.PASS


# ---- memory.fragmentation -------------------------------------------------------------------------

def test_fragmentation_retries_and_overhead():
    ev = cuda_evidence([cuda_stats(10 * GiB, 40 * GiB, 50 * GiB, 52 * GiB), cuda_stats(10 * GiB, 40 * GiB, 50 * GiB,
                                                                                  52 * GiB, retries=3)])
    f = one(memory_fragmentation(ev))
    assert f.severity is Severity.WARNING
    assert "retried 3 time(s)" in f.message and "12.00 GiB" in f.message
    assert "expandable_segments:True" in f.fix and "expandable_segments" in f.snippet
    ok = cuda_evidence([cuda_stats(10 * GiB, 40 * GiB, 41 * GiB, 42 * GiB)])
    assert one(memory_fragmentation(ok)).severity is Severity.PASS
    small = cuda_evidence([cuda_stats(MiB, 100 * MiB, 300 * MiB, 400 * MiB)])   # 300% but only 300 MiB
    assert one(memory_fragmentation(small)).severity is Severity.PASS


def test_fragmentation_with_expandable_segments_already_on_is_info():
    ev = cuda_evidence([cuda_stats(10 * GiB, 40 * GiB, 50 * GiB, 60 * GiB)],
                       env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    f = one(memory_fragmentation(ev))
    assert f.severity is Severity.INFO and "already on" in f.fix


def test_fragmentation_skipped_on_cpu_and_read_from_an_oom_message():
    ev = Evidence()
    ev.ranks.append(RankEvidence())
    assert one(memory_fragmentation(ev)).severity is Severity.SKIPPED
    ev.primary.exceptions.append(ExceptionInfo(type="OutOfMemoryError", is_oom=True,
                                               message=OOM_MSG.replace("1.50 GiB is reserved", "3.00 GiB is reserved")))
    f = one(memory_fragmentation(ev))
    assert f.severity is Severity.WARNING and f.evidence["source"] == "oom message"


# ---- memory.eval-batch ----------------------------------------------------------------------------

def eval_evidence(eval_batch=64, train_batch=64, estimate=True):
    ev = cuda_evidence([cuda_stats(GiB, 2 * GiB, 2 * GiB, 3 * GiB)], batch=train_batch)
    r = ev.primary
    r.forwards.append(ForwardSite(key="s1", model=1, module="Net", training=True, grad_enabled=True,
                                  in_step=True, count=100, input_shapes=[[train_batch, 512]]))
    r.forwards.append(ForwardSite(key="s2", model=1, module="Net", training=False, grad_enabled=False,
                                  count=40, input_shapes=[[eval_batch, 512]],
                                  location={"file": "/w/train.py", "line": 60, "function": "evaluate"}))
    if estimate:
        r.memory["estimate"] = affine_estimate(8 * GiB, 512 * MiB, observed=train_batch, capacity=A100)
    return ev


def test_eval_batch_suggests_a_larger_one():
    ev = eval_evidence()
    f = one(memory_eval_batch(ev))
    mx = ev.primary.memory["estimate"]["eval"]["max_batch"]
    assert f.severity is Severity.INFO and mx >= 128
    assert f"{mx:,}" in f.message and "batch 64" in f.message
    sug = 1 << (mx.bit_length() - 1)
    assert f"batch_size={sug}" in f.fix and f"batch_size={sug}" in f.snippet
    assert f.location.line == 60


def test_eval_batch_passes_skips():
    assert one(memory_eval_batch(eval_evidence(eval_batch=4096, train_batch=64))).severity is Severity.PASS
    assert one(memory_eval_batch(eval_evidence(estimate=False))).severity is Severity.SKIPPED
    ev = eval_evidence()
    ev.primary.forwards = ev.primary.forwards[:1]
    f = one(memory_eval_batch(ev))
    assert f.severity is Severity.SKIPPED and "No evaluation forward" in f.message
    ev = eval_evidence(estimate=False)
    ev.primary.memory["estimate"] = {"status": "skipped", "reason": "operator x has no fake (meta) kernel"}
    f = one(memory_eval_batch(ev))
    assert f.severity is Severity.SKIPPED and "no fake (meta) kernel" in f.message


def test_memory_sections_survive_a_json_round_trip():
    ev = eval_evidence()
    ev.memory_plan = {"status": "ok", "verdict": {"max_batch": 3}}
    back = Evidence.from_dict(json.loads(ev.to_json()))
    assert back.primary.memory["estimate"]["max_batch"] == ev.primary.memory["estimate"]["max_batch"]
    assert back.memory_plan == ev.memory_plan
    assert [f.severity for f in memory_eval_batch(back)] == [f.severity for f in memory_eval_batch(ev)]


def _nested_stats(allocated, peak, reserved, reserved_peak, retries=0):
    """torch.cuda.memory_stats_as_nested_dict()'s shape: ~9 counters x 3 pools x 4 fields and a few
    scalars (what the caching allocator returns; torch.cuda.memory_stats() flattens it)."""
    def counter(cur, pk):
        return {"current": cur, "peak": pk, "allocated": pk * 3, "freed": pk * 3 - cur}

    names = ("allocation", "segment", "active", "inactive_split", "allocated_bytes", "reserved_bytes",
             "active_bytes", "inactive_split_bytes", "requested_bytes")
    out = {n: {p: counter(7, 9) for p in ("all", "small_pool", "large_pool")} for n in names}
    out["allocated_bytes"]["all"] = counter(allocated, peak)
    out["reserved_bytes"]["all"] = counter(reserved, reserved_peak)
    out["inactive_split_bytes"]["all"] = counter(0, 0)
    out.update(num_alloc_retries=retries, num_ooms=0, num_sync_all_streams=0, num_device_alloc=3,
               num_device_free=0, max_split_size=-1)
    return out


def test_the_probe_reads_the_allocator_unflattened_and_gets_torchs_record(monkeypatch):
    """issue 20: the memory probe's per-step read skips torch.cuda.memory_stats()'s Python flattening
    (~180 µs a call here, the bulk of ~340 µs a step on an H200). Its record equals the flat one, with
    torch's own flattening as the reference; the probe's CUDA step path emits it (a scripted
    allocator: this machine has no CUDA)."""
    import torch
    import torch.cuda.memory as tcm

    from diag.memory.breakdown import step_record_nested
    from diag.probe.memory import MemoryProbe

    nested = _nested_stats(3 * GiB, 5 * GiB, 6 * GiB, 6 * GiB, retries=2)
    monkeypatch.setattr(tcm, "memory_stats_as_nested_dict", lambda device=None: nested)
    flat = torch.cuda.memory_stats(0)                    # torch's flattening of the same dict
    assert step_record_nested(nested, 4) == step_record(flat, 4)
    assert step_record_nested(nested, 4)["retries"] == 2 and step_record_nested({}, 4) is None

    calls = []
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda dev: calls.append(dev) or nested)
    monkeypatch.setattr(torch.cuda, "memory_stats", lambda *a, **k: pytest.fail("flattened per step"))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: type(
        "P", (), {"name": "scripted GPU", "total_memory": A100, "major": 9, "minor": 0})())

    class Probe:
        events = []

        def emit(self, kind, **data):
            self.events.append((kind, data["path"], data["value"]))

        def last_model(self):
            return torch.nn.Linear(2, 2)

    mp, p = MemoryProbe(), Probe()
    mp._cuda_dev = torch.device("cuda", 0)
    for i in (1, 2, 3):
        mp._cuda_step(p, i)
    steps = [v for k, path, v in p.events if path == "memory.steps"]
    assert [s["step"] for s in steps] == [1, 2, 3] and steps[0]["peak"] == 5 * GiB
    assert steps[2] == step_record(flat, 3)
    assert len(calls) == 3
    assert any(path == "memory.device" for _, path, _ in p.events)
    assert any(path == "memory.breakdown" for _, path, _ in p.events)


def test_the_allocator_is_read_every_step_early_then_every_tenth_and_at_the_end(monkeypatch):
    """issue 20: a record per step for the first 50 steps, then every 10th, and the run's last step;
    the running peaks make nothing a check reads fall between two records."""
    import torch

    from diag.probe import memory as pm

    peak = {"v": GiB}

    def nested(dev):
        peak["v"] += MiB                                  # the running peak grows a little each read
        return _nested_stats(GiB, peak["v"], 2 * GiB, 2 * GiB)

    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", nested)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: type(
        "P", (), {"name": "scripted GPU", "total_memory": A100, "major": 9, "minor": 0})())

    class Probe:
        rank, events, steps_done = 0, [], 0

        def emit(self, kind, **data):
            self.events.append((data["path"], data["value"]))

        def last_model(self):
            return torch.nn.Linear(2, 2)

    mp, p = pm.MemoryProbe(), Probe()
    mp._cuda_dev, mp._cuda_available = torch.device("cuda", 0), True
    for i in range(1, 76):
        p.steps_done = i
        mp.on_step_end(p, {"index": i})
    mp.on_exit(p, "completed")
    steps = [v["step"] for path, v in p.events if path == "memory.steps"]
    assert steps == list(range(1, pm.EVERY_STEP_UNTIL + 1)) + [60, 70, 75]

    # a run that dies of an OOM: the counters at exit are the failed allocation's (its retry, the
    # failing step's peak), kept in memory.oom, not recorded as the last completed step's
    mp, p = pm.MemoryProbe(), Probe()
    p.events = []
    mp._cuda_dev, mp._cuda_available = torch.device("cuda", 0), True
    for i in range(1, 58):
        p.steps_done = i
        mp.on_step_end(p, {"index": i})
    mp.on_exit(p, "oom")
    assert [v["step"] for path, v in p.events if path == "memory.steps"][-1] == 50
    assert [v["step"] for path, v in p.events if path == "memory.oom"] == [58]
