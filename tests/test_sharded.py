"""Sharded training (issue 29): the distributed probe's collective accounting (a real one-process gloo
group in this process; the device clock with a scripted CUDA-event stand-in), FSDP2's configuration as
the probe reads it, and the sharded checks on hand-built Evidence. The real torchrun FSDP jobs are in
test_corpus_sharded.py."""
from __future__ import annotations

import time

import pytest

from diag.evidence import Evidence, RankEvidence, StepRecord
from diag.evidence import events as E
from diag.findings import Severity
from diag.registry import Registry

KiB = 1 << 10
MiB = 1 << 20


def run_check(cid, ev):
    reg = Registry.discover().select([cid])
    out = [f for f in reg.run(ev) if f.id == cid]
    assert out, f"{cid} produced no finding"
    return out


# ---- the probe: collectives through torch.distributed, in this process -----------------------------------

def test_collectives_are_timed_per_kind_and_step_and_async_waits_are_exposed(tmp_path, monkeypatch):
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    import diag

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "sharded-test")   # as under torchrun: the extension is on
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    orig_wait = dist.distributed_c10d.Work.wait
    orig_ag = dist.all_gather_single
    try:
        model = nn.Linear(16, 16)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = DataLoader(TensorDataset(torch.randn(32, 16)), batch_size=8)
        with diag.watch() as run:
            for (x,) in data:
                out = torch.empty(256)
                dist.all_gather_single(out, torch.ones(256))                 # 1 KiB gathered, blocking
                model(x).pow(2).mean().backward()
                dist.reduce_scatter_single(torch.empty(512), torch.ones(512))   # 2 KiB in
                work = dist.all_reduce(torch.ones(4), async_op=True)
                time.sleep(0.005)                                            # compute it can hide behind
                work.wait()
                opt.step()
                opt.zero_grad()
        assert dist.distributed_c10d.Work.wait is orig_wait and dist.all_gather_single is orig_ag   # undone
    finally:
        dist.destroy_process_group()
    r = run.evidence.primary
    assert r.step_stats.count == 4
    for s in r.steps:
        comm = s.extra["comm"]
        assert comm["all_gather"][0] == 1 and comm["all_gather"][2] == 1 * KiB
        assert comm["reduce_scatter"][0] == 1 and comm["reduce_scatter"][2] == 2 * KiB
        assert comm["all_reduce"][0] == 1 and comm["all_reduce"][2] == 16
        exposed = sum(v[1] for v in comm.values())
        assert exposed == pytest.approx(s.extra["comm_wait_s"], abs=1e-6)
        # the async all-reduce was in flight during the 5 ms sleep
        assert s.extra["comm_in_flight_s"] >= 0.004
        parts = s.data_s + s.forward_s + s.backward_s + s.optimizer_s + s.other_s + s.extra["comm_wait_s"]
        assert parts == pytest.approx(s.total_s, abs=1e-6)
    coll = r.distributed["comm"]["collectives"]
    # gloo's all_reduce work reports completion (is_completed); its wait found it done every time
    assert coll["all_reduce"]["async"] == 4 and coll["all_reduce"]["found_done"] == 4
    assert coll["all_gather_single"]["kind"] == "all_gather" and coll["all_gather_single"]["calls"] == 4
    assert coll["all_reduce"]["in_flight_s"] >= 4 * 0.004
    assert coll["reduce_scatter_single"]["kind"] == "reduce_scatter" and coll["reduce_scatter_single"]["async"] == 0


