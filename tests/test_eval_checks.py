"""Evaluation runs on hand-built Evidence: run kinds, the eval.* checks (the GPU ones on evidence in the
shape a CUDA run writes), dataloader.workers on an evaluation loader, folding evaluation steps, and the
cost of evaluation against 2·N·D (diag/cost/eval.py)."""
from __future__ import annotations

import math

import pytest

from check_support import run_check
from diag.evidence import Evidence
from diag.findings import Severity
from diag.fold import fold
from diag.testing import EvidenceBuilder

A100 = "NVIDIA A100-SXM4-80GB"


def _eval_run(**model):
    b = EvidenceBuilder().environment(cpu_count=8)
    b.eval_model(**model).dataloader(batch_size=64, role="eval", batches=40, wait_s=0.01, dataset_len=2560)
    return b


# ---- run kinds --------------------------------------------------------------------------------------

def test_run_kinds():
    assert EvidenceBuilder().build().run_kind() == "none"
    assert EvidenceBuilder().model().steps(5).build().run_kind() == "training"
    assert _eval_run().eval_steps(10, samples=64).build().run_kind() == "evaluation"
    b = EvidenceBuilder().model().steps(5)
    ev = b.build()
    from diag.evidence import EvaluationPass

    ev.primary.evaluations.append(EvaluationPass(index=1, after_step=5, time_s=0.2, forwards=3))
    assert ev.run_kind() == "training+evaluation"
    # forwards in train mode with grad on, but no backward and no optimizer: an evaluation done wrong
    ev = EvidenceBuilder().model().build()
    ev.primary.forwards[0].count = 12
    assert ev.run_kind() == "evaluation"


def test_run_no_steps_passes_an_evaluation_run_and_still_fires_for_nothing():
    (f,) = run_check("run.no-steps", _eval_run().eval_steps(10, samples=64).build())
    assert f.severity == Severity.PASS and f.evidence["kind"] == "evaluation"
    (f,) = run_check("run.no-steps", EvidenceBuilder().build())
    assert f.severity == Severity.ERROR


# ---- eval.inference-mode / eval.train-mode ---------------------------------------------------------------

def test_inference_mode_info_under_no_grad_and_pass_under_inference_mode():
    (f,) = run_check("eval.inference-mode", _eval_run(inference_mode=False).eval_steps(8, samples=64).build())
    assert f.severity == Severity.INFO and f.location.line == 20 and f.evidence["forwards"] == 8
    (f,) = run_check("eval.inference-mode", _eval_run().eval_steps(8, samples=64).build())
    assert f.severity == Severity.PASS
    (f,) = run_check("eval.inference-mode", EvidenceBuilder().model().steps(4).build())
    assert f.severity == Severity.SKIPPED


@pytest.mark.parametrize("framework, says", [("lightning", "inference_mode=False"),
                                              ("transformers", "prediction_step()")])
def test_inference_mode_passes_when_the_framework_chose_no_grad(framework, says):
    """Lightning's fit() validates under no_grad on purpose and the Hugging Face Trainer's
    prediction_step() always does, with no switch: telling the user to change their script is wrong."""
    from diag.evidence import FrameworkInfo

    ev = _eval_run(inference_mode=False).eval_steps(8, samples=64).build()
    ev.primary.framework = FrameworkInfo(name=framework, version="1", entry=None)
    (f,) = run_check("eval.inference-mode", ev)
    assert f.severity == Severity.PASS and says in f.message and "Nothing to change" in f.message
    assert f.evidence == {"framework": framework, "forwards": 8}
    ev.primary.framework = FrameworkInfo(name="accelerate", version="1", entry=None)   # the user's own loop
    (f,) = run_check("eval.inference-mode", ev)
    assert f.severity == Severity.INFO


def test_inference_mode_leaves_a_teacher_inside_training_steps_alone():
    # a no_grad forward inside the training steps (a teacher) has no evaluation step: not judged
    b = EvidenceBuilder().model().steps(6)
    ev = b.build()
    from diag.evidence import ForwardSite

    ev.primary.forwards.append(ForwardSite(key="t", model=1, module="Teacher", count=6, training=False,
                                           grad_enabled=False))
    (f,) = run_check("eval.inference-mode", ev)
    assert f.severity == Severity.SKIPPED


