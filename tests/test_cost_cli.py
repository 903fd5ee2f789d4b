"""`diag cost` through the real CLI (subprocesses): the GPT-3 example, tables, bad inputs, no torch."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO, run_diag


def test_gpt3_worked_example_text_and_json():
    r = run_diag("cost", "--params", "175e9", "--tokens", "300e9", "--gpu", "A100", "--count", "1024",
                 "--mfu", "0.3")
    assert r.code == 0, r.stderr
    assert "3.15e23 FLOPs" in r.stdout and "934,829 GPU-hours" in r.stdout and "38.0 days" in r.stdout
    assert "312.0 TFLOPS" in r.stdout
    r = run_diag("cost", "--params", "175B", "--tokens", "300B", "--gpu", "A100", "--count", "1024",
                 "--mfu", "50%", "--format", "json")
    d = r.json()
    assert d["kind"] == "estimate" and d["training"]["flops"] == pytest.approx(3.15e23)
    assert d["training"]["gpu_hours"] == pytest.approx(560_900, abs=100)
    assert d["peak_flops"] == 312e12 and d["mfu"] == 0.5 and d["mfu_basis"] == "given"
    assert d["price_basis"].startswith("indicative, as of")


def test_eval_and_compare_and_phases_and_list():
    r = run_diag("cost", "--params", "7B", "--tokens", "140B", "--eval-tokens", "1B", "--compare",
                 "H100x8,A100x16,L40Sx32", "--format", "json")
    assert r.code == 0, r.stderr
    rows = r.json()["rows"]
    assert [x["gpu"] for x in rows] == ["h100-sxm", "a100-80gb", "l40s"]
    assert rows[0]["eval"]["flops"] == pytest.approx(2 * 7e9 * 1e9)
    r = run_diag("cost", "--params", "7B", "--tokens", "140B", "--compare", "H100x8,A100x16")
    assert r.code == 0 and "cheapest:" in r.stdout and "NVIDIA A100 80GB SXM x 16" in r.stdout
    r = run_diag("cost", "--params", "1B", "--tokens", "20B", "--gpu", "H100", "--count", "8", "--phases")
    assert r.code == 0 and "explore" in r.stdout and "total" in r.stdout
    r = run_diag("cost", "--list-gpus")
    assert r.code == 0 and "mi300x" in r.stdout and "as of" in r.stdout and "https://" in r.stdout
    r = run_diag("cost", "--list-gpus", "--format", "json")
    assert {g["id"] for g in r.json()["gpus"]} >= {"t4", "h200", "b200", "rtx-3090"}


@pytest.mark.parametrize("args, words", [
    (["--params", "-5", "--tokens", "1e9", "--gpu", "A100"], "params must be greater than zero"),
    (["--params", "0", "--tokens", "1e9", "--gpu", "A100"], "params must be greater than zero"),
    (["--params", "nan", "--tokens", "1e9", "--gpu", "A100"], "NaN"),
    (["--params", "1e9", "--tokens", "1e9", "--gpu", "A100", "--count", "0"], "GPU count"),
    (["--params", "1e9", "--tokens", "1e9", "--gpu", "H10"], "did you mean h100-sxm"),
    (["--params", "1e9", "--tokens", "1e9", "--gpu", "A100", "--mfu", "1.2"], "(0, 1]"),
    (["--params", "1e9", "--tokens", "1e9", "--gpu", "A100", "--mfu", "0"], "(0, 1]"),
    (["--params", "1e9", "--tokens", "1e9", "--gpu", "A100", "--mfu", "-0.3"], "(0, 1]"),
    (["--params", "1e9", "--tokens", "1e9", "--gpu", "A100", "--price", "nan"], "price"),
    (["--params", "1e9", "--tokens", "1e9", "--gpu", "T4", "--precision", "bf16"], "no dense bf16"),
    (["--params", "1e9", "--tokens", "1e9"], "--gpu"),
    (["--tokens", "1e9", "--gpu", "A100"], "--params"),
    (["--params", "1e9", "--tokens", "1e9", "--compare", "H100x8,Nope"], "unknown GPU 'Nope'"),
    (["--params", "1e9", "--tokens", "1e9", "--gpu", "A100", "--phases", "warm"], "cannot read phase"),
    (["--from", "/nonexistent/evidence.json", "--epochs", "1"], "does not exist"),
])
def test_bad_inputs_are_one_sentence_and_exit_2(args, words):
    r = run_diag("cost", *args)
    assert r.code == 2, (r.stdout, r.stderr)
    assert words in r.stderr
    assert r.stderr.startswith("diag: error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


def test_broken_catalog_file_names_the_line(tmp_path):
    p = tmp_path / "gpus.toml"
    p.write_text("[gpu.mine]\nname = \"Mine\"\n[gpu.mine.tflops]\nbf16 = fast\n")
    r = run_diag("cost", "--params", "1e9", "--tokens", "1e9", "--gpu", "A100", "--catalog", str(p))
    assert r.code == 2 and "line 4" in r.stderr and str(p) in r.stderr and r.stderr.count("\n") == 1
    # the same file as the default user catalogue, found through XDG_CONFIG_HOME
    (tmp_path / "diag").mkdir()
    (tmp_path / "diag" / "gpus.toml").write_text("[gpu.mine]\nname = \"Mine\"\n[gpu.mine.tflops]\nbf16 = 100\n"
                                                  "[gpu.mine.price]\nusd_per_hour = 1.0\n")
    r = run_diag("cost", "--params", "1e9", "--tokens", "1e10", "--gpu", "mine", "--mfu", "0.5", "--format", "json",
                 env={"XDG_CONFIG_HOME": str(tmp_path)})
    assert r.code == 0, r.stderr
    d = r.json()
    assert d["gpu"] == "mine" and d["peak_flops"] == 100e12 and d["price_per_gpu_hour"] == 1.0
    assert d["training"]["gpu_hours"] == pytest.approx(6e19 / (100e12 * 0.5) / 3600)


def test_diag_cost_does_not_import_torch_or_textual():
    code = ("import sys; from diag.cli import main; "
            "rc = main(['cost', '--params', '7B', '--tokens', '1T', '--compare', 'H100x8,A100x8']); "
            "print('torch' in sys.modules, 'textual' in sys.modules, rc, file=sys.stderr)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert p.stderr.strip().splitlines()[-1] == "False False 0", p.stderr
