"""scripts/gpu-check.sh on a CPU machine: --dry-run lists what it would run and exits 0; the real run
refuses with one sentence; every CUDA twin exists, compiles, and expects checks that exist."""
from __future__ import annotations

import importlib.util
import json
import py_compile
import re
import subprocess
import sys

import pytest

from conftest import REPO

SCRIPT = REPO / "scripts" / "gpu-check.sh"


def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_lists_every_part_and_twin():
    p = subprocess.run(["bash", str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert p.returncode == 0, p.stderr
    mod = _gpu_check()
    for part in mod.PARTS:
        assert part in p.stdout
    for name, script, *_ in mod.TWINS:
        assert f"tests/scripts/cuda/{script}" in p.stdout
    assert "hidden_data_wait" in p.stdout and "dataloader.workers passes" in p.stdout


def test_real_run_without_a_gpu_says_so_and_exits_2():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    p = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120,
                       env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert p.returncode == 2
    assert "no CUDA torch" in p.stderr and "Traceback" not in p.stderr


def test_unknown_part_is_usage_error(capsys):
    assert _gpu_check().main(["--only", "bogus", "--dry-run"]) == 2
    assert "unknown part bogus" in capsys.readouterr().err


def test_twins_exist_compile_and_expect_known_checks():

    mod = _gpu_check()
    ids = set()
    for name in ("dataloader", "tuning", "cost", "sync", "eval", "amp", "memory"):
        src = (REPO / "checks" / f"{name}.py").read_text()

        ids |= set(re.findall(r'@check\(id="([^"]+)"', src))
    for name, script, steps, env, expect in mod.TWINS:
        path = REPO / "tests" / "scripts" / "cuda" / script
        py_compile.compile(str(path), doraise=True)
        for cid in expect.get("fire", []) + expect.get("pass", []):
            assert cid in ids, (name, cid)
    for extra in ("steady_bench.py", "bf16_mfu.py", "cuda_common.py"):
        py_compile.compile(str(REPO / "tests" / "scripts" / "cuda" / extra), doraise=True)


def test_summary_reports_failed_parts():
    mod = _gpu_check()

    class R:
        figures = {"device": "NVIDIA H200", "elapsed_s": 12.0, "parts": {
            "overhead": {"ok": False, "overhead_pct": 1.7, "step_ms_plain": 20.0},
            "twins": {"ok": False, "workloads": {"tf32_off": {"ok": False, "problems": ["matmul.tf32 did not fire"]}}}}}

    text = mod.summary(R())
    assert "overhead   FAIL overhead 1.7%" in text
    assert "tf32_off" in text and "matmul.tf32 did not fire" in text
    assert "gpus       not run" in text


def test_twin_runner_plumbing_on_cpu(tmp_path):
    """The twins part end to end on a CPU (the twin's device switched to cpu): the `diag check` report is
    written, parsed, and a failed expectation (the device clock, absent on a CPU run) is reported."""
    mod = _gpu_check()
    mod.TWINS = [("exposed_cpu", "exposed_data_wait.py", 8, {"DIAG_TWIN_DEVICE": "cpu"},
                  {"fire": ["dataloader.workers"], "evidence": {"dataloader.workers": [("clock", "==", "device")]}})]
    run = mod.Run(tmp_path, budget=300)
    mod.part_twins(run)
    res = run.figures["parts"]["twins"]["workloads"]["exposed_cpu"]
    assert (tmp_path / "reports" / "exposed_cpu.json").exists()
    assert (tmp_path / "logs" / "twin-exposed_cpu.log").exists()
    assert res["findings"]["dataloader.workers"]["severity"] in ("warning", "error"), res
    assert res["ok"] is False
    assert any("clock='host'" in p for p in res["problems"]), res["problems"]
    assert json.loads((tmp_path / "figures.json").read_text())["parts"]["twins"]["ok"] is False