def test_train_mode_warns_with_dropout_and_is_info_without():
    ev = _eval_run(training=True, module_types={"Linear": 3, "Dropout": 1, "BatchNorm1d": 2}).eval_steps(
        8, samples=64).build()
    (f,) = run_check("eval.train-mode", ev)
    assert f.severity == Severity.WARNING and f.location.line == 20
    assert f.evidence["layers"] == {"Dropout": 1, "BatchNorm1d": 2}
    assert "model.eval()" in f.fix
    (f,) = run_check("eval.train-mode", _eval_run(training=True, module_types={"Linear": 3}).eval_steps(
        8, samples=64).build())
    assert f.severity == Severity.INFO
    (f,) = run_check("eval.train-mode", _eval_run().eval_steps(8, samples=64).build())
    assert f.severity == Severity.PASS


# ---- small batches, host syncs, data wait -----------------------------------------------------------------

def test_small_batch_warns_over_many_batches_and_respects_the_memory_plan():
    """On a GPU (a CPU evaluation is judged on a measured fixed cost: test_false_alarms.py)."""
    (f,) = run_check("eval.small-batch", _eval_run(device="cuda:0").eval_steps(64, total_s=0.002, samples=1).build())
    assert f.severity == Severity.WARNING and f.evidence["eval_batch"] == 1
    assert f.evidence["samples_per_s"] == pytest.approx(500.0)
    assert "DataLoader batch_size=64" in f.fix and "DataLoader(" in f.snippet
    # batches made by a get_batch-style helper (nanoGPT's estimate_loss): no DataLoader to point at
    b = EvidenceBuilder().environment(cpu_count=8)
    (f,) = run_check("eval.small-batch", b.eval_model(device="cuda:0").eval_steps(64, total_s=0.002, samples=1).build())
    assert f.severity == Severity.WARNING and "DataLoader batch_size" not in f.fix and not f.snippet
    assert "where the evaluation loop makes them" in f.fix
    (f,) = run_check("eval.small-batch", _eval_run(device="cuda:0").eval_steps(8, total_s=0.002, samples=1).build())
    assert f.severity == Severity.PASS            # too few batches to matter
    (f,) = run_check("eval.small-batch", _eval_run(device="cuda:0").eval_steps(64, samples=64).build())
    assert f.severity == Severity.PASS
    ev = _eval_run(device="cuda:0").eval_steps(64, total_s=0.002, samples=4).build()
    ev.memory_plan["verdict"] = {"max_eval_batch": 6}
    (f,) = run_check("eval.small-batch", ev)
    assert f.severity == Severity.PASS            # no memory to spare


def _with_sync_sites(b, calls):
    ev = b.build()
    ev.primary.eval_stats.sync_sites = [{"file": "/w/evaluate.py", "line": 33, "function": "evaluate",
                                         "op": "item", "calls": calls}]
    return ev


def test_host_sync_is_a_warning_on_cuda_and_an_info_on_cpu():
    # the shape a CUDA evaluation run writes: the model on cuda:0, an A100 in the environment
    ev = _with_sync_sites(EvidenceBuilder().cuda_eval(device=A100).eval_steps(20, samples=64, host_syncs=1), 20)
    (f,) = run_check("eval.host-sync", ev)
    assert f.severity == Severity.WARNING and f.location.line == 33 and ".item()" in f.message
    ev = _with_sync_sites(_eval_run().eval_steps(20, samples=64, host_syncs=1), 20)
    (f,) = run_check("eval.host-sync", ev)
    assert f.severity == Severity.INFO
    # one final .item() after the loop is not per batch
    b = _eval_run().eval_steps(19, samples=64).eval_steps(1, samples=64, host_syncs=2)
    (f,) = run_check("eval.host-sync", b.build())
    assert f.severity == Severity.PASS


def test_dataloader_workers_judges_the_evaluation_loader_of_an_evaluation_run():
    ev = _eval_run().eval_steps(20, total_s=0.010, data_s=0.006, samples=64).build()
    (f,) = run_check("dataloader.workers", ev)
    assert f.severity == Severity.ERROR and f.evidence["evaluation"] is True
    assert f.evidence["data_share"] == pytest.approx(0.6) and f.evidence["recommended_workers"] >= 1
    ev = _eval_run().eval_steps(20, total_s=0.010, data_s=0.0002, samples=64).build()
    (f,) = run_check("dataloader.workers", ev)
    assert f.severity == Severity.PASS
    # a handful of batches (`--steps 5`): a median of three sub-millisecond waits is the machine's load
    ev = _eval_run().eval_steps(5, total_s=0.0019, data_s=0.0006, samples=64).build()
    (f,) = run_check("dataloader.workers", ev)
    assert f.severity == Severity.SKIPPED and "too few" in f.message


