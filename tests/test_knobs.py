"""Issue 31: one knob table (diag/knobs.py), fixes in the framework's own words, predictions with
their basis, convolutions by what they run (defects 2, 3 and 5).

Hand-built CUDA evidence in the probe's shape (tests/test_checks_perf_cuda.py's cuda_run) per
framework, then the corpus: the real Hugging Face Trainer and Lightning scripts run under diag (on
the CPU), their evidence moved onto an H100 as a CUDA run records it, judged again.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from diag.evidence import DeviceInfo, FrameworkInfo, load_evidence
from diag.findings import Severity
from diag.knobs import FRAMEWORKS, KNOBS, markdown, words

from conftest import run_diag
from test_checks_perf_cuda import A100, cuda_run, run

H100 = DeviceInfo(index=0, name="NVIDIA H100 80GB HBM3", type="cuda", capability=[9, 0], total_memory=80 << 30)
CORPUS = Path(__file__).resolve().parent / "scripts" / "corpus"


def with_framework(ev, name):
    ev.primary.framework = FrameworkInfo(name=name, version="x", entry={"file": "/home/u/train.py", "line": 52,
                                                                        "function": "<module>"})
    return ev


# ---- the table ------------------------------------------------------------------------------------

def test_the_table_has_every_knob_the_trials_will_reuse_in_four_vocabularies():
    for kid in ("amp.bf16", "matmul.tf32", "dataloader.workers", "dataloader.pin-memory",
                "dataloader.persistent-workers", "cudnn.benchmark", "optim.set-to-none", "optim.fused", "compile",
                "eval.batch", "eval.inference-mode", "eval.bf16", "train.accumulation", "log.interval"):
        k = KNOBS[kid]
        assert set(k.words) == set(FRAMEWORKS), kid
        assert k.applies and k.trial and k.checks, kid
        for fw in FRAMEWORKS:
            fix, snippet, _ = words(kid, fw, n=4, dtype="bfloat16", cls="AdamW", better="fused=True", batch_size=32)
            assert fix and "{" not in fix and "{" not in (snippet or ""), (kid, fw)


@pytest.mark.parametrize("kid, fw, text", [
    ("amp.bf16", "transformers", "TrainingArguments(bf16=True)"),
    ("amp.bf16", "lightning", 'precision="bf16-mixed"'),
    ("amp.bf16", "accelerate", 'Accelerator(mixed_precision="bf16")'),
    ("eval.bf16", "transformers", "bf16_full_eval=True"),
    ("matmul.tf32", "transformers", "TrainingArguments(tf32=True)"),
    ("matmul.tf32", "lightning", "torch.set_float32_matmul_precision"),
    ("dataloader.workers", "transformers", "dataloader_num_workers=4"),
    ("dataloader.workers", "lightning", "train_dataloader()"),
    ("dataloader.persistent-workers", "transformers", "dataloader_persistent_workers=True"),
    ("cudnn.benchmark", "lightning", "benchmark=True"),
    ("optim.fused", "transformers", 'optim="adamw_torch_fused"'),
    ("compile", "transformers", "torch_compile=True"),
    ("train.accumulation", "lightning", "accumulate_grad_batches=4"),
    ("train.accumulation", "accelerate", "gradient_accumulation_steps=4"),
    ("eval.batch", "transformers", "per_device_eval_batch_size=4"),
    ("log.interval", "transformers", "logging_nan_inf_filter=False"),
    ("log.interval", "lightning", "log_every_n_steps"),
    (("amp.bf16"), None, 'torch.autocast("cuda", dtype=torch.bfloat16)'),
])
def test_the_words_of_each_framework(kid, fw, text):
    fix, snippet, _ = words(kid, fw, n=4)
    assert text in fix + "\n" + (snippet or "")


def test_no_lever_is_said():
    fix, _, lever = words("matmul.tf32", "lightning")
    assert lever is False and "no TF32 argument" in fix
    assert words("matmul.tf32", "transformers")[2] is True


def test_docs_checks_md_shows_the_table():
    text = (Path(__file__).resolve().parent.parent / "docs" / "checks.md").read_text()
    assert markdown() in text and "| **`amp.bf16`** |" in text and "`args = TrainingArguments(..., tf32=True)`" in text


# ---- fixes in the framework's words (defect 3) ---------------------------------------------------------

@pytest.mark.parametrize("fw, amp_text, tf32_text", [
    (None, 'torch.autocast("cuda", dtype=torch.bfloat16)', 'torch.set_float32_matmul_precision("high")'),
    ("transformers", "TrainingArguments(bf16=True)", "TrainingArguments(tf32=True)"),
    ("lightning", 'precision="bf16-mixed"', 'torch.set_float32_matmul_precision("high")'),
    ("accelerate", 'Accelerator(mixed_precision="bf16")', 'torch.set_float32_matmul_precision("high")'),
])
def test_amp_and_tf32_fixes_speak_the_framework(fw, amp_text, tf32_text):
    ev = cuda_run(device=H100)
    if fw:
        with_framework(ev, fw)
    (a,) = run("amp.unused", ev)
    (t,) = run("matmul.tf32", ev)
    assert amp_text in a.fix + a.snippet and tf32_text in t.fix + t.snippet
    if fw:
        assert "torch.autocast" not in a.snippet and a.location.line == 52      # the user's trainer line
        assert a.evidence["framework"] == fw and a.evidence["knob"] == "amp.bf16"


def test_syncs_inside_the_trainer_name_its_loop_and_lever():
    sites = [{"file": "/home/u/train.py", "line": 52, "function": "<module>", "code": "tr.train()", "count": 104}]
    sync = {"state": "sampled", "steps": 20, "total": 104, "per_step": [5] * 20, "sites": sites,
            "first_step": 1, "last_step": 21}
    ev = with_framework(cuda_run(device=H100, sync=sync), "transformers")
    (f,) = run("sync.host-device", ev)
    assert f.severity is Severity.WARNING
    assert "inside transformers' Trainer.train() loop" in f.message and "tr.train()" in f.message
    assert "logging_nan_inf_filter=False" in f.fix and "accumulate the loss" not in f.fix
    ev = with_framework(cuda_run(device=H100, sync=sync), "accelerate")
    (f,) = run("sync.host-device", ev)
    assert f.severity is Severity.INFO and "no setting" in f.fix
    # a sync on the user's own line under a framework keeps the plain advice
    own = dict(sync, sites=[dict(sites[0], line=30, code="print(loss.item())")])
    (f,) = run("sync.host-device", with_framework(cuda_run(device=H100, sync=own), "transformers"))
    assert "accumulate the loss in a tensor" in f.fix


# ---- convolutions by what they run (defect 2) --------------------------------------------------------

def test_transformers_conv1d_is_not_a_convolution():
    """GPT2LMHeadModel has 24 Conv1D modules (transformers' linear layer: addmm): no cuDNN convolution."""
    ev = cuda_run(device=H100, module_types={"GPT2LMHeadModel": 1, "Conv1D": 24, "Embedding": 2, "Linear": 1},
                  layers=[{"type": "Embedding", "in": 50257, "out": 768}, {"type": "Linear", "in": 768, "out": 50257}])
    (f,) = run("cudnn.benchmark", ev)
    assert f.severity is Severity.PASS and f.evidence["not_convolutions"] == {"Conv1D": 24}
    assert "Conv1D x24" in f.message and "linear layer" in f.message


def test_real_convolutions_are_counted_and_named():
    layers = [{"type": "Conv2d", "in": 3, "out": 64}] + [{"type": "MyConv", "in": 64, "out": 64}] * 3
    ev = cuda_run(device=H100, module_types={"ResNet": 1, "Conv2d": 1, "MyConv": 3, "BatchNorm2d": 4},
                  layers=layers, extras={"input_shapes": {"1": {"distinct": 1, "shapes": [[64, 3, 224, 224]]}}})
    (f,) = run("cudnn.benchmark", with_framework(ev, "lightning"))
    assert f.severity is Severity.WARNING and f.evidence["conv_modules"] == {"Conv2d": 1, "MyConv": 3}
    assert "Conv2d x1, MyConv x3" in f.message and "Trainer(..., benchmark=True)" in f.snippet


# ---- predictions with their basis (defect 5) -----------------------------------------------------------

def _flops(ev, flops):
    ev.primary.flops = {"measured": {"flops": flops, "model_flops": flops, "device": "cuda",
                                     "device_name": ev.environment.devices[0].name, "precision": "fp32"}}
    return ev


def test_a_matmul_bound_fp32_step_gets_a_range_that_holds_the_measured_gain():
    """fp32 GPT-2 on the H200: amp.unused said "up to 2.83x", bf16 ran 6.2x faster. With the counted
    FLOPs needing 60% of the step at the fp32 peak, and forward+backward 95% of it, the range at the
    H100's bf16/fp32 peak ratio (989/67 = 14.8x) is 2.3x-8.7x."""
    ev = _flops(cuda_run(device=H100, fwd=0.0095, bwd=0.0095, data=0.0, opt=0.0005, other=0.0005),
                0.6 * 67e12 * 0.020)
    (f,) = run("amp.unused", ev)
    assert f.severity is Severity.WARNING
    lo, hi = f.evidence["min_step_speedup"], f.evidence["max_step_speedup"]
    assert lo == pytest.approx(2.27, abs=0.01) and hi == pytest.approx(8.74, abs=0.01) and lo < 6.2 < hi
    assert "2.3x to 8.7x faster" in f.message and "fp32 peak (60% of the 20.0 ms step)" in f.message
    assert "14.8x (the catalogue's bf16/fp32 dense peak ratio on h100-sxm)" in f.message


def test_a_launch_bound_step_says_the_gain_cannot_be_predicted():
    """HF Trainer GPT-2: amp.unused said "up to 1.52x", matmul.tf32 "up to 1.80x"; bf16 changed
    nothing (5.41 s vs 5.42 s over 200 steps). Its matmuls need a few percent of the step at peak."""
    ev = with_framework(_flops(cuda_run(device=H100), 0.04 * 67e12 * 0.025), "transformers")
    for cid in ("amp.unused", "matmul.tf32"):
        (f,) = run(cid, ev)
        assert f.severity is Severity.INFO, cid
        assert "diag cannot predict" in f.message and "measure it" in f.message and "diag compare" in f.message
        assert f.evidence["speedup_basis"]["launch_bound"] is True and f.evidence["min_step_speedup"] is None


def test_without_counted_flops_the_gain_is_an_upper_bound_said_as_such():
    (f,) = run("matmul.tf32", cuda_run(device=A100))
    assert "at most" in f.message and "an upper bound" in f.message and "measure it" in f.message
    assert f.evidence["tf32_to_fp32_peak_ratio"] == pytest.approx(8.0)


# ---- the corpus: the real framework scripts' evidence, as a CUDA run records it -------------------------

def _corpus_evidence(tmp_path_factory, script):
    cwd = tmp_path_factory.mktemp(script.split(".")[0])
    r = run_diag("check", "--script", str(CORPUS / script), "--format", "json", "--fail-on", "never",
                 cwd=cwd, timeout=420)
    assert r.code == 0, r.stderr[-3000:]
    ev = load_evidence(json.loads(r.stdout)["run"]["evidence"])
    # onto an H100, as the probe records a CUDA run: the models' parameters on cuda:0, fp32 matmuls at
    # "highest", the device in the environment
    env = ev.environment
    env.devices = [H100]
    env.cuda, env.cuda_available, env.device_count = "12.4", True, 1
    env.float32_matmul_precision, env.allow_tf32_matmul = "highest", False
    for m in ev.primary.models:
        m.devices = ["cuda:0"]
    return ev


@pytest.fixture(scope="module")
def hf_evidence(tmp_path_factory):
    pytest.importorskip("transformers")
    return _corpus_evidence(tmp_path_factory, "hf_trainer.py")


@pytest.fixture(scope="module")
def lightning_evidence(tmp_path_factory):
    pytest.importorskip("lightning")
    return _corpus_evidence(tmp_path_factory, "lightning_fit.py")


@pytest.mark.slow
def test_corpus_hf_trainer_fixes_speak_training_arguments(hf_evidence):
    ev = hf_evidence
    assert ev.primary.framework.name == "transformers"
    (a,) = run("amp.unused", ev)
    (t,) = run("matmul.tf32", ev)
    (c,) = run("compile.unused", ev)
    (k,) = run("cudnn.benchmark", ev)
    assert "TrainingArguments(bf16=True)" in a.fix and "torch.autocast" not in a.snippet
    assert "TrainingArguments(tf32=True)" in t.fix
    assert "TrainingArguments(torch_compile=True)" in c.fix
    # GPT2LMHeadModel's Conv1D modules are linear layers: no convolution to tune
    assert k.severity is Severity.PASS and "Conv1D" in k.evidence["not_convolutions"]
    assert a.location is not None and a.location.file.endswith("hf_trainer.py")


@pytest.mark.slow
def test_corpus_lightning_fixes_speak_the_lightning_trainer(lightning_evidence):
    ev = lightning_evidence
    assert ev.primary.framework.name == "lightning"
    (a,) = run("amp.unused", ev)
    (t,) = run("matmul.tf32", ev)
    (c,) = run("compile.unused", ev)
    assert 'precision="bf16-mixed"' in a.snippet and "torch.autocast" not in a.snippet
    assert "torch.set_float32_matmul_precision" in t.snippet and "no TF32 argument" in t.fix
    assert "trainer.fit(model" in c.snippet