def test_fsdp2_configuration_is_recorded(tmp_path, monkeypatch):
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    import diag

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "sharded-test")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 1))
        fully_shard(model[0], reshard_after_forward=False)
        fully_shard(model[2], mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float32))
        fully_shard(model)
        model[0].set_modules_to_forward_prefetch([model[2]])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with diag.watch() as run:
            for _ in range(3):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
                opt.zero_grad()
    finally:
        dist.destroy_process_group()
    f = run.evidence.primary.distributed["fsdp"]
    assert f["api"] == "fsdp2" and f["units"] == 3 and f["params"] == 8 * 8 + 8 + 8 * 8 + 8 + 8 + 1
    units = {u["module"]: u for u in f["unit_list"]}
    assert units["0"]["reshard_after_forward"] is False and units["2"]["reshard_after_forward"] is True
    assert units["(root)"]["reshard_after_forward"] is False          # FSDP2 keeps the root's after forward
    assert units["0"]["forward_prefetch"] == 1 and f["explicit_forward_prefetch"] == 1
    assert f["last_unit"] == "2" and f["last_unit_reshards"] is True
    assert f["mixed_precision"]["reduce_dtype"] == "float32" and f["offload"] is None
    assert f["param_dtypes"] == ["float32"] and f["devices"] == ["cpu"]


# ---- the device clock: CUDA events on the compute stream (a scripted stand-in) ---------------------------

class _Ev:
    def __init__(self, t):
        self.t = t


class StandInClock:
    """One device timeline: events complete when the stream reaches them; collectives queued on the
    compute stream serialise with its kernels."""

    def __init__(self):
        self.host = 0.0
        self.tail = 0.0
        self.compute = True

    def record(self):
        self.tail = max(self.tail, self.host)
        return _Ev(self.tail)

    def on_compute_stream(self):
        return self.compute

    def query(self, e):
        return e.t <= self.host

    def elapsed_ms(self, a, b):
        return (b.t - a.t) * 1e3


class _Cuda:
    is_cuda = True

    def numel(self):
        return 1 << 18

    def element_size(self):
        return 4


class FakeCtx:
    sampled = True

    def __init__(self):
        self.events = []

    def is_live(self):
        return True

    def phase(self):
        return "backward"

    def emit(self, kind, **data):
        self.events.append((kind, data))


def test_device_clock_books_collectives_on_the_compute_stream_as_exposed():
    from diag.probe.distributed import DistributedProbe

    clock = StandInClock()
    ext = DistributedProbe()
    ext.active = True
    ext._dev_clock = clock
    ctx = FakeCtx()
    ext._probe = ctx

    def nccl_all_reduce(t, async_op=False):     # returns at once; the device runs it for 3 ms
        clock.tail = max(clock.tail, clock.host) + 0.003
        clock.host += 0.00001

    def nccl_all_gather(out, inp, async_op=False):
        clock.tail = max(clock.tail, clock.host) + 0.002
        clock.host += 0.00001

    ar = ext._make_wrapper(ctx, nccl_all_reduce, "all_reduce")
    ag = ext._make_wrapper(ctx, nccl_all_gather, "all_gather_into_tensor")
    for i in range(3):
        clock.compute = True
        ar(_Cuda())                    # on the compute stream: exposed on the device
        clock.compute = False
        ag(_Cuda(), _Cuda())           # on a side stream: overlappable, not counted as exposed
        clock.host += 0.01             # the host runs on; the device finishes everything
        step = {"index": i + 1, "total_s": 0.012, "data_s": 0.0, "forward_s": 0.002, "backward_s": 0.008,
                "optimizer_s": 0.0, "other_s": 0.002, "extra": {}}
        ext.on_step_end(ctx, step)
        # host: the calls returned at once: the thread's wait is its own few microseconds, far below the
        # device's 3 ms (a margin for a loaded machine)
        assert 0 < step["extra"]["comm_wait_s"] < 0.0015
        assert step["extra"]["comm"]["all_reduce"][0] == 1 and step["extra"]["comm"]["all_gather"][2] == 1 << 20
    recs = [d["value"] for k, d in ctx.events if k == E.APPEND and d["path"] == "distributed.comm_device"]
    assert [r["step"] for r in recs] == [1, 2, 3]
    for r in recs:
        assert r["exposed_s"] == pytest.approx(0.003, abs=1e-9)          # the all-reduce only
        assert r["comm_s"] == pytest.approx(0.005, abs=1e-9)             # both collectives' device time
        assert r["kinds"] == {"all_reduce": pytest.approx(0.003, abs=1e-9)}