# ---- AMP for evaluation on a capable GPU ------------------------------------------------------------------

def test_eval_amp_on_cuda_evidence():
    b = EvidenceBuilder().cuda_eval(device=A100, capability=(8, 0)).eval_steps(20, total_s=0.01, data_s=0.001,
                                                                               samples=64)
    (f,) = run_check("eval.amp", b.build())
    assert f.severity == Severity.WARNING and f.evidence["recommended_dtype"] == "bfloat16"
    assert f.evidence["forward_share"] == pytest.approx(0.9)      # everything but the data wait
    # an upper bound at the A100's bf16/fp32 peak ratio (312 / 19.5 = 16x), its basis in the message
    assert f.evidence["max_speedup"] == pytest.approx(1 / (0.1 + 0.9 / 16), rel=1e-3)
    assert "an upper bound" in f.message and "peak ratio" in f.message
    # mostly waiting for data: an info
    (g,) = run_check("eval.amp", EvidenceBuilder().cuda_eval(device=A100).eval_steps(20, total_s=0.01, data_s=0.008,
                                                                                    samples=64).build())
    assert g.severity == Severity.INFO
    assert "GradScaler" not in f.snippet and "bfloat16" in f.snippet
    (f,) = run_check("eval.amp", EvidenceBuilder().cuda_eval(device="Tesla V100-SXM2-16GB", capability=(7, 0))
                     .eval_steps(20, samples=64).build())
    assert f.severity == Severity.WARNING and f.evidence["recommended_dtype"] == "float16"
    (f,) = run_check("eval.amp", EvidenceBuilder().cuda_eval(autocast="bfloat16").eval_steps(20, samples=64).build())
    assert f.severity == Severity.PASS
    (f,) = run_check("eval.amp", EvidenceBuilder().cuda_eval(device="Tesla P100", capability=(6, 0))
                     .eval_steps(20, samples=64).build())
    assert f.severity == Severity.PASS
    (f,) = run_check("eval.amp", _eval_run().eval_steps(20, samples=64).build())
    assert f.severity == Severity.SKIPPED


# ---- folding -------------------------------------------------------------------------------------------

def test_fold_eval_steps_and_syncs():
    ev = Evidence()
    for i in range(1, 5):
        fold(ev, {"kind": "eval_step", "rank": 0, "t": i * 0.01, "index": i, "pass_index": 1, "total_s": 0.01,
                  "data_s": 0.002, "h2d_s": 0.001, "forward_s": 0.005, "other_s": 0.002, "forwards": 1,
                  "samples": 32, "site": "s1", "host_syncs": 1 if i % 2 else 0, "instrumented": i == 3})
    fold(ev, {"kind": "eval_syncs", "rank": 0, "t": 1.0, "sites": [{"file": "e.py", "line": 3, "op": "item",
                                                                   "calls": 2}]})
    r = ev.primary
    st = r.eval_stats
    assert (st.count, st.timed, st.samples, st.steps_with_syncs, st.host_syncs) == (4, 3, 96, 2, 2)
    assert st.total_s == pytest.approx(st.data_s + st.h2d_s + st.forward_s + st.other_s)
    tp = r.eval_throughput()
    assert tp["samples_per_s"] == pytest.approx(96 / 0.03) and tp["batches_per_s"] == pytest.approx(100)
    assert r.eval_stats.sync_sites[0]["line"] == 3
    # the JSON round trip through the validating loader keeps the new sections
    import json

    again = Evidence.from_dict(json.loads(ev.to_json()))
    assert again.primary.eval_stats.count == 4 and again.primary.eval_steps[2].instrumented is True
    assert again.primary.eval_throughput() == tp


# ---- cost ---------------------------------------------------------------------------------------------

def _eval_cost_evidence(flops_per_sample=2 * 1_000_000, rate_samples=6400.0):
    b = _eval_run(params=1_000_000).eval_steps(20, total_s=64 / rate_samples, samples=64)
    ev = b.build()
    ev.primary.flops["eval"] = {"flops": flops_per_sample * 64, "samples": 64, "tokens": None,
                                "params": 1_000_000, "eval_step": 3, "device": "cpu", "device_name": None,
                                "precision": "float32"}
    return ev


