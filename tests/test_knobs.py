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
    # compile.unused passes a run that ended before its break-even (issue 33): the words only when it fires
    assert c.severity is Severity.PASS or "TrainingArguments(torch_compile=True)" in c.fix
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
    assert c.severity is Severity.PASS or "trainer.fit(model" in c.snippet   # (see the HF test above)


# ---- the data pipeline, the optimizer, evaluation batches and compile: the same table -------------------

from diag.evidence import DataLoaderInfo, OptimizerInfo  # noqa: E402
from diag.testing import EvidenceBuilder  # noqa: E402

from test_eval_checks import _eval_run  # noqa: E402

FWS = [None, "transformers", "lightning", "accelerate"]


def _fw(ev, fw):
    return with_framework(ev, fw) if fw else ev


def _loader(**kw):
    d = dict(id=1, num_workers=0, pin_memory=False, batch_size=64, batches=20, epochs=1,
             location={"file": "/home/u/train.py", "line": 60, "function": "main"})
    d.update(kw)
    return [DataLoaderInfo(**d)]


@pytest.mark.parametrize("fw, text, absent", [
    (None, "pin_memory=True", "TrainingArguments"),
    ("transformers", "TrainingArguments(dataloader_pin_memory=True)", "DataLoader("),
    ("lightning", "train_dataloader()", "TrainingArguments"),
    ("accelerate", "accelerator.prepare()", "TrainingArguments"),
])
def test_pin_memory_speaks_the_framework(fw, text, absent):
    (f,) = run("dataloader.pin-memory", _fw(cuda_run(loaders=_loader(num_workers=8)), fw))
    assert f.severity is Severity.WARNING and text in f.fix + f.snippet and absent not in f.snippet
    assert f.evidence["framework"] == fw and f.evidence["knob"] == "dataloader.pin-memory"
    assert f.location.line == 60
    if fw is None:
        assert "non_blocking=True" in f.snippet and ".pin_memory()" in f.fix


def test_pin_memory_under_a_framework_with_pinned_loaders_points_at_the_scripts_own_copies():
    copies = {"h2d_copies": 40, "h2d_bytes": 20 * 1000, "non_blocking_pageable": 20, "non_blocking_pinned": 0,
              "steps": 20, "sites": [{"file": "/home/u/train.py", "line": 77, "function": "training_step"}]}
    ev = with_framework(cuda_run(loaders=_loader(num_workers=8, pin_memory=True), extras={"copies": copies}),
                        "lightning")
    (f,) = run("dataloader.pin-memory", ev)
    assert ".pin_memory()" in f.fix and "train_dataloader" not in f.fix and f.location.line == 77


def _respawning(fw):
    from test_checks_perf_unit import cpu_run
    firsts = (0.09, 0.08, 0.085, 0.08)
    d = DataLoaderInfo(id=1, num_workers=2, persistent_workers=False, batch_size=32, epochs=4, batches=40,
                       first_batch_s=list(firsts), wait_s=sum(firsts) + 0.036,
                       location={"file": "/w/train.py", "line": 12, "function": "main"})
    return _fw(cpu_run(loaders=[d]), fw)


@pytest.mark.parametrize("fw, text", [
    (None, "DataLoader(dataset, batch_size=32, num_workers=2,\n                    persistent_workers=True)"),
    ("transformers", "TrainingArguments(..., dataloader_num_workers=2, dataloader_persistent_workers=True)"),
    ("lightning", "def train_dataloader(self):"),
    ("accelerate", "DataLoader(dataset, batch_size=32, num_workers=2, persistent_workers=True)"),
])
def test_persistent_workers_speaks_the_framework(fw, text):
    (f,) = run("dataloader.persistent-workers", _respawning(fw))
    assert f.severity is Severity.WARNING and text in f.snippet and "N" not in f.snippet.split("(")[-1]
    assert f.evidence["knob"] == "dataloader.persistent-workers" and f.evidence["framework"] == fw
    if fw == "transformers":
        assert "TrainingArguments(dataloader_persistent_workers=True)" in f.fix and "DataLoader(" not in f.snippet
    if fw == "lightning":
        assert "persistent_workers=True" in f.snippet and "train_dataloader()" in f.fix


def _waiting(fw, cuda=True):
    b = EvidenceBuilder().environment(cpu_count=8)
    b = (b.cuda_training() if cuda else b.model()).steps(10, total_s=0.1, data_s=0.05)
    b.dataloader(num_workers=0, batch_size=32, role="train", batches=10, wait_s=0.5)
    return _fw(b.build(), fw)


@pytest.mark.parametrize("fw, fix_text, snippet_text", [
    (None, "Give the DataLoader num_workers=", "num_workers=2, pin_memory=True,\n                    persistent_workers=True)"),
    ("transformers", "TrainingArguments(dataloader_num_workers=",
     "dataloader_pin_memory=True, dataloader_persistent_workers=True)"),
    ("lightning", "in train_dataloader()", "pin_memory=True, persistent_workers=True)"),
    ("accelerate", "accelerator.prepare()", "pin_memory=True, persistent_workers=True)"),
])
def test_workers_speak_the_framework_and_keep_the_prediction(fw, fix_text, snippet_text):
    (f,) = run("dataloader.workers", _waiting(fw))
    assert fix_text in f.fix and snippet_text in f.snippet
    assert "should drop from" in f.fix and "usable CPUs" in f.fix and f.evidence["predicted_step_s"]
    assert f.evidence["knob"] == "dataloader.workers" and f.evidence["framework"] == fw
    if fw == "transformers":
        assert "DataLoader(" not in f.snippet


