"""The CUDA-only conditions of the performance checklist, on hand-built Evidence.

This machine has no GPU, so these Evidence objects are written by hand in the shape a CUDA run
produces: the probe records the device in ``environment.devices`` (name, capability), the model's
parameters on ``cuda:0`` in ``ModelInfo.devices``, autocast per forward site, the optimizer's
parameter device in ``extras.optimizers``, the sync debug-mode window in ``sync`` and host-to-device
copies in ``extras.copies`` (see diag/probe/perf/ and docs/performance-checks.md for the fields).
Each check is tested on a planted variant (it must fire) and a clean variant (it must not).
"""
from __future__ import annotations

import pytest

from diag.evidence import (DataLoaderInfo, DeviceInfo, Evidence, ForwardSite, ModelInfo, OptimizerInfo,
                           RankEvidence, StepRecord)
from diag.findings import Severity
from diag.registry import Registry

A100 = DeviceInfo(index=0, name="NVIDIA A100-SXM4-80GB", type="cuda", capability=[8, 0],
                  total_memory=80 * (1 << 30), multi_processor_count=108)
V100 = DeviceInfo(index=0, name="Tesla V100-SXM2-16GB", type="cuda", capability=[7, 0],
                  total_memory=16 * (1 << 30), multi_processor_count=80)
P100 = DeviceInfo(index=0, name="Tesla P100-PCIE-16GB", type="cuda", capability=[6, 0])


def run(cid, ev):
    reg = Registry.discover().select([cid])
    return [f for f in reg.run(ev) if f.id == cid]


def sev(cid, ev):
    return [f.severity for f in run(cid, ev)]


def cuda_run(device=A100, autocast=None, dtypes=("float32",), fwd=0.008, bwd=0.012, data=0.001,
             opt=0.002, other=0.002, n=20, layers=None, module_types=None, env=None, extras=None,
             sync=None, loaders=None, optimizers=None, wrappers=(), shapes=((64, 3, 224, 224),),
             param_bytes=4 * 25_000_000) -> Evidence:
    """A CUDA training run as the probe records it: a model on cuda:0, ``n`` steps."""
    ev = Evidence()
    ev.run.status = "completed"
    e = ev.environment
    e.cuda, e.cuda_available, e.device_count, e.devices = "12.4", True, 1, [device]
    e.cpu_count, e.torch = 16, "2.13.0+cu124"
    e.cudnn_benchmark, e.cudnn_deterministic = False, False
    e.float32_matmul_precision, e.allow_tf32_matmul, e.allow_tf32_cudnn = "highest", False, True
    e.anomaly_detection = False
    for k, v in (env or {}).items():
        setattr(e, k, v)
    total = fwd + bwd + data + opt + other
    steps = [StepRecord(index=i + 1, total_s=total, data_s=data, forward_s=fwd, backward_s=bwd,
                        optimizer_s=opt, other_s=other, n_forward=1, n_backward=1, samples=64,
                        extra={"pre_forward_s": other / 2}) for i in range(n)]
    model = ModelInfo(id=1, cls="ResNet", wrappers=list(wrappers), params_total=25_000_000,
                      params_trainable=25_000_000, param_bytes=param_bytes, dtypes=list(dtypes),
                      devices=["cuda:0"], module_types=module_types or {"ResNet": 1, "Linear": 1},
                      layer_shapes=layers or [{"type": "Linear", "in": 2048, "out": 1000}])
    site = ForwardSite(key="s1", model=1, module="ResNet", count=n, training=True, grad_enabled=True,
                       autocast=autocast, autocast_device="cuda" if autocast else None,
                       output_requires_grad=True, in_step=True, first_step=1,
                       input_shapes=[list(s) for s in shapes[:1]], input_dtypes=["float32"],
                       location={"file": "/home/u/train.py", "line": 88, "function": "train"})
    r = RankEvidence(steps=steps, models=[model], forwards=[site],
                     optimizers=optimizers or [OptimizerInfo(id=1, cls="AdamW", steps=n, zero_grad_calls=n,
                                                             zero_grad_set_to_none=True)],
                     dataloaders=loaders or [])
    r.step_stats.count = r.step_stats.timed = n
    r.extras = {"perf": {"cpu_capability": "AVX512"}, "debug": {"steps": n, "anomaly_steps": 0,
                                                                "profiler_steps": 0}}
    r.extras.update(extras or {})
    if sync is not None:
        r.sync = sync
    ev.ranks.append(r)
    return ev


# ---- amp.unused -------------------------------------------------------------------------------------

def test_amp_unused_fp32_on_ampere_recommends_bf16_and_bounds_gain():
    f = run("amp.unused", cuda_run())[0]
    assert f.severity is Severity.WARNING
    assert f.evidence["recommended_dtype"] == "bfloat16" and "bfloat16" in f.snippet
    # forward+backward = 20 of 25 ms: Amdahl at the A100's bf16/fp32 peak ratio (312 / 19.5 = 16x)
    # -> 1 / (0.2 + 0.8/16) = 4.0x, an upper bound (no FLOPs counted: no low end)
    assert f.evidence["max_step_speedup"] == pytest.approx(4.0, abs=0.01)
    assert f.evidence["min_step_speedup"] is None and "at most 4.0x faster, an upper bound" in f.message
    assert "16.0x (the catalogue's bf16/fp32 dense peak ratio on a100-80gb)" in f.message
    assert "GradScaler" not in f.snippet and f.location.line == 88


