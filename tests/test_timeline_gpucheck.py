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
    for name in ("dataloader", "tuning", "cost", "sync", "eval", "amp", "memory", "gpu"):
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


@pytest.mark.slow
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
    fired = res["findings"]["dataloader.workers"]
    # on a contended host the wait is an info that says so (issue 33): found all the same
    contended = ((fired.get("evidence") or {}).get("host") or {}).get("contended")
    assert fired["severity"] in (("info", "warning", "error") if contended else ("warning", "error")), res
    assert res["ok"] is False
    assert any("clock='host'" in p for p in res["problems"]), res["problems"]
    assert json.loads((tmp_path / "figures.json").read_text())["parts"]["twins"]["ok"] is False


def test_new_cases_have_twins_with_device_expectations():
    mod = _gpu_check()
    twins = {t[0]: t for t in mod.TWINS}
    assert twins["pinned_copies"][4]["pass"] == ["dataloader.pin-memory"]
    assert ("clock", "==", "device") in twins["pageable_copies"][4]["evidence"]["dataloader.pin-memory"]
    assert any(k == "idle_causes.checkpoint" for k, *_ in twins["checkpoint_save"][4]["evidence"]["gpu.idle"])
    assert any(k == "idle_causes.eval" for k, *_ in twins["eval_pass"][4]["evidence"]["gpu.idle"])
    assert mod._get({"a": {"b": {"c": 2}}}, "a.b.c") == 2 and mod._get({"a": 1}, "a.b") is None


def test_readme_figures_collect_what_the_readme_quotes():
    mod = _gpu_check()
    figures = {"started": "2026-12-03 10:00:00 UTC", "device": "NVIDIA H200", "torch": "2.13.0", "parts": {
        "overhead": {"ok": True, "overhead_pct": 0.4, "step_ms_plain": 3.1},
        "mfu": {"ok": True, "mfu": 0.61, "mfu_busy": 0.7, "achieved_tflops": 603.0, "peak_tflops": 989.0,
                "raw_bf16_matmul": {"tflops": 790.0}},
        "gpu_tests": {"ok": False, "memory_estimate": [{"model": "mlp", "error_pct": 4.2}]},
        "twins": {"ok": False, "workloads": {
            "hidden_data_wait": {"ok": True, "findings": {"dataloader.workers": {"evidence": {
                "gpu_idle_share": 0.01, "gpu_idle_data_share": 0.0, "host_data_share": 0.6}}}},
            "pinned_copies": {"ok": True, "findings": {"dataloader.pin-memory": {"evidence": {
                "copies_device": {"pinned": {"gb_per_s": 24.5}}, "gpu_idle_pinned_copy_share": 0.03}}}},
            "checkpoint_save": {"ok": False, "findings": {"gpu.idle": {"evidence": {
                "idle_causes": {"checkpoint": 0.2}}}}}}}}}
    r = mod.readme_figures(figures)
    assert r["gpu"] == "NVIDIA H200" and r["probe_overhead_pct"] == 0.4 and r["raw_bf16_matmul_tflops"] == 790.0
    assert r["memory_estimate_error_pct"] == {"mlp": 4.2}
    assert r["twins_ok"] == "2/3" and r["twins_failed"] == ["checkpoint_save"]
    assert r["parts_failed"] == ["gpu_tests", "twins"]
    t = r["timeline"]
    assert t["hidden_data_wait"]["host_data_share"] == 0.6 and t["pinned_copy_gb_per_s"] == 24.5
    assert t["checkpoint_idle_share"] == 0.2 and t["pageable_copy_gb_per_s"] is None

    class R:
        pass

    run = R()
    run.figures = dict(figures, elapsed_s=300.0, readme=r)
    assert "pinned 24.5 GB/s" in mod.summary(run)


def test_the_whole_run_is_time_boxed_under_eight_minutes():
    text = SCRIPT.read_text()
    total = int(re.search(r'GPU_CHECK_TOTAL_S:-(\d+)', text).group(1))
    assert total + 5 < 480                                  # the kill margin included
    assert '--budget "$((left - 15))"' in text and 'timeout -k 5 "$left"' in text
    mod = _gpu_check()
    # every part has a cap (gpu_tests: what is left), and the dry run shows them
    assert set(mod.PART_BUDGET) == set(mod.PARTS) - {"gpu_tests"}
    # the twins' cap holds at least the typical run of every twin (~15 s each on an H200)
    assert mod.PART_BUDGET["twins"] >= 15 * len(mod.TWINS)
