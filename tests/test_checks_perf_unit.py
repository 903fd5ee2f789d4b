"""The performance checklist's CPU-observable logic on hand-built Evidence: thresholds, skipped
reasons, evidence numbers, fixes. (End-to-end runs of real scripts: test_checks_perf_corpus.py;
CUDA-shaped evidence: test_checks_perf_cuda.py.)"""
from __future__ import annotations

import pytest

from diag.evidence import DataLoaderInfo, Evidence, ForwardSite, ModelInfo, OptimizerInfo, RankEvidence, StepRecord
from diag.findings import Severity
from diag.registry import Registry

NEW_IDS = {"amp.unused", "amp.fp16-without-scaler", "amp.availability", "dataloader.workers",
           "dataloader.pin-memory", "dataloader.persistent-workers", "dataloader.main-thread-data",
           "eval.no-grad", "parallel.data-parallel", "ddp.no-sync-accumulation", "ddp.find-unused-parameters",
           "cudnn.benchmark", "optim.zero-grad", "optim.foreach-fused", "sync.host-device",
           "tensor-cores.alignment", "matmul.tf32", "debug.anomaly-detection", "compile.unused"}


def run(cid, ev):
    reg = Registry.discover().select([cid])
    return [f for f in reg.run(ev) if f.id == cid]


def sev(cid, ev):
    return [f.severity for f in run(cid, ev)]


def cpu_run(n=20, total=0.02, data=0.0, fwd=0.006, bwd=0.008, opt=0.002, gap=None, autocast=None,
            extras=None, optimizers=None, loaders=None, wrappers=(), epochs=None, n_backward=1,
            step_extra=None, world_size=1, distributed=None, amp=None) -> Evidence:
    other = max(total - data - fwd - bwd - opt, 0.0)
    steps = []
    for i in range(n):
        extra = {"pre_forward_s": gap if gap is not None else other / 4}
        extra.update(step_extra or {})
        steps.append(StepRecord(index=i + 1, total_s=total, data_s=data, forward_s=fwd, backward_s=bwd,
                                optimizer_s=opt, other_s=other, n_forward=n_backward, n_backward=n_backward,
                                epoch=epochs[i] if epochs else None, extra=dict(extra)))
    r = RankEvidence(steps=steps, world_size=world_size,
                     models=[ModelInfo(id=1, cls="Net", wrappers=list(wrappers), params_trainable=1000,
                                       param_bytes=4000, dtypes=["float32"], devices=["cpu"])],
                     forwards=[ForwardSite(key="s1", model=1, module="Net", count=n, training=True,
                                           grad_enabled=True, output_requires_grad=True, in_step=True,
                                           autocast=autocast, autocast_device="cpu" if autocast else None,
                                           location={"file": "/w/train.py", "line": 30, "function": "main"})],
                     optimizers=optimizers or [], dataloaders=loaders or [])
    r.step_stats.count = r.step_stats.timed = n
    r.extras = {"perf": {"cpu_capability": "AVX2"}, "debug": {"steps": n, "anomaly_steps": 0, "profiler_steps": 0}}
    r.extras.update(extras or {})
    if distributed is not None:
        r.distributed = distributed
    if amp is not None:
        r.amp = amp
    ev = Evidence()
    ev.ranks.append(r)
    ev.run.status = "completed"
    ev.environment.cpu_count = 8
    ev.environment.torch = "2.13.0+cpu"
    ev.environment.anomaly_detection = False
    return ev


def test_every_check_of_the_checklist_is_registered_with_docs_and_needs():
    specs = {s.id: s for s in Registry.discover().specs}
    assert NEW_IDS <= set(specs)
    for cid in NEW_IDS:
        s = specs[cid]
        assert s.docs and s.docs.startswith("https://"), cid
        assert s.needs and s.description, cid


@pytest.mark.parametrize("cid", sorted(NEW_IDS))
def test_every_check_skips_or_judges_an_empty_run_with_a_reason(cid):
    ev = Evidence()
    ev.ranks.append(RankEvidence())
    out = run(cid, ev)
    assert out, cid
    for f in out:
        assert f.severity is not Severity.CRASHED, f.message
        if f.severity is Severity.SKIPPED:
            assert len(f.message) > 20          # a reason, not a silent pass