def test_amp_unused_volta_recommends_fp16_with_scaler():
    f = run("amp.unused", cuda_run(device=V100))[0]
    assert f.evidence["recommended_dtype"] == "float16" and "GradScaler" in f.snippet


def test_amp_unused_info_when_step_is_data_bound():
    f = run("amp.unused", cuda_run(fwd=0.002, bwd=0.002, data=0.05))[0]
    assert f.severity is Severity.INFO and f.evidence["forward_backward_share"] < 0.3


@pytest.mark.parametrize("kw", [dict(autocast="bfloat16"), dict(dtypes=("bfloat16",)), dict(device=P100)])
def test_amp_unused_clean(kw):
    assert sev("amp.unused", cuda_run(**kw)) == [Severity.PASS]


# ---- matmul.tf32 ------------------------------------------------------------------------------------

def test_tf32_off_on_ampere_fires():
    f = run("matmul.tf32", cuda_run())[0]
    assert f.severity is Severity.WARNING and "set_float32_matmul_precision" in f.snippet
    assert f.evidence["precision"] == "highest"


@pytest.mark.parametrize("kw", [dict(env={"float32_matmul_precision": "high"}),
                                dict(env={"allow_tf32_matmul": True}), dict(autocast="bfloat16"),
                                dict(device=V100)])
def test_tf32_clean(kw):
    assert sev("matmul.tf32", cuda_run(**kw)) == [Severity.PASS]


# ---- tensor-cores.alignment -------------------------------------------------------------------------

def test_alignment_fires_on_big_misaligned_layers_under_amp():
    layers = [{"type": "Embedding", "in": 50257, "out": 768}, {"type": "Linear", "in": 768, "out": 3000},
              {"type": "Linear", "in": 3000, "out": 768}, {"type": "Linear", "in": 768, "out": 50257}]
    f = run("tensor-cores.alignment", cuda_run(autocast="float16", layers=layers))[0]
    assert f.severity is Severity.WARNING
    assert f.evidence["misaligned_layers"] >= 1 and "50304" in f.snippet    # vocab padded to 64


def test_alignment_ignores_small_heads_and_rgb_stem():
    layers = [{"type": "Conv2d", "in": 3, "out": 64}, {"type": "Conv2d", "in": 64, "out": 128},
              {"type": "Linear", "in": 2048, "out": 2048}, {"type": "Linear", "in": 2048, "out": 10}]
    assert sev("tensor-cores.alignment", cuda_run(autocast="bfloat16", layers=layers)) == [Severity.PASS]


def test_alignment_skipped_in_fp32():
    out = run("tensor-cores.alignment", cuda_run())
    assert out[0].severity is Severity.SKIPPED and "fp32" in out[0].message


# ---- cudnn.benchmark --------------------------------------------------------------------------------

CONV = {"ResNet": 1, "Conv2d": 53, "BatchNorm2d": 53, "Linear": 1}


def test_cudnn_benchmark_fires_for_fixed_shapes():
    ev = cuda_run(module_types=CONV, extras={"input_shapes": {"1": {"distinct": 1, "shapes": [[64, 3, 224, 224]]}}})
    f = run("cudnn.benchmark", ev)[0]
    assert f.severity is Severity.WARNING and f.snippet == "torch.backends.cudnn.benchmark = True"
    assert f.evidence["conv_layers"] == 53 and f.evidence["distinct_input_shapes"] == 1


@pytest.mark.parametrize("kw", [
    dict(module_types=CONV, env={"cudnn_benchmark": True}),
    dict(module_types=CONV, extras={"input_shapes": {"1": {"distinct": 16, "capped": True, "shapes": []}}}),
    dict(),                                      # no convolutions
])
def test_cudnn_benchmark_clean(kw):
    assert sev("cudnn.benchmark", cuda_run(**kw)) == [Severity.PASS]


# ---- optim.foreach-fused ----------------------------------------------------------------------------

def _opt_extras(**kw):
    rec = {"id": 1, "cls": "AdamW", "device": "cuda", "params": 161, "param_bytes": 10 ** 8, "foreach": None,
           "fused": None, "effective_foreach": True, "effective_fused": False, "supports_foreach": True,
           "supports_fused": True}
    rec.update(kw)
    return {"optimizers": {"1": rec}}


def test_foreach_off_fires_with_optimizer_share():
    f = run("optim.foreach-fused", cuda_run(opt=0.01, extras=_opt_extras(foreach=False, effective_foreach=False)))[0]
    assert f.severity is Severity.WARNING and "fused=True" in f.snippet
    assert f.evidence["optimizer_share"] == pytest.approx(0.01 / 0.033, abs=1e-3)