# ---- the checks, on hand-built Evidence -------------------------------------------------------------------

def fsdp2_cfg(units=3, last_reshards=True, prefetch=0, devices=("cpu",), mp=None, offload=None, param_bytes=4 * MiB):
    return {"api": "fsdp2", "units": units, "unit_list": [], "params": param_bytes // 4, "param_bytes": param_bytes,
            "param_dtypes": ["float32"], "devices": list(devices), "shard_world": 2,
            "explicit_forward_prefetch": prefetch, "last_unit": "blocks.7", "last_unit_reshards": last_reshards,
            "mixed_precision": mp, "offload": offload}


def srank(r, cfg, *, step=0.100, wait=0.004, kinds=None, n=10, world=2, fwd=None, device=None, peak=None):
    """A rank of a sharded run: every step the same, ``wait`` seconds of it in collectives."""
    kinds = kinds or {"all_gather": [5, wait * 0.6, 5 * 256 * KiB], "reduce_scatter": [3, wait * 0.4, 3 * 256 * KiB]}
    work = step - wait
    f = work * 0.4 if fwd is None else fwd
    steps = [StepRecord(index=i + 1, total_s=step, data_s=0.0, forward_s=f, backward_s=work - f - 0.001,
                        optimizer_s=0.001, other_s=0.0, samples=8,
                        extra={"comm_wait_s": wait, "comm": kinds}) for i in range(n)]
    re = RankEvidence(rank=r, local_rank=r, world_size=world, host="node", steps=steps, status="completed")
    re.distributed = {"fsdp": cfg, "backend": "nccl" if "cuda" in cfg["devices"] else "gloo",
                      "comm": {"collectives": {}, "steps": n}}
    if device is not None:
        re.distributed["comm_device"] = [{"step": i + 1, "exposed_s": device, "comm_s": device, "kinds": {}}
                                         for i in range(n)]
    if peak is not None:
        re.distributed["memory"] = {"peak_allocated_bytes": peak, "device": "cuda:0"}
    return re


def evidence(*ranks, gpu=None) -> Evidence:
    ev = Evidence()
    ev.ranks = list(ranks)
    ev.run.status = "completed"
    if gpu:
        from diag.evidence import DeviceInfo

        name, cap, mem = gpu
        ev.environment.cuda, ev.environment.cuda_available = "12.4", True
        ev.environment.devices = [DeviceInfo(index=0, name=name, type="cuda", capability=list(cap), total_memory=mem)]
    return ev


def test_exposed_comm_passes_a_healthy_fsdp_job():
    cfg = fsdp2_cfg()
    (f,) = run_check("sharded.exposed-comm", evidence(srank(0, cfg, wait=0.004), srank(1, cfg, wait=0.005)))
    assert f.severity is Severity.PASS and f.evidence["share"] == pytest.approx(0.04)


def test_exposed_comm_warns_on_too_small_units_with_fsdp2_words():
    cfg = fsdp2_cfg(units=98)
    tiny = {"all_gather": [194, 0.24, 194 * 1100], "reduce_scatter": [97, 0.16, 97 * 1100]}
    ev = evidence(srank(0, cfg, step=0.55, wait=0.40, kinds=tiny), srank(1, cfg, step=0.55, wait=0.41, kinds=tiny))
    (f,) = run_check("sharded.exposed-comm", ev)
    assert f.severity is Severity.WARNING
    assert f.evidence["causes"][0] == "small_units" and f.evidence["share"] == pytest.approx(0.40 / 0.55, abs=1e-3)
    assert "194 all-gathers" in f.message and "fully_shard" in f.fix and "fully_shard(block)" in f.snippet
    assert "no_overlap_on_cpu" in f.evidence["causes"]          # and on gloo nothing overlaps