def test_eval_cost_measured_throughput_and_2ND():
    from diag.cost.eval import estimate_eval, eval_from_evidence

    m = eval_from_evidence(_eval_cost_evidence())
    assert m.unit == "samples" and m.units_per_s == pytest.approx(6400.0)
    assert m.analytic_per_unit == 2 * 1_000_000            # 2·N per sample
    assert m.ratio_to_analytic == pytest.approx(1.0)
    e = estimate_eval(m, "1M", unit="samples", price="2.5")
    assert e.seconds == pytest.approx(1e6 / 6400.0)
    assert e.analytic_flops == pytest.approx(2 * 1_000_000 * 1e6)   # 2·N·D
    assert e.flops == pytest.approx(e.analytic_flops)
    assert e.cost == pytest.approx(1e6 / 6400.0 / 3600 * 2.5)
    e4 = estimate_eval(m, "1M", unit="samples", count=4)
    assert e4.seconds == pytest.approx(e.seconds / 4) and e4.device_hours == pytest.approx(e.device_hours)


def test_eval_cost_on_another_gpu_uses_measured_flops_at_an_mfu_of_its_peak():
    from diag.cost import load_catalog
    from diag.cost.eval import estimate_eval, eval_from_evidence

    m = eval_from_evidence(_eval_cost_evidence())
    cat = load_catalog(user=False)
    e = estimate_eval(m, "1M", unit="samples", gpu="H100", mfu="0.5", precision="bf16", catalog=cat)
    peak = cat.get("H100").peak_flops("bf16")
    assert e.units_per_s == pytest.approx(peak * 0.5 / (2 * 1_000_000))
    assert e.seconds == pytest.approx(1e6 / e.units_per_s)


def test_eval_cost_errors_are_sentences():
    from diag.cost.estimate import CostError
    from diag.cost.eval import estimate_eval, eval_from_evidence

    with pytest.raises(CostError, match="no evaluation step"):
        eval_from_evidence(EvidenceBuilder().model().steps(4).build())
    m = eval_from_evidence(_eval_cost_evidence())
    with pytest.raises(CostError, match="--eval-samples"):
        estimate_eval(m, "1M", unit="tokens")
    with pytest.raises(CostError):
        estimate_eval(m, "0", unit="samples")


def test_eval_frequency_from_the_runs_own_numbers():
    from diag.cost.eval import eval_frequency
    from diag.evidence import EvaluationPass

    ev = EvidenceBuilder().model().steps(40, total_s=0.1).build()
    for k in range(1, 5):
        ev.primary.evaluations.append(EvaluationPass(index=k, after_step=10 * k, time_s=0.5, forwards=5))
    f = eval_frequency(ev, price="3")
    assert f.every == 10 and f.share == pytest.approx(2.0 / 6.0)
    now = next(r for r in f.rows if r.current)
    assert now.every == 10 and now.eval_s_per_1000_steps == pytest.approx(50.0)
    assert now.share == pytest.approx(50.0 / 150.0)
    twice = next(r for r in f.rows if r.every == 20)
    assert twice.delta_s_per_1000_steps == pytest.approx(-25.0)
    assert twice.delta_cost_per_1000_steps == pytest.approx(-25.0 / 3600 * 3)
    assert eval_frequency(EvidenceBuilder().model().steps(4).build()) is None
    assert not math.isnan(f.step_s)


# ---- the memory plan of an evaluation-only run -----------------------------------------------------------

def test_make_eval_plan_finds_the_largest_evaluation_batch():
    from diag.memory.plan import CUDA_CONTEXT_BYTES, make_eval_plan

    per_sample = 1 << 20            # 1 MiB of activations per sample, 64 MiB of weights

    def evaluate(b):
        return {"mode": "eval", "batch": b, "peak": (64 << 20) + b * per_sample, "uses": {"matmul": True},
                "categories": {}}

    cap = 8 << 30
    plan = make_eval_plan(evaluate, observed_batch=4, capacity=cap, capability=[9, 0])
    assert plan["mode"] == "eval" and plan["max_batch"] is None and plan["status"] == "ok"
    mx = plan["eval"]["max_batch"]
    fits = lambda b: evaluate(b)["peak"] + (32 << 20) + int(((evaluate(b)["peak"] + (32 << 20)) * 0.05)) \
        + CUDA_CONTEXT_BYTES <= int(cap * 0.9)
    assert fits(mx) and not fits(int(mx * 1.02) + 1)     # within the search's precision
    assert plan["at_target"]["batch"] == 4 and plan["eval"]["points"]