def test_foreach_with_big_optimizer_share_hints_fused():
    f = run("optim.foreach-fused", cuda_run(opt=0.02, extras=_opt_extras()))[0]
    assert f.severity is Severity.INFO and "fused=True" in f.snippet


@pytest.mark.parametrize("kw", [dict(), dict(fused=True, effective_fused=True)])
def test_foreach_fused_clean(kw):
    assert sev("optim.foreach-fused", cuda_run(extras=_opt_extras(**kw))) == [Severity.PASS]


def test_foreach_fused_skipped_on_cpu_params():
    assert sev("optim.foreach-fused", cuda_run(extras=_opt_extras(device="cpu"))) == [Severity.SKIPPED]


# ---- sync.host-device -------------------------------------------------------------------------------

def _sync(total, steps=20, sites=None):
    return {"state": "sampled", "mode": "warn", "first_step": 2, "last_step": 1 + steps, "steps": steps,
            "total": total, "per_step": [total // steps] * steps, "sites": sites or []}


def test_sync_every_step_fires_and_points_at_the_line():
    sites = [{"file": "/home/u/train.py", "line": 95, "function": "train", "code": "losses.append(loss.item())",
              "count": 20},
             {"file": "/home/u/train.py", "line": 80, "function": "train", "code": "x = x.to(device)", "count": 20}]
    f = run("sync.host-device", cuda_run(sync=_sync(40, sites=sites)))[0]
    assert f.severity is Severity.WARNING and f.evidence["syncs_per_step"] == 2.0
    assert f.location.line == 95 and "loss.item()" in f.message


def test_sync_rare_is_info_and_none_passes():
    assert sev("sync.host-device", cuda_run(sync=_sync(2))) == [Severity.INFO]
    assert sev("sync.host-device", cuda_run(sync=_sync(0))) == [Severity.PASS]


def test_sync_not_sampled_is_skipped_with_reason():
    out = run("sync.host-device", cuda_run(sync={"state": "not sampled: the script set sync debug mode 1 itself"}))
    assert out[0].severity is Severity.SKIPPED and "set sync debug mode" in out[0].message


# ---- dataloader.pin-memory ---------------------------------------------------------------------------

def _loader(pin):
    return [DataLoaderInfo(id=1, num_workers=8, pin_memory=pin, batch_size=64, batches=20, epochs=1,
                           location={"file": "/home/u/train.py", "line": 60, "function": "main"})]


def test_pin_memory_unpinned_loader_sized_by_copy_time():
    # 64 x 3 x 224 x 224 fp32 = 38.5 MB per step; at 12 GB/s pageable ~ 3.2 ms of a 23 ms step
    f = run("dataloader.pin-memory", cuda_run(loaders=_loader(False)))[0]
    assert f.severity is Severity.WARNING and "pin_memory=True" in f.snippet
    assert f.evidence["h2d_bytes_per_step"] == 64 * 3 * 224 * 224 * 4
    assert f.evidence["copy_share_of_step"] > 0.05 and f.location.line == 60


def test_pin_memory_pageable_non_blocking_copy_is_located():
    copies = {"h2d_copies": 40, "h2d_bytes": 20 * 1000, "non_blocking_pageable": 20, "non_blocking_pinned": 0,
              "blocking": 20, "steps": 20, "sites": [{"file": "/home/u/train.py", "line": 81, "function": "train",
                                                      "code": "x = x.to(dev, non_blocking=True)", "count": 20}]}
    f = run("dataloader.pin-memory", cuda_run(loaders=_loader(True), extras={"copies": copies}))[0]
    assert f.severity is Severity.INFO          # 1 KB per step: tiny next to the step
    assert f.evidence["non_blocking_pageable_copies"] == 20 and f.location.line == 81


def test_pin_memory_clean():
    copies = {"h2d_copies": 40, "h2d_bytes": 10 ** 6, "non_blocking_pageable": 0, "non_blocking_pinned": 40,
              "blocking": 0, "steps": 20, "sites": []}
    assert sev("dataloader.pin-memory", cuda_run(loaders=_loader(True), extras={"copies": copies})) == [Severity.PASS]


# ---- parallel.data-parallel over several GPUs ---------------------------------------------------------

def test_data_parallel_over_gpus_is_a_warning():
    ev = cuda_run(wrappers=["DataParallel"], extras={"data_parallel": {"1": {"device_ids": ["0", "1", "2", "3"],
                                                                            "output_device": "0"}}})
    ev.environment.device_count = 4
    f = run("parallel.data-parallel", ev)[0]
    assert f.severity is Severity.WARNING and f.evidence["devices"] == 4
    assert "DistributedDataParallel" in f.snippet


def test_amp_availability_lists_device_support():
    f = run("amp.availability", cuda_run(device=V100))[0]
    assert f.severity is Severity.INFO
    s = f.evidence["devices"][0]
    assert s["fp16_tensor_cores"] and not s["bf16"] and not s["tf32"]
    assert "float16" in f.message and "GradScaler" in f.message
