"""Cost engine: formulas (with the GPT-3 worked example) and the GPU catalogue. Pure Python, fast."""
from __future__ import annotations

import math

import pytest

from diag.cost import formulas as f
from diag.cost.catalog import PRECISIONS, CatalogError, load_catalog

GPT3_N = 175e9
GPT3_D = 300e9


# ---- formulas -------------------------------------------------------------------------------------

def test_gpt3_training_flops():
    # 6 x 175e9 x 300e9 = 3.15e23 (GPT-3 paper, table D.1: 3.14e23)
    assert f.training_flops(GPT3_N, GPT3_D) == pytest.approx(3.15e23, rel=1e-12)


@pytest.mark.parametrize("mfu, hours", [(0.30, 934_800), (0.40, 701_100), (0.50, 560_900)])
def test_gpt3_gpu_hours_on_a100(mfu, hours):
    flops = f.training_flops(GPT3_N, GPT3_D)
    gh = f.gpu_hours(flops, 312e12, mfu)
    assert gh == pytest.approx(hours, abs=100)   # the rounded figures


def test_gpt3_days_on_1024_gpus():
    gh = f.gpu_hours(f.training_flops(GPT3_N, GPT3_D), 312e12, 0.30)
    assert f.wall_days(gh, 1024) == pytest.approx(38.0, abs=0.1)


def test_eval_is_a_third_of_training():
    assert f.eval_flops(1e9, 1e6) == pytest.approx(2e15)
    assert f.eval_flops(1e9, 1e6) * 3 == pytest.approx(f.training_flops(1e9, 1e6))


def test_palm_attention_term():
    # PaLM appendix B: 6N + 12*L*H*Q*T per token
    N, L, H, Q, T = 1e9, 24, 16, 128, 2048
    per_tok = f.training_flops_per_token(N, n_layers=L, n_heads=H, head_dim=Q, seq_len=T)
    assert per_tok == pytest.approx(6 * N + 12 * L * H * Q * T)
    assert f.eval_flops(N, 1, n_layers=L, n_heads=H, head_dim=Q, seq_len=T) == pytest.approx(2 * N + 4 * L * H * Q * T)
    with pytest.raises(ValueError, match="needs all of"):
        f.training_flops_per_token(N, n_layers=L)


def test_recomputation_hardware_flops_and_hfu():
    model = f.training_flops(1e9, 1e9)
    hw = f.hardware_flops(1e9, 1e9, recompute="full")
    assert hw == pytest.approx(8e18) and model == pytest.approx(6e18)
    assert f.hardware_flops(1e9, 1e9) == model
    assert f.hfu_from_mfu(0.45, "full") == pytest.approx(0.60)
    assert f.hfu_from_mfu(0.45) == pytest.approx(0.45)
    # the same wall time from either pair: model FLOPs with MFU, hardware FLOPs with HFU
    assert f.gpu_seconds(model, 1e15, 0.45) == pytest.approx(f.gpu_seconds(hw, 1e15, 0.60))


def test_chinchilla():
    assert f.chinchilla_tokens(70e9) == pytest.approx(1.4e12)


def test_money():
    assert f.money(100.0, 2.5) == pytest.approx(250.0)
    assert f.money(100.0, None) is None


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "x"])
def test_formulas_reject_bad_numbers(bad):
    with pytest.raises(ValueError):
        f.training_flops(bad, 1e9)


@pytest.mark.parametrize("bad", [0, -0.1, 1.01, 30, float("nan")])
def test_mfu_must_be_a_fraction(bad):
    with pytest.raises(ValueError):
        f.gpu_hours(1e20, 312e12, bad)


# ---- catalogue --------------------------------------------------------------------------------------

REQUIRED = ["t4", "v100-sxm2", "a10g", "l4", "l40s", "a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie",
            "h200", "b200", "rtx-3090", "rtx-4090", "mi250x", "mi300x"]


def test_builtin_catalogue_has_the_gpus_with_sources():
    cat = load_catalog(user=False)
    for gid in REQUIRED:
        g = cat.gpus[gid]
        assert g.memory_gb and g.bandwidth_tbs, gid
        assert g.source and g.source.startswith("http"), gid
        assert g.tflops, gid
        assert set(g.tflops) <= set(PRECISIONS)
        if g.price is not None:
            assert g.price.usd_per_hour > 0 and g.price.as_of and g.price.source, gid
    # at least the list carries prices, except where no public on-demand price exists
    priced = {g.id for g in cat if g.price}
    assert set(REQUIRED) - priced == {"mi250x"}


