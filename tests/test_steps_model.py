"""Issue 12, unit level: the step model's pieces on hand-built inputs (fast; the corpus test
tests/test_corpus_frameworks.py runs them on real scripts)."""
from __future__ import annotations

import os
import sys
import sysconfig
import warnings

import pytest

from diag.evidence import ChildProcess, DataLoaderInfo, EvaluationPass, FrameworkInfo
from diag.findings import Finding, Location, Severity
from diag.registry import dedupe
from diag.testing import EvidenceBuilder, run_check


# ---- frames (classes 7, 12) ---------------------------------------------------------------------------

def test_installed_packages_and_stdlib_are_library_code(tmp_path):
    from diag.probe.frames import is_library_file

    stdlib = sysconfig.get_paths()["stdlib"]
    assert is_library_file(os.path.join(stdlib, "ast.py"))
    assert is_library_file("/opt/venv/lib/python3.11/site-packages/transformers/trainer.py")
    assert is_library_file("/usr/lib/python3/dist-packages/lightning/pytorch/trainer/trainer.py")
    assert not is_library_file(str(tmp_path / "train.py"))


def test_exception_location_skips_the_stdlib_and_strips_ansi():
    from diag.probe.frames import exception_info

    import ast

    try:
        ast.parse("x = (", filename="\x1b[1mconfig.py\x1b[0m")
    except SyntaxError as e:
        info = exception_info(e, 0, __file__)
    assert info["location"]["file"] == __file__
    assert "\x1b" not in info["message"] and "\x1b" not in info["traceback"]
    assert "config.py" in info["message"]


# ---- samples (class 6) --------------------------------------------------------------------------------

def test_samples_follow_the_loaders_batch_not_dim0():
    torch = pytest.importorskip("torch")
    from diag.probe.steps import batch_samples
    from diag.probe.tensors import batch_size_of

    batch = (torch.zeros(20, 35, dtype=torch.long), torch.zeros(20, 35, dtype=torch.long))
    assert batch_samples(batch) == 20
    assert batch_samples({"input_ids": torch.zeros(4, 32, dtype=torch.long)}) == 4
    assert batch_samples(["a", "b", "c"]) == 3
    seq_first = batch[0].t()
    assert batch_size_of((seq_first,), {}, 20)[:2] == (20, 700)
    assert batch_size_of((seq_first,), {})[:2] == (35, 700)        # no loader: dim 0


# ---- the one data-wait share (classes 1, 8) -------------------------------------------------------------

def _two_loaders():
    b = EvidenceBuilder().model().steps(10, total_s=0.1, data_s=0.02)
    b.dataloader(num_workers=1, batch_size=32, role="train", batches=10, wait_s=0.2)
    b.dataloader(num_workers=0, batch_size=64, role="eval", batches=48, wait_s=1.0)
    return b.build()


def test_training_loader_is_the_one_that_fed_training():
    r = _two_loaders().primary
    assert r.training_loader().batch_size == 32
    share = r.data_wait_share()
    assert share["share"] == pytest.approx(0.2) and share["n"] >= 8


def test_dataloader_workers_judges_the_training_loader_and_shares_one_number():
    from diag.checks.dataloader import dataloader_workers
    from diag.checks.tuning import compile_unused

    ev = _two_loaders()
    (f,) = run_check(dataloader_workers, ev)
    assert f.evidence["batch_size"] == 32 and f.evidence["num_workers"] == 1
    (c,) = run_check(compile_unused, ev)
    assert c.evidence["data_share"] == f.evidence["data_share"]


def test_cpu_run_worker_advice_has_no_gpu_snippet():
    from diag.checks.dataloader import dataloader_workers

    b = EvidenceBuilder().environment(cpu_count=2).model().steps(10, total_s=0.1, data_s=0.05)
    b.dataloader(num_workers=0, batch_size=32, role="train", batches=10, wait_s=0.5)
    (f,) = run_check(dataloader_workers, b.build())
    assert f.severity in (Severity.WARNING, Severity.ERROR)
    text = (f.fix or "") + (f.snippet or "")
    assert "pin_memory" not in text and "GPU" not in text
    assert "share" in f.fix and "cores" in f.fix
    assert f.evidence["recommended_workers"] == 1