@pytest.mark.parametrize("cid", sorted(NEW_IDS - {"amp.availability", "compile.unused"}))
def test_gpu_checks_on_a_cpu_run_never_warn(cid):
    """A clean CPU run: the CUDA-only checks are skipped with their reason, the others pass."""
    ev = cpu_run(optimizers=[OptimizerInfo(id=1, cls="SGD", steps=20, zero_grad_calls=20, zero_grad_set_to_none=True)],
                 extras={"optimizers": {"1": {"device": "cpu", "effective_foreach": False}}})
    for f in run(cid, ev):
        assert f.severity in (Severity.PASS, Severity.SKIPPED), (cid, f.message)


# ---- dataloader.main-thread-data --------------------------------------------------------------------

@pytest.mark.parametrize("gap,expected", [(0.001, Severity.PASS), (0.0019, Severity.PASS), (0.0025, Severity.WARNING),
                                          (0.0059, Severity.WARNING), (0.0061, Severity.ERROR)])
def test_main_thread_data_thresholds(gap, expected):
    f = run("dataloader.main-thread-data", cpu_run(gap=gap))[0]
    assert f.severity is expected
    assert f.evidence["pre_forward_share"] == pytest.approx(gap / 0.02, abs=1e-4)


def test_main_thread_data_without_dataloader_says_hand_made_and_points_at_forward():
    f = run("dataloader.main-thread-data", cpu_run(gap=0.01))[0]
    assert "no DataLoader" in f.message and "Dataset" in f.snippet and f.location.line == 30


def test_main_thread_data_with_dataloader_says_between_loader_and_forward():
    ev = cpu_run(gap=0.01, data=0.001, loaders=[DataLoaderInfo(id=1, num_workers=4, batches=20)])
    f = run("dataloader.main-thread-data", ev)[0]
    assert "between the DataLoader and the forward" in f.message and "collate" in f.snippet


def test_main_thread_data_skipped_without_measurement():
    ev = cpu_run()
    for s in ev.primary.steps:
        s.extra = {}
    ev.primary.extras = {}
    out = run("dataloader.main-thread-data", ev)
    assert out[0].severity is Severity.SKIPPED and "perf probe extension" in out[0].message


# ---- dataloader.persistent-workers ------------------------------------------------------------------

def _loader(persistent=False, workers=2, epochs=4, firsts=(0.09, 0.08, 0.085, 0.08), batches=40, wait=None):
    steady = 0.001 * (batches - len(firsts))
    return DataLoaderInfo(id=1, num_workers=workers, persistent_workers=persistent, batch_size=32, epochs=epochs,
                          batches=batches, first_batch_s=list(firsts), wait_s=wait if wait is not None else
                          sum(firsts) + steady, location={"file": "/w/train.py", "line": 12, "function": "main"})


def test_persistent_workers_measures_respawn_per_epoch():
    # 10 batches per epoch x 20 ms steps = 200 ms epochs; re-spawn 80 ms - 1 ms steady = 79 ms -> 40%
    f = run("dataloader.persistent-workers", cpu_run(loaders=[_loader()]))[0]
    assert f.severity is Severity.WARNING
    assert f.evidence["respawn_cost_per_epoch_s"] == pytest.approx(0.079, abs=1e-3)
    assert f.evidence["share_of_epoch"] == pytest.approx(0.079 / 0.2, abs=0.01)
    assert "persistent_workers=True" in f.snippet and f.location.line == 12


def test_persistent_workers_small_cost_is_info_and_tiny_passes():
    firsts = (0.05, 0.004, 0.004, 0.004)         # 3 ms of 200 ms: 1.5% -> info
    assert sev("dataloader.persistent-workers", cpu_run(loaders=[_loader(firsts=firsts)])) == [Severity.INFO]
    firsts = (0.05, 0.0015, 0.0015, 0.0015)
    assert sev("dataloader.persistent-workers", cpu_run(loaders=[_loader(firsts=firsts)])) == [Severity.PASS]


@pytest.mark.parametrize("loader,needle", [
    (None, "No DataLoader"), (_loader(workers=0), "num_workers=0"),
    (_loader(epochs=1, firsts=(0.09,)), "second epoch")])
def test_persistent_workers_skipped_with_reasons(loader, needle):
    out = run("dataloader.persistent-workers", cpu_run(loaders=[loader] if loader else []))
    assert out[0].severity is Severity.SKIPPED and needle in out[0].message


def test_persistent_workers_on_passes():
    assert sev("dataloader.persistent-workers", cpu_run(loaders=[_loader(persistent=True)])) == [Severity.PASS]