def test_dense_figures_not_sparse():
    cat = load_catalog(user=False)
    assert cat.get("A100").peak_tflops("bf16") == 312      # sparse would be 624
    assert cat.get("H100").peak_tflops("bf16") == 989      # sparse 1979
    assert cat.get("H100").peak_tflops("fp8") == 1979      # sparse 3958
    assert cat.get("L40S").peak_tflops("fp8") == 733       # sparse 1466
    assert cat.get("T4").peak_tflops("bf16") is None       # Turing has no bf16: N/A, not 0
    assert cat.get("MI250X").peak_tflops("bf16", per="device") == pytest.approx(191.5)


def test_lookup_by_alias_and_device_name():
    cat = load_catalog(user=False)
    assert cat.get("a100").id == "a100-80gb"
    assert cat.get("H100 SXM").id == "h100-sxm"
    assert cat.get("rtx4090").id == "rtx-4090"
    assert cat.match_device("NVIDIA A100-SXM4-40GB").id == "a100-40gb"
    assert cat.match_device("NVIDIA H100 80GB HBM3").id == "h100-sxm"
    assert cat.match_device("NVIDIA L40S").id == "l40s"      # not L4
    assert cat.match_device("NVIDIA L4").id == "l4"
    assert cat.match_device("Tesla T4").id == "t4"
    assert cat.match_device("AMD Instinct MI250X/MI250").id == "mi250x"
    assert cat.match_device("Intel Arc") is None


def test_unknown_gpu_suggests_close_matches():
    cat = load_catalog(user=False)
    with pytest.raises(CatalogError) as e:
        cat.get("H10")
    assert "did you mean h100-sxm" in e.value.message


def test_user_file_overrides_and_adds(tmp_path):
    p = tmp_path / "gpus.toml"
    p.write_text(
        "[gpu.a100.price]\nusd_per_hour = 1.10\nsource = \"our contract\"\nas_of = \"2026-01\"\n"
        "[gpu.my-gpu]\nname = \"Lab GPU\"\nmemory_gb = 48\n[gpu.my-gpu.tflops]\nbf16 = 100\n"
    )
    cat = load_catalog(p)
    a = cat.get("a100")
    assert a.id == "a100-80gb" and a.price.usd_per_hour == 1.10 and a.price.source == "our contract"
    assert a.peak_tflops("bf16") == 312                       # untouched fields kept
    assert a.origin == str(p)
    assert cat.get("Lab GPU").peak_tflops("bf16") == 100
    assert str(p) in cat.sources


def test_default_user_location(tmp_path, monkeypatch):
    monkeypatch.delenv("DIAG_GPU_CATALOG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "diag").mkdir()
    (tmp_path / "diag" / "gpus.toml").write_text("[gpu.t4.price]\nusd_per_hour = 0.11\n")
    cat = load_catalog()
    assert cat.get("t4").price.usd_per_hour == 0.11
    assert cat.get("t4").price.as_of    # filled from the file's date
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "none"))
    assert load_catalog().get("t4").price.usd_per_hour == 0.59   # no file there: built-in only


@pytest.mark.parametrize("text, line, words", [
    ("[gpu.x]\nname = \"X\"\nmemory_gb = \n", 3, "not valid TOML"),
    ("[gpu.x]\nname = \"X\"\n\n[gpu.x.tflops]\nbf16 = \"fast\"\n", 5, "tflops.bf16"),
    ("[gpu.x]\nname = \"X\"\n[gpu.x.tflops]\nint4 = 10\n", 4, "unknown precision"),
    ("[gpu.x]\nnmae = \"X\"\n", 2, "did you mean 'name'"),
    ("[gpu.x.price]\nusd_per_hour = -2\n", 2, "usd_per_hour"),
])
def test_broken_user_file_names_the_line(tmp_path, text, line, words):
    p = tmp_path / "bad.toml"
    p.write_text(text)
    with pytest.raises(CatalogError) as e:
        load_catalog(p)
    msg = e.value.message
    assert f"line {line}" in msg and words in msg and str(p) in msg
    assert "\n" not in msg


def test_missing_explicit_file(tmp_path):
    with pytest.raises(CatalogError, match="does not exist"):
        load_catalog(tmp_path / "nope.toml")


def test_no_torch_in_cost_engine():
    import subprocess
    import sys

    code = ("import sys, diag.cost.formulas, diag.cost.catalog; diag.cost.catalog.load_catalog(user=False); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_gpt3_example_numbers_are_consistent_with_catalogue():
    cat = load_catalog(user=False)
    peak = cat.get("A100").peak_flops("bf16")
    assert math.isclose(f.gpu_hours(3.15e23, peak, 0.3), 934_829, rel_tol=1e-5)