def test_framework_vocabulary_for_workers():
    from diag.checks.dataloader import dataloader_workers

    b = EvidenceBuilder().environment(cpu_count=8).cuda_training().steps(10, total_s=0.1, data_s=0.05)
    b.dataloader(num_workers=0, batch_size=32, role="train", batches=10, wait_s=0.5)
    ev = b.build()
    ev.primary.framework = FrameworkInfo(name="transformers", version="5", entry={"file": "train.py", "line": 3})
    (f,) = run_check(dataloader_workers, ev)
    assert "TrainingArguments(dataloader_num_workers=" in f.fix and "TrainingArguments" in f.snippet


# ---- children (class 2) ---------------------------------------------------------------------------------

def test_training_in_children_is_an_info_not_an_error():
    from diag.checks.run import run_no_steps

    ev = EvidenceBuilder().build()
    ev.primary.children = [ChildProcess(pid=10, steps=6, samples=96, median_step_s=0.1),
                           ChildProcess(pid=11, steps=6, samples=96, median_step_s=0.1)]
    (f,) = run_check(run_no_steps, ev)
    assert f.severity == Severity.INFO and "2 child process" in f.message and "12 step" in f.message


# ---- dedupe (class 5) -----------------------------------------------------------------------------------

def test_one_finding_per_location():
    loc = Location(file="train.py", line=64)
    fs = [Finding(id="eval.no-grad", severity=Severity.WARNING, title="t", message="a", location=loc),
          Finding(id="eval.no-grad", severity=Severity.WARNING, title="t", message="a", location=loc),
          Finding(id="eval.no-grad", severity=Severity.WARNING, title="t", message="b",
                  location=Location(file="train.py", line=70))]
    assert [f.message for f in dedupe(fs)] == ["a", "b"]


# ---- durations (class 11) -------------------------------------------------------------------------------

def test_console_prints_long_steps_in_seconds():
    from diag.report.console import run_header

    ev = EvidenceBuilder().model().steps(5, total_s=29.5723).build()
    ev.primary.evaluations = [EvaluationPass(index=1, time_s=1.5, forwards=24, data_wait_s=0.2, batches=24)]
    text = run_header(ev).plain
    assert "median step 29.57 s" in text and "29572" not in text
    assert "evaluation: 1 pass(es), 1.50 s in all, 24 forward(s)" in text


# ---- the quiet probe (class 10) ---------------------------------------------------------------------------

def test_relocated_warnings_name_the_callers_line():
    from diag.probe.quiet import relocated_warnings, silence_hook_warnings

    def wrapper():   # stands for a diag wrapper around a torch call that warns with stacklevel=2
        with relocated_warnings():
            inner()

    def inner():
        warnings.warn("from torch", UserWarning, stacklevel=2)

    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        wrapper(); line = sys._getframe().f_lineno  # noqa: E702
    # the wrapper lives in this test file (not diag): the warning keeps its own location
    assert got and got[0].filename == __file__
    undo = silence_hook_warnings()
    try:
        with warnings.catch_warnings(record=True) as got2:
            warnings.filterwarnings("ignore", message="x")   # a user filter in front keeps diag's filter working
            warnings.warn("Using `torch.compile(module)` when there are global hooks on modules", UserWarning)
        assert not [w for w in got2 if "global hooks" in str(w.message)]
    finally:
        undo()
    assert line


def test_relocated_warnings_keep_a_librarys_own_warning_its_own(tmp_path, monkeypatch):
    """A warning that names a library's line (stacklevel 1, as torch.jit's DeprecationWarning raised while
    torch.compile imports its passes) is re-issued as that module's: Python's default filters hide it
    outside __main__, and under diag they still do (re-issued as the caller's, it was shown)."""
    import importlib

    from diag.probe.quiet import relocated_warnings

    (tmp_path / "fake_torch_pass.py").write_text(
        "import warnings\n"
        "def old_api():\n"
        "    warnings.warn('old_api is deprecated', DeprecationWarning)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    lib = importlib.import_module("fake_torch_pass")

    with warnings.catch_warnings(record=True) as got:
        warnings.resetwarnings()
        warnings.simplefilter("ignore", DeprecationWarning)        # Python's defaults, the caller's module
        warnings.filterwarnings("default", category=DeprecationWarning, module=__name__)   # standing for __main__
        with relocated_warnings():
            lib.old_api()
        warnings.warn("the caller's own", DeprecationWarning)      # (the filter does show the caller's)
    assert [str(w.message) for w in got] == ["the caller's own"]