def test_memory_eval_batch_on_an_evaluation_only_estimate():
    ev = _eval_run(input_shape=[1, 128]).eval_steps(64, samples=1).build()
    ev.primary.memory["estimate"] = {"status": "ok", "mode": "eval", "observed_batch": 1, "capacity": 80 << 30,
                                     "eval": {"batch": 1, "max_batch": 4096}}
    (f,) = run_check("memory.eval-batch", ev)
    assert f.severity == Severity.INFO and f.evidence["max_eval_batch"] == 4096
    assert f.evidence["train_batch"] is None and "training batch" not in f.message


# ---- the probe in-process: evaluation steps, host syncs, patches undone ------------------------------------

def test_probe_records_evaluation_steps_and_restores_tensor_methods():
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from diag.probe.core import Probe

    orig = {n: torch.Tensor.__dict__.get(n) for n in ("item", "tolist", "cpu", "numpy", "to", "cuda")}
    events: list = []
    probe = Probe(events.append).install()
    try:
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).eval()
        loader = DataLoader(TensorDataset(torch.randn(40, 8)), batch_size=8)
        with torch.inference_mode():
            for (x,) in loader:
                model(x).sum().item()                          # a host sync per batch
        probe.finish("completed")
    finally:
        probe.uninstall()
    assert {n: torch.Tensor.__dict__.get(n) for n in orig} == orig     # every patch undone
    ev = Evidence()
    for e in events:
        fold(ev, e)
    r = ev.primary
    assert ev.run_kind() == "evaluation"
    assert r.eval_stats.count == 5 and [s.samples for s in r.eval_steps] == [8] * 5
    for s in r.eval_steps:
        assert s.data_s + s.h2d_s + s.forward_s + s.other_s == pytest.approx(s.total_s, abs=1e-9)
        assert s.host_syncs == 1
    assert r.eval_stats.steps_with_syncs == 5
    (site,) = r.eval_stats.sync_sites
    assert site["file"] == __file__ and site["op"] == "item" and site["calls"] == 5
    # (the FLOP count of evaluation step 3 needs a process without optimizers: tests/test_eval_runs.py)
    (p,) = r.evaluations
    assert sum(s.total_s for s in r.eval_steps) == pytest.approx(p.time_s, rel=1e-6)


def test_mfu_on_an_evaluation_only_run_says_it_trained_no_step():
    """cost.mfu is measured on a training step: an evaluation-only run is told so, not that it 'ended
    after 0 step(s), before step 3 finished'."""
    ev = _eval_run().eval_steps(10, samples=64).build()
    [f] = run_check("cost.mfu", ev)
    assert f.severity == Severity.SKIPPED
    assert "evaluation-only run" in f.message and "trained none" in f.message
    assert "step 3" not in f.message


def test_small_batch_passes_a_language_models_few_long_sequences():
    """nanoGPT's estimate_loss evaluates 8-12 sequences of 1,024 tokens a batch: each forward already
    has thousands of rows, and the per-call cost is not what limits it. Eight short sequences still warn."""
    (f,) = run_check("eval.small-batch", _eval_run(device="cuda:0").eval_steps(64, total_s=0.05, samples=8, tokens=8 * 1024).build())
    assert f.severity == Severity.PASS
    assert "8,192 tokens" in f.message and f.evidence["eval_tokens"] == 8192
    (f,) = run_check("eval.small-batch", _eval_run(device="cuda:0").eval_steps(64, total_s=0.002, samples=8, tokens=8 * 32).build())
    assert f.severity == Severity.WARNING


def test_small_batch_fix_is_the_trainers_own_argument_under_a_framework():
    """Under the Hugging Face Trainer or Lightning the user never builds the evaluation DataLoader:
    the fix names the knob they turn (seen on a Trainer run with per_device_eval_batch_size=8)."""
    from diag.evidence import FrameworkInfo

    ev = _eval_run(device="cuda:0").eval_steps(64, total_s=0.002, samples=8).build()
    ev.primary.framework = FrameworkInfo(name="transformers", version="5", entry=None)
    (f,) = run_check("eval.small-batch", ev)
    assert f.severity == Severity.WARNING
    assert "TrainingArguments(per_device_eval_batch_size=64)" in f.fix
    assert "per_device_eval_batch_size=64" in f.snippet and "DataLoader(" not in f.snippet
    ev.primary.framework = FrameworkInfo(name="lightning", version="2", entry=None)
    (f,) = run_check("eval.small-batch", ev)
    assert "val_dataloader()" in f.fix and "batch_size=64" in f.snippet