# ---- dataloader.workers refinements -----------------------------------------------------------------

def test_workers_leave_out_epoch_start_steps_with_workers():
    # every 4th step waits 60 ms for the workers to start; the other steps wait nothing
    epochs = [i // 4 + 1 for i in range(20)]
    ev = cpu_run(epochs=epochs, loaders=[_loader(workers=2, epochs=5, batches=20)])
    for s in ev.primary.steps:
        if s.index > 1 and epochs[s.index - 1] != epochs[s.index - 2]:
            s.data_s, s.total_s = 0.06, 0.08
    f = run("dataloader.workers", ev)[0]
    assert f.severity is Severity.PASS and f.evidence["data_share"] == 0.0


def test_workers_zero_workers_counts_every_step_and_predicts_the_step():
    ev = cpu_run(total=0.04, data=0.03, fwd=0.004, bwd=0.004, opt=0.001, loaders=[_loader(workers=0, batches=20)])
    f = run("dataloader.workers", ev)[0]
    # 1.5 x 30 ms / 10 ms -> 5 workers; the model trains on the CPU, so the workers share its 8 cores
    # with the compute: capped at half of them (issue 12, class 9); 4 still feed a batch every 7.5 ms
    assert f.severity is Severity.ERROR and f.evidence["recommended_workers"] == 4
    assert f.evidence["cpu_training"] is True and "pin_memory" not in (f.snippet or "")
    assert f.evidence["predicted_step_s"] == pytest.approx(0.01, abs=1e-3)
    assert f.evidence["predicted_speedup"] == pytest.approx(4.0, abs=0.1)
    assert "to about 10.0 ms" in f.fix


# ---- eval.no-grad refinement ------------------------------------------------------------------------

def test_eval_no_grad_reports_graph_bytes_and_a_one_line_fix():
    ev = cpu_run(extras={"eval_graph": {"s2": {"bytes": 3 * (1 << 20), "nodes": 40, "measured": 3,
                                               "code": "acc = (model(val).argmax(1) == y).float().mean()"}}})
    ev.primary.forwards.append(ForwardSite(key="s2", model=1, module="Net", count=7, training=False,
                                           grad_enabled=True, output_requires_grad=True,
                                           location={"file": "/w/train.py", "line": 47, "function": "main"}))
    f = run("eval.no-grad", ev)[0]
    assert f.severity is Severity.WARNING
    assert f.evidence["graph_bytes_per_forward"] == 3 * (1 << 20) and "3.0 MiB" in f.message
    assert f.fix.startswith("train.py:47: run `acc = (model(val)")
    assert f.snippet == "with torch.inference_mode():\n    acc = (model(val).argmax(1) == y).float().mean()"
    assert f.evidence["graph_to_weights_ratio"] == pytest.approx(3 * (1 << 20) / 4000, rel=1e-3)


# ---- amp.fp16-without-scaler ------------------------------------------------------------------------

@pytest.mark.parametrize("amp,expected,needle", [
    ({}, Severity.WARNING, "no GradScaler was created"),
    ({"scaler": {"created": 1, "enabled": False, "scale_calls": 20}}, Severity.WARNING, "enabled=False"),
    ({"scaler": {"created": 1, "enabled": True, "scale_calls": 0}}, Severity.WARNING, "never called"),
    ({"scaler": {"created": 1, "enabled": True, "scale_calls": 20, "step_calls": 20}}, Severity.PASS, "scaled"),
])
def test_fp16_without_scaler_cases(amp, expected, needle):
    f = run("amp.fp16-without-scaler", cpu_run(autocast="float16", amp=amp))[0]
    assert f.severity is expected and needle in f.message
    if expected is Severity.WARNING:
        assert 'GradScaler("cpu")' in f.snippet


def test_fp16_without_scaler_passes_for_bf16_and_fp32():
    assert sev("amp.fp16-without-scaler", cpu_run(autocast="bfloat16")) == [Severity.PASS]
    assert sev("amp.fp16-without-scaler", cpu_run()) == [Severity.PASS]


def test_amp_availability_on_cpu_explains_skips():
    f = run("amp.availability", cpu_run())[0]
    assert f.severity is Severity.INFO and "No CUDA device" in f.message and "AVX2" in f.message
    assert sev("amp.unused", cpu_run())[0] is Severity.SKIPPED


# ---- optim.zero-grad --------------------------------------------------------------------------------

def _opt(set_to_none, calls=20, secs=0.0):
    return [OptimizerInfo(id=1, cls="SGD", steps=20, zero_grad_calls=calls, zero_grad_set_to_none=set_to_none,
                          zero_grad_s=secs)]


def test_zero_grad_share_decides_severity():
    f = run("optim.zero-grad", cpu_run(optimizers=_opt(False, secs=20 * 0.0001)))[0]     # 0.5% of 20 ms
    assert f.severity is Severity.INFO and f.evidence["share_of_step"] == pytest.approx(0.005)
    f = run("optim.zero-grad", cpu_run(optimizers=_opt(False, secs=20 * 0.001)))[0]      # 5%
    assert f.severity is Severity.WARNING and "set_to_none=True" in f.snippet


def test_zero_grad_module_variant_and_clean_and_skipped():
    mz = {"calls": 20, "set_to_none_false": 20, "s": 0.02,
          "location": {"file": "/w/train.py", "line": 40, "function": "main"}}
    f = run("optim.zero-grad", cpu_run(extras={"module_zero_grad": mz}))[0]
    assert f.severity is Severity.WARNING and "model.zero_grad" in f.message and f.location.line == 40
    assert sev("optim.zero-grad", cpu_run(optimizers=_opt(True))) == [Severity.PASS]
    assert sev("optim.zero-grad", cpu_run()) == [Severity.SKIPPED]


# ---- debug.anomaly-detection ------------------------------------------------------------------------

def test_anomaly_and_profiler():
    where = {"file": "/w/train.py", "line": 5, "function": "<module>"}
    ev = cpu_run(extras={"debug": {"steps": 20, "anomaly_steps": 20, "profiler_steps": 0, "anomaly_location": where}})
    f = run("debug.anomaly-detection", ev)[0]
    assert f.severity is Severity.WARNING and f.location.line == 5 and "20 of 20" in f.message
    ev = cpu_run(extras={"debug": {"steps": 100, "anomaly_steps": 0, "profiler_steps": 5}})
    assert sev("debug.anomaly-detection", ev) == [Severity.INFO]        # a profiling window
    ev = cpu_run(extras={"debug": {"steps": 100, "anomaly_steps": 0, "profiler_steps": 90}})
    assert sev("debug.anomaly-detection", ev) == [Severity.WARNING]
    assert sev("debug.anomaly-detection", cpu_run()) == [Severity.PASS]


def test_anomaly_from_environment_when_extension_missing():
    ev = cpu_run()
    ev.primary.extras = {}
    ev.environment.anomaly_detection = True
    assert sev("debug.anomaly-detection", ev) == [Severity.WARNING]


# ---- compile.unused ---------------------------------------------------------------------------------

def _stopped(ev):
    """A run diag stopped at its step limit: its whole length is unknown (compile.unused may advise)."""
    ev.run.status, ev.run.stop_reason = "stopped", "--steps 20 reached"
    return ev


def test_compile_unused_info_states_break_even():
    from diag.checks.tuning import _two_figures

    f = run("compile.unused", _stopped(cpu_run()))[0]
    assert f.severity is Severity.INFO
    # forward+backward 14 of 20 ms; saving = 20 - 20 / (1/(0.3 + 0.7/1.43)) ms
    saving = 0.02 - 0.02 * (0.3 + 0.7 / 1.43)
    assert f.evidence["expected_saving_per_step_s"] == pytest.approx(saving, abs=1e-6)
    assert f.evidence["break_even_steps"] == _two_figures(int(60 / saving) + 1) == 14000
    assert "this run was stopped after 20" in f.message
    # a run that ended by itself in fewer steps than the break-even: compile would not pay off (issue 33)
    ev = cpu_run()
    ev.run.status = "completed"
    f = run("compile.unused", ev)[0]
    assert f.severity is Severity.PASS and "need not be for this run" in f.message


def test_compile_unused_speaks_the_trainers_switch_under_transformers():
    """A Hugging Face Trainer user compiles through TrainingArguments(torch_compile=True), not by
    wrapping a model the Trainer builds around; plain PyTorch keeps torch.compile(model)."""
    from diag.evidence import FrameworkInfo

    ev = _stopped(cpu_run())
    ev.primary.framework = FrameworkInfo(name="transformers", version="5", entry=None)
    f = run("compile.unused", ev)[0]
    assert f.severity == Severity.INFO
    assert "TrainingArguments(torch_compile=True)" in f.fix and "torch_compile=True" in f.snippet
    assert "torch.compile(model)" in run("compile.unused", _stopped(cpu_run()))[0].fix


def test_compile_unused_says_data_first_and_passes_when_compiled():
    f = run("compile.unused", _stopped(cpu_run(data=0.012, fwd=0.003, bwd=0.003)))[0]
    assert "fix the data pipeline first" in f.message
    assert sev("compile.unused", cpu_run(wrappers=["compiled"])) == [Severity.PASS]
    assert sev("compile.unused", cpu_run(extras={"compile": {"calls": 1, "models": [1]}})) == [Severity.PASS]


# ---- parallelism ------------------------------------------------------------------------------------

def test_data_parallel_on_cpu_is_info():
    f = run("parallel.data-parallel", cpu_run(wrappers=["DataParallel"],
                                              extras={"data_parallel": {"1": {"device_ids": []}}}))[0]
    assert f.severity is Severity.INFO and "no GPU" in f.message
    assert sev("parallel.data-parallel", cpu_run()) == [Severity.PASS]


def _ddp(find_unused=True, unused=0, checked=3):
    return {"ddp": {"models": [{"model": 1, "find_unused_parameters": find_unused, "params": 4,
                                "unused_params": unused, "unused_names": ["head.bias"] if unused else [],
                                "forwards_checked": checked}],
                    "forwards_sync": 80, "forwards_no_sync": 0},
            "comm": {"grad_sync_wait_s": 0.08, "steps": 20}}


def test_ddp_checks_skip_without_ddp():
    for cid in ("ddp.no-sync-accumulation", "ddp.find-unused-parameters"):
        out = run(cid, cpu_run())
        assert out[0].severity is Severity.SKIPPED and "single-process" in out[0].message


def test_no_sync_accumulation_counts_avoidable_allreduces():
    ev = cpu_run(wrappers=["DistributedDataParallel"], n_backward=4, step_extra={"ddp_sync": 4, "ddp_no_sync": 0},
                 distributed=_ddp(), world_size=2)
    f = run("ddp.no-sync-accumulation", ev)[0]
    assert f.severity is Severity.WARNING
    assert f.evidence["avoidable_allreduces_per_step"] == 3
    # 0.08 s over 80 synced forwards = 1 ms per all-reduce; 3 per step of 20 ms -> 15%
    assert f.evidence["avoidable_share"] == pytest.approx(0.15)
    assert "no_sync()" in f.snippet


def test_no_sync_accumulation_single_rank_small_is_info_and_clean_passes():
    dist = _ddp()
    dist["comm"]["grad_sync_wait_s"] = 0.0008        # 10 us per all-reduce
    ev = cpu_run(wrappers=["DistributedDataParallel"], n_backward=4, step_extra={"ddp_sync": 4}, distributed=dist)
    assert sev("ddp.no-sync-accumulation", ev) == [Severity.INFO]
    ev = cpu_run(wrappers=["DistributedDataParallel"], n_backward=4, step_extra={"ddp_sync": 1, "ddp_no_sync": 3},
                 distributed=_ddp(), world_size=2)
    assert sev("ddp.no-sync-accumulation", ev) == [Severity.PASS]
    ev = cpu_run(wrappers=["DistributedDataParallel"], distributed=_ddp(), world_size=2)
    assert sev("ddp.no-sync-accumulation", ev) == [Severity.PASS]     # one backward per step


def test_find_unused_parameters():
    ev = cpu_run(wrappers=["DistributedDataParallel"], distributed=_ddp())
    f = run("ddp.find-unused-parameters", ev)[0]
    assert f.severity is Severity.WARNING and "find_unused_parameters=False" in f.fix
    assert sev("ddp.find-unused-parameters", cpu_run(wrappers=["DistributedDataParallel"],
                                                     distributed=_ddp(unused=1))) == [Severity.PASS]
    assert sev("ddp.find-unused-parameters", cpu_run(wrappers=["DistributedDataParallel"],
                                                     distributed=_ddp(find_unused=False))) == [Severity.PASS]
    out = run("ddp.find-unused-parameters", cpu_run(wrappers=["DistributedDataParallel"],
                                                    distributed=_ddp(checked=0)))
    assert out[0].severity is Severity.SKIPPED


def test_main_thread_data_error_must_hold_on_three_steps_in_four():
    """One median past 30% is not an error when most steps are under it (the run's own spread)."""
    ev = cpu_run(n=7, gap=0.007)
    for s in ev.primary.steps[5:]:
        s.extra["pre_forward_s"] = 0.001          # 5% of the step on two of the six after the first
    f = run("dataloader.main-thread-data", ev)[0]
    assert f.evidence["pre_forward_share"] == pytest.approx(0.35, abs=1e-4)
    assert f.severity is Severity.WARNING
    held = run("dataloader.main-thread-data", cpu_run(n=7, gap=0.007))[0]
    assert held.severity is Severity.ERROR


def test_main_thread_data_leaves_out_the_probes_own_time():
    """A step whose gap is the probe's own work (its one-off bookkeeping) is not the script's."""
    ev = cpu_run(n=5, gap=0.0061)
    for s in ev.primary.steps:
        s.probe_s = 0.006                         # the gap less the probe's time: 0.1 ms
    f = run("dataloader.main-thread-data", ev)[0]
    assert f.severity is Severity.PASS and f.evidence["pre_forward_s"] == pytest.approx(0.0001, abs=1e-6)


@pytest.mark.parametrize("n,expected", [(2, Severity.INFO), (3, Severity.ERROR)])
def test_main_thread_data_on_too_few_steps_is_info_and_says_why(n, expected):
    f = run("dataloader.main-thread-data", cpu_run(n=n, gap=0.01))[0]
    assert f.severity is expected
    assert ("too few" in f.message) is (expected is Severity.INFO)


@pytest.mark.parametrize("n,expected", [(2, Severity.INFO), (3, Severity.WARNING)])
def test_dataloader_workers_on_too_few_steps_is_info_and_says_why(n, expected):
    # 8 ms a step: three steps wait 24 ms, more than starting a worker takes (the rule below)
    ev = cpu_run(n=n, total=0.04, data=0.008,
                 loaders=[DataLoaderInfo(id=1, num_workers=0, batches=n, batch_size=32)])
    fs = [f for f in run("dataloader.workers", ev) if f.severity is not Severity.PASS]
    assert fs and fs[0].severity is expected, [(f.severity, f.message) for f in run("dataloader.workers", ev)]
    assert ("too few" in fs[0].message) is (expected is Severity.INFO)


@pytest.mark.parametrize("batches,expected", [(4, Severity.INFO), (200, Severity.WARNING)])
def test_dataloader_workers_on_a_run_too_short_to_pay_for_a_worker_is_info(batches, expected):
    # the short script of tests/test_optimizer_census.py on a loaded machine: 0.8 ms of a 3 ms step, 4 batches.
    # Its 3.2 ms of waiting in all is less than a worker's start (36-44 ms measured), and its share crosses the
    # line with the machine's load: not a warning. The same wait over 200 batches is one.
    ev = cpu_run(n=min(batches, 20), total=0.003, data=0.0008, fwd=0.0005, bwd=0.001, opt=0.0003,
                 loaders=[DataLoaderInfo(id=1, num_workers=0, batches=batches, batch_size=64)])
    ev.run.status = "completed"
    (f,) = [f for f in run("dataloader.workers", ev) if f.severity is not Severity.PASS]
    assert f.severity is expected, f.message
    assert ("cannot pay for themselves" in f.message) is (expected is Severity.INFO)
    assert f.evidence["run_wait_at_stake_s"] == pytest.approx(0.0008 * batches, rel=0.01)


@pytest.mark.parametrize("dataset_len,expected", [(256, Severity.INFO), (64 * 200, Severity.WARNING),
                                                  (None, Severity.WARNING)])
def test_a_run_diag_stopped_is_judged_on_a_whole_epoch_not_on_the_batches_it_saw(dataset_len, expected):
    # `diag check --steps 4` cut the script: its own run goes on, at least to the epoch's end
    ev = cpu_run(n=4, total=0.003, data=0.0008, fwd=0.0005, bwd=0.001, opt=0.0003,
                 loaders=[DataLoaderInfo(id=1, num_workers=0, batches=4, batch_size=64, dataset_len=dataset_len)])
    ev.run.status, ev.run.stop_reason = "stopped", "--steps 4 reached"
    (f,) = [f for f in run("dataloader.workers", ev) if f.severity is not Severity.PASS]
    assert f.severity is expected, f.message
    at_stake = f.evidence["run_wait_at_stake_s"]
    assert at_stake == (None if dataset_len is None else pytest.approx(0.0008 * max(4, dataset_len // 64)))