def test_exposed_comm_names_the_late_rank_without_a_second_warning():
    cfg = fsdp2_cfg()
    # rank 1 sleeps 150 ms in its forward: rank 0 waits for it in the next all-gather
    ev = evidence(srank(0, cfg, step=0.40, wait=0.16), srank(1, cfg, step=0.40, wait=0.008, fwd=0.30))
    (f,) = run_check("sharded.exposed-comm", ev)
    assert f.severity is Severity.INFO
    assert f.evidence["late_rank"] == 1 and f.evidence["waiting_rank"] == 0
    assert "for rank 1" in f.message and f.evidence["waiting_for_late_s"] == pytest.approx(0.152)
    (s,) = run_check("distributed.straggler", ev)
    assert s.severity in (Severity.WARNING, Severity.ERROR) and s.evidence["rank"] == 1
    assert s.evidence["phase"] == "forward" and "FSDP" in s.why and s.evidence["sharded"] == "fsdp2"


def test_exposed_comm_on_gpu_uses_the_device_clock_and_names_prefetch():
    cfg = fsdp2_cfg(devices=("cuda",), units=9)
    big = {"all_gather": [9, 0.0005, 9 * 64 * MiB], "reduce_scatter": [8, 0.0005, 8 * 64 * MiB]}
    # the host barely waits (NCCL returns at once); the compute stream stalls 30 ms of a 150 ms step
    ev = evidence(srank(0, cfg, step=0.15, wait=0.001, kinds=big, device=0.030),
                  srank(1, cfg, step=0.15, wait=0.001, kinds=big, device=0.032), gpu=("NVIDIA H100", (9, 0), 80 << 30))
    (f,) = run_check("sharded.exposed-comm", ev)
    assert f.severity is Severity.WARNING and f.evidence["clock"] == "device"
    assert f.evidence["exposed_s"] == pytest.approx(0.030)
    assert f.evidence["causes"][:2] == ["reshard_last", "no_prefetch"]
    assert "reshard_after_forward=False" in f.snippet and "bandwidth" in f.evidence["causes"]


def test_exposed_comm_fsdp1_without_backward_prefetch():
    cfg = {"api": "fsdp1", "units": 9, "devices": ["cuda"], "backward_prefetch": None, "forward_prefetch": False,
           "param_bytes": 400 * MiB, "param_dtypes": ["float32"]}
    big = {"all_gather": [18, 0.02, 18 * 40 * MiB], "reduce_scatter": [9, 0.01, 9 * 40 * MiB]}
    ev = evidence(srank(0, cfg, step=0.2, wait=0.03, kinds=big), srank(1, cfg, step=0.2, wait=0.031, kinds=big))
    (f,) = run_check("sharded.exposed-comm", ev)
    assert f.severity is Severity.WARNING and f.evidence["causes"][0] == "no_prefetch"
    assert "BackwardPrefetch.BACKWARD_PRE" in f.snippet


def test_exposed_comm_skips_runs_without_fsdp():
    ev = evidence(srank(0, fsdp2_cfg()), srank(1, fsdp2_cfg()))
    for r in ev.ranks:
        del r.distributed["fsdp"]
    (f,) = run_check("sharded.exposed-comm", ev)
    assert f.severity is Severity.SKIPPED