def test_workers_on_a_cpu_run_name_no_pinning_in_any_framework():
    for fw in FWS:
        (f,) = run("dataloader.workers", _waiting(fw, cuda=False))
        assert "pin_memory" not in f.snippet, fw


def _zeroing(fw):
    opts = [OptimizerInfo(id=1, cls="AdamW", steps=20, zero_grad_calls=20, zero_grad_set_to_none=False,
                          zero_grad_s=20 * 0.002)]
    return _fw(cuda_run(optimizers=opts), fw)


@pytest.mark.parametrize("fw, text", [
    (None, "optimizer.zero_grad()"),
    ("lightning", "def optimizer_zero_grad(self, epoch, batch_idx, optimizer):"),
    ("accelerate", "optimizer.zero_grad()"),
])
def test_zero_grad_speaks_the_framework(fw, text):
    (f,) = run("optim.zero-grad", _zeroing(fw))
    assert f.severity is Severity.WARNING and text in f.snippet
    assert f.evidence["knob"] == "optim.set-to-none" and f.evidence["framework"] == fw


def test_zero_grad_under_the_trainer_says_there_is_no_setting_and_orders_nothing():
    (f,) = run("optim.zero-grad", _zeroing("transformers"))
    assert f.severity is Severity.INFO and f.snippet is None
    assert "no setting" in f.fix and "code of yours" in f.fix and "nothing to change" in f.fix


def _forloop(fw, cls="AdamW", **kw):
    from test_checks_perf_cuda import _opt_extras
    rec = dict(foreach=False, effective_foreach=False, cls=cls)
    rec.update(kw)
    return _fw(cuda_run(opt=0.01, extras=_opt_extras(**rec),
                        optimizers=[OptimizerInfo(id=1, cls=cls, steps=20, zero_grad_calls=20,
                                                  zero_grad_set_to_none=True)]), fw)


@pytest.mark.parametrize("fw, text", [
    (None, "opt = torch.optim.AdamW(model.parameters(), lr=..., fused=True)"),
    ("transformers", 'TrainingArguments(..., optim="adamw_torch_fused")'),
    ("lightning", "def configure_optimizers(self):"),
    ("accelerate", "opt = torch.optim.AdamW(model.parameters(), lr=..., fused=True)"),
])
def test_fused_speaks_the_framework(fw, text):
    (f,) = run("optim.foreach-fused", _forloop(fw))
    assert f.severity is Severity.WARNING and text in f.snippet
    assert f.evidence["knob"] == "optim.fused" and f.evidence["framework"] == fw
    (h,) = run("optim.foreach-fused", _fw(cuda_run(opt=0.02, extras=__import__("test_checks_perf_cuda")
                                                   ._opt_extras()), fw))
    assert h.severity is Severity.INFO and text in h.snippet


def test_fused_under_the_trainer_for_another_class_is_not_the_adamw_string():
    (f,) = run("optim.foreach-fused", _forloop("transformers", cls="SGD"))
    assert "adamw_torch_fused" not in f.snippet and "torch.optim.SGD(" in f.snippet
    assert "optimizers=(opt, None)" in f.snippet and "AdamW only" in f.fix


@pytest.mark.parametrize("fw, text", [
    (None, "val_loader = DataLoader(val_set, batch_size=64, shuffle=False)"),
    ("transformers", "TrainingArguments(..., per_device_eval_batch_size=64)"),
    ("lightning", "def val_dataloader(self):"),
    ("accelerate", "val_loader = DataLoader(val_set, batch_size=64)"),
])
def test_eval_small_batch_speaks_the_framework(fw, text):
    (f,) = run("eval.small-batch", _fw(_eval_run(device="cuda:0").eval_steps(64, total_s=0.002, samples=8).build(), fw))
    assert f.severity is Severity.WARNING and text in f.snippet
    assert f.evidence["knob"] == "eval.batch" and f.evidence["framework"] == fw


@pytest.mark.parametrize("fw, text", [
    (None, "model = torch.compile(model)"),
    ("transformers", "TrainingArguments(..., torch_compile=True)"),
    ("lightning", "trainer.fit(model, train_loader)"),
    ("accelerate", 'Accelerator(dynamo_backend="inductor")'),
])
def test_compile_unused_speaks_the_framework(fw, text):
    ev = _fw(cuda_run(), fw)
    ev.run.status, ev.run.stop_reason = "stopped", "--steps 20 reached"   # a longer run than the one seen
    (f,) = run("compile.unused", ev)
    assert f.severity is Severity.INFO and text in f.snippet
    assert f.evidence["knob"] == "compile" and f.evidence["framework"] == fw