def test_mixed_precision_on_bf16_gpu_and_not_on_cpu():
    gpu = ("NVIDIA A100-SXM4-80GB", (8, 0), 80 << 30)
    cfg = fsdp2_cfg(devices=("cuda",))
    ev = evidence(srank(0, cfg, wait=0.02), srank(1, cfg, wait=0.021), gpu=gpu)
    (f,) = run_check("sharded.mixed-precision", ev)
    assert f.severity is Severity.WARNING and "MixedPrecisionPolicy(param_dtype=torch.bfloat16" in f.snippet
    ev = evidence(srank(0, cfg, wait=0.002), srank(1, cfg, wait=0.002), gpu=gpu)
    assert run_check("sharded.mixed-precision", ev)[0].severity is Severity.INFO     # comm is small: said, no more
    mp = fsdp2_cfg(devices=("cuda",), mp={"cls": "MixedPrecisionPolicy", "param_dtype": "bfloat16"})
    assert run_check("sharded.mixed-precision", evidence(srank(0, mp), srank(1, mp), gpu=gpu))[0].severity is Severity.PASS
    old = evidence(srank(0, cfg, wait=0.02), srank(1, cfg, wait=0.02), gpu=("Tesla V100", (7, 0), 32 << 30))
    assert run_check("sharded.mixed-precision", old)[0].severity is Severity.SKIPPED
    cpu = fsdp2_cfg()
    assert run_check("sharded.mixed-precision", evidence(srank(0, cpu), srank(1, cpu)))[0].severity is Severity.SKIPPED


def test_cpu_offload_that_is_not_needed_warns_and_one_that_is_passes():
    gpu = ("NVIDIA A100-SXM4-80GB", (8, 0), 80 << 30)
    small = fsdp2_cfg(devices=("cuda",), offload={"cls": "CPUOffloadPolicy", "pin_memory": True}, param_bytes=2 << 30)
    ev = evidence(srank(0, small, peak=6 << 30), srank(1, small, peak=6 << 30), gpu=gpu)
    (f,) = run_check("sharded.cpu-offload", ev)
    # 2 GiB of fp32 params x (param + grad + 2 Adam states... SGD counted as 1 state) / 2 ranks + 6 GiB peak
    assert f.severity is Severity.WARNING and f.evidence["estimate_bytes"] < 0.85 * (80 << 30)
    huge = fsdp2_cfg(devices=("cuda",), offload={"cls": "CPUOffloadPolicy"}, param_bytes=60 << 30)
    ev = evidence(srank(0, huge, peak=20 << 30), srank(1, huge, peak=20 << 30), gpu=gpu)
    assert run_check("sharded.cpu-offload", ev)[0].severity is Severity.PASS
    cpu = fsdp2_cfg(offload={"cls": "CPUOffloadPolicy"})
    assert run_check("sharded.cpu-offload", evidence(srank(0, cpu), srank(1, cpu)))[0].severity is Severity.SKIPPED


# ---- DeepSpeed: the engine's ZeRO configuration, and the fixes in its config's words --------------------

def test_deepspeed_engine_configuration_is_read_through_its_accessors():
    import torch
    from torch import nn

    from diag.probe.fsdp import describe

    class _Dev:
        value = "none"

    class _Off:
        device = _Dev()

    class DeepSpeedEngine(nn.Module):         # the accessors of deepspeed.runtime.engine.DeepSpeedEngine
        def __init__(self):
            super().__init__()
            self.module = nn.Linear(4, 4)
            self.device = torch.device("cpu")
            self.world_size = 2

        def zero_optimization_stage(self):
            return 3

        def zero_overlap_comm(self):
            return False

        def zero_reduce_bucket_size(self):
            return 5e8

        def zero_allgather_bucket_size(self):
            return 5e8

        def zero_prefetch_bucket_size(self):
            return 5e7

        def zero_contiguous_gradients(self):
            return True

        def zero_offload_param(self):
            return _Off()

        def zero_offload_optimizer(self):
            return None

        def bfloat16_enabled(self):
            return False

        def fp16_enabled(self):
            return False

    d = describe(DeepSpeedEngine())
    assert d["api"] == "deepspeed" and d["zero_stage"] == 3 and d["overlap_comm"] is False
    assert d["params"] == 20 and d["param_bytes"] == 80 and d["shard_world"] == 2
    assert d["offload"] is None and d["mixed_precision"] is None and d["stage3_prefetch_bucket_size"] == 5e7


def test_exposed_comm_deepspeed_without_overlap_comm_says_so_in_its_config():
    cfg = {"api": "deepspeed", "units": None, "devices": ["cuda"], "zero_stage": 3, "overlap_comm": False,
           "param_bytes": 400 * MiB, "param_dtypes": ["float32"]}
    big = {"all_gather": [10, 0.02, 10 * 40 * MiB], "reduce_scatter": [5, 0.01, 5 * 40 * MiB]}
    ev = evidence(srank(0, cfg, step=0.2, wait=0.03, kinds=big), srank(1, cfg, step=0.2, wait=0.031, kinds=big))
    (f,) = run_check("sharded.exposed-comm", ev)
    assert f.severity is Severity.WARNING and f.evidence["causes"][0] == "no_prefetch"
    assert '"overlap_comm": true' in f.snippet and "DeepSpeed" in f.fix


def test_exposed_comm_under_accelerate_speaks_its_fsdp_plugin():
    from diag.evidence import FrameworkInfo

    cfg = fsdp2_cfg(units=98)
    tiny = {"all_gather": [194, 0.24, 194 * 1100], "reduce_scatter": [97, 0.16, 97 * 1100]}
    ev = evidence(srank(0, cfg, step=0.55, wait=0.40, kinds=tiny), srank(1, cfg, step=0.55, wait=0.41, kinds=tiny))
    ev.ranks[0].framework = FrameworkInfo(name="accelerate")
    (f,) = run_check("sharded.exposed-comm", ev)
    assert f.evidence["knob"] == "fsdp.unit-size" and f.evidence["framework"] == "accelerate"
    assert "fsdp_transformer_layer_cls_to_wrap" in f.snippet


def test_fsdp1_configuration_is_recorded(tmp_path, monkeypatch):
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.fsdp import BackwardPrefetch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    import diag

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "sharded-test")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 1))
        model = FSDP(inner, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}), device_id=torch.device("cpu"),
                     backward_prefetch=BackwardPrefetch.BACKWARD_POST, forward_prefetch=True)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        with diag.watch() as run:
            for _ in range(3):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
                opt.zero_grad()
    finally:
        dist.destroy_process_group()
    f = run.evidence.primary.distributed["fsdp"]
    assert f["api"] == "fsdp1" and f["units"] == 4                 # the wrapper and its 3 Linears
    assert f["backward_prefetch"] == "BACKWARD_POST" and f["forward_prefetch"] is True
    assert f["limit_all_gathers"] is True and f["cpu_offload"] is False and f["mixed_precision"] is None
    assert f["sharding_strategy"] == "NO_SHARD"                    # what FSDP1 makes of one rank
    assert f["params"] == 8 * 8 + 8 + 8 * 8 + 8 + 8 + 1


def test_persistent_memory_counts_a_dtensor_parameter_at_its_local_shard():
    """FSDP2's parameters and optimizer states are DTensors: the memory probe counts this rank's
    shard (its local tensor), not the global size the DTensor reports."""
    torch = pytest.importorskip("torch")
    from diag.probe.memory import MemoryProbe

    class Shard:          # what the probe reads of a DTensor: its local tensor
        def __init__(self, full, local):
            self._local_tensor = local
            self.device = full.device
            self.grad = None

        def numel(self):
            return 10 ** 9     # the global size: never what a rank holds

    full = torch.zeros(64, 64)
    local = torch.zeros(32, 64)

    class Model:
        def parameters(self):
            return [Shard(full, local)]

        def buffers(self):
            return []

    probe = MemoryProbe()
    probe._model = lambda ctx: Model()
    probe._optimizers = lambda: []
    got = probe._persistent(None)
    assert got["params"] == local.numel() * local.element_size()
