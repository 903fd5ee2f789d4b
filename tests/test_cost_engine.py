"""Cost engine on hand-built Evidence: from_evidence, estimate_measured, compare, phases, cost.mfu."""
from __future__ import annotations

import pytest

from diag.cost import (CostError, compare, estimate, estimate_measured, from_evidence, load_catalog, parse_phases,
                       parse_quantity, parse_target, plan_phases)
from diag.cost.measured import summarize, timed_totals
from diag.evidence import DataLoaderInfo, Evidence, RankEvidence, StepRecord
from diag.findings import Severity
from diag.registry import Registry

CAT = load_catalog(user=False)
H100_BF16 = 989e12


def _evidence(*, flops=6e12, fwd=None, step_s=0.05, samples=8, tokens=8 * 2048, device="cuda",
              device_name="NVIDIA H100 80GB HBM3", gpu="h100-sxm", precision="bf16", peak=H100_BF16,
              dataset_len=80_000, steps=10, recompute=False, data_s=0.0, world_size=1, params=1e8):
    fwd = fwd if fwd is not None else flops / 3
    r = RankEvidence(rank=0, world_size=world_size)
    for i in range(1, steps + 1):
        ins = i == 3
        r.steps.append(StepRecord(index=i, total_s=step_s * (3 if ins else 1) * (2 if i == 1 else 1),
                                  data_s=data_s, forward_s=step_s * 0.3, backward_s=step_s * 0.6,
                                  samples=samples, tokens=tokens, instrumented=ins))
    r.dataloaders.append(DataLoaderInfo(id=1, batch_size=samples, dataset_len=dataset_len))
    r.flops = {"measured": {
        "step": 3, "flops": flops, "model_flops": 3 * fwd if recompute else flops, "forward_flops": fwd,
        "backward_flops": flops - fwd, "recompute_detected": recompute, "samples": samples, "tokens": tokens,
        "n_forward": 1, "params": params, "precision": precision, "device": device, "device_name": device_name,
        "gpu": gpu, "peak_flops": peak, "peak_note": None if peak else "CPU run: the catalogue has no CPU peaks",
        "world_size": world_size, "compiled": False,
    }}
    ev = Evidence(ranks=[r])
    return ev


# ---- measured summary -----------------------------------------------------------------------------

def test_summarize_excludes_instrumented_and_first_step():
    ev = _evidence()
    r = ev.primary
    totals = timed_totals((s.index, s.total_s, s.instrumented) for s in r.steps)
    assert len(totals) == 8 and set(totals) == {0.05}
    s = summarize(r.flops["measured"], totals, [0.15])
    assert s["step_s"] == 0.05
    assert s["mfu"] == pytest.approx(6e12 / 0.05 / H100_BF16)
    assert s["tokens_per_s"] == pytest.approx(8 * 2048 / 0.05)
    assert s["overhead_ratio"] == pytest.approx(2.0)


def test_from_evidence_and_same_gpu_extrapolation():
    m = from_evidence(_evidence())
    assert m.unit == "tokens" and m.units_per_step == 8 * 2048 and m.step_s == 0.05
    assert m.mfu == pytest.approx(0.1213, abs=1e-4) and m.gpu == "h100-sxm"
    assert m.units_per_epoch == 80_000 * 2048
    e = estimate_measured(m, epochs=2, catalog=CAT)
    tokens = 2 * 80_000 * 2048
    assert e.training.units == tokens
    assert e.training.gpu_hours == pytest.approx(tokens / (8 * 2048 / 0.05) / 3600)
    assert e.mfu == pytest.approx(m.mfu) and "measured" in e.mfu_basis
    assert e.price_per_gpu_hour == CAT.get("h100").price.usd_per_hour
    e8 = estimate_measured(m, epochs=2, count=8, catalog=CAT)
    assert e8.wall_hours == pytest.approx(e.wall_hours / 8)
    assert e8.gpu_hours == pytest.approx(e.gpu_hours)


def test_from_evidence_judges_the_peak_from_the_recorded_device_name():
    """Schema 2: the probe stores no peak; diag cost looks it up as the cost.mfu check does."""
    from diag.checks.api import flops_summary

    ev = _evidence(gpu=None, peak=None)
    del ev.primary.flops["measured"]["peak_note"]
    m = from_evidence(ev)
    assert m.gpu == "h100-sxm" and m.peak_flops == pytest.approx(H100_BF16, rel=0.01)
    assert m.mfu == pytest.approx(flops_summary(ev.primary)[1]["mfu"]) and m.mfu == pytest.approx(0.1213, abs=2e-3)


def test_other_gpu_uses_measured_flops_and_mfu():
    m = from_evidence(_evidence())
    e = estimate_measured(m, tokens=1e9, gpu="A100", count=4, catalog=CAT)
    flops = 6e12 / (8 * 2048) * 1e9
    assert e.training.flops == pytest.approx(flops)
    assert e.training.gpu_hours == pytest.approx(flops / (312e12 * m.mfu) / 3600)
    assert "carry over" in e.mfu_basis
    e2 = estimate_measured(m, tokens=1e9, gpu="A100", count=4, mfu=0.5, catalog=CAT)
    assert e2.mfu == 0.5 and e2.mfu_basis == "given"


def test_cpu_measured_run_assumes_epoch_default_on_gpu():
    ev = _evidence(device="cpu", device_name=None, gpu=None, peak=None, precision="fp32", tokens=None,
                   samples=32)
    m = from_evidence(ev)
    assert m.mfu is None and m.unit == "samples"
    e = estimate_measured(m, samples=1e6, gpu="L4", catalog=CAT)
    assert e.mfu == 0.40 and "assumed" in e.mfu_basis and "non-language" in e.mfu_basis
    assert e.precision == "fp32" and any("--precision bf16" in n for n in e.notes)
    with pytest.raises(CostError, match="no token ids"):
        estimate_measured(m, tokens=1e9, catalog=CAT)
    same = estimate_measured(m, samples=3200, catalog=CAT)
    assert same.gpu == "cpu" and same.training.gpu_hours == pytest.approx(3200 / (32 / 0.05) / 3600)


def test_from_evidence_errors_are_one_sentence():
    with pytest.raises(CostError, match="no FLOP measurement"):
        from_evidence(Evidence(ranks=[RankEvidence()]))
    ev = _evidence()
    ev.primary.flops["measured"]["flops"] = 0
    with pytest.raises(CostError, match="counted no FLOPs"):
        from_evidence(ev)
    ev = _evidence(steps=3)
    ev.primary.steps = [s for s in ev.primary.steps if s.instrumented]
    with pytest.raises(CostError, match="no timed step"):
        from_evidence(ev)
    m = from_evidence(_evidence(dataset_len=None))
    with pytest.raises(CostError, match="dataset size is unknown"):
        estimate_measured(m, epochs=1, catalog=CAT)
    with pytest.raises(CostError, match="exactly one"):
        estimate_measured(m, catalog=CAT)


# ---- compare and phases ---------------------------------------------------------------------------

@pytest.mark.parametrize("spec, out", [("H100x8", ("H100", 8)), ("8xH100", ("H100", 8)), ("A100:16", ("A100", 16)),
                                       ("MI300X", ("MI300X", 1)), ("MI300Xx4", ("MI300X", 4)),
                                       ("rtx-4090x2", ("rtx-4090", 2)), ("L4", ("L4", 1))])
def test_parse_target(spec, out):
    assert parse_target(spec) == out


def test_compare_orders_and_prices_per_gpu():
    rows = compare("H100x8,A100x16,T4x64", 7e9, 140e9, catalog=CAT)
    assert [r.gpu for r in rows] == ["h100-sxm", "a100-80gb", "t4"]
    assert rows[2].precision == "fp16"                       # T4 has no bf16: its best dense rate
    for r in rows:
        assert r.training.flops == pytest.approx(6 * 7e9 * 140e9)
        assert r.cost == pytest.approx(r.gpu_hours * CAT.gpus[r.gpu].price.usd_per_hour)


def test_phases_default_and_custom():
    plan = plan_phases("", 1e9, 20e9, "H100", 8, 0.4, catalog=CAT)
    assert [p.name for p, _ in plan.phases] == ["explore", "tune", "full"]
    full = estimate(1e9, 20e9, "H100", 8, 0.4, catalog=CAT)
    # 4 runs at 10% + 2 at 50% + 1 at 100% = 2.4 full runs
    assert plan.gpu_hours == pytest.approx(2.4 * full.gpu_hours)
    assert plan.cost == pytest.approx(2.4 * full.cost)
    ph = parse_phases("smoke:1%x3@L4x1, sweep:0.2x5, final:100%")
    assert (ph[0].fraction, ph[0].runs, ph[0].gpu, ph[0].count) == (0.01, 3, "L4", 1)
    plan = plan_phases(ph, 1e9, 20e9, "H100", 8, 0.4, catalog=CAT)
    assert plan.phases[0][1].gpu == "l4" and plan.phases[1][1].gpu == "h100-sxm"
    for bad in ("explore", "explore:0", "explore:1.5", "x:0.1x0"):
        with pytest.raises(CostError):
            parse_phases(bad)


def test_parse_quantity_suffixes():
    assert parse_quantity("7B", "params") == 7e9
    assert parse_quantity("1.4T", "tokens") == 1.4e12
    assert parse_quantity("300e9", "tokens") == 3e11
    assert parse_quantity("1,000", "x") == 1000
    for bad in ("-1", "0", "nan", "inf", "abc", "7Q"):
        with pytest.raises(CostError):
            parse_quantity(bad, "params")


def test_memory_note_when_model_state_does_not_fit():
    e = estimate(70e9, 1e12, "A100", 8, 0.4, catalog=CAT)     # 70B x 16 B = 1120 GB > 640 GB
    assert any("exceeds the memory" in n for n in e.notes)
    assert not any("exceeds" in n for n in estimate(7e9, 1e12, "A100", 8, 0.4, catalog=CAT).notes)


def test_estimate_to_dict_is_json_ready():
    import json

    d = estimate(1e9, 1e10, "H100", 2, 0.4, eval_tokens=1e8, catalog=CAT).to_dict()
    json.dumps(d, allow_nan=False)
    assert d["total_cost"] == pytest.approx(d["training"]["cost"] + d["eval"]["cost"])
    assert d["eval"]["flops"] == pytest.approx(2 * 1e9 * 1e8)


# ---- the check ------------------------------------------------------------------------------------

def _mfu_findings(ev):
    reg = Registry.discover().select(["cost.mfu"])
    return reg.run(ev)


def test_cost_mfu_low_is_a_warning_with_typical_runs_and_a_lever():
    # 12% MFU on an H100 in bf16, with a quarter of the step waiting for data
    ev = _evidence(data_s=0.0125)
    (f,) = _mfu_findings(ev)
    assert f.severity is Severity.WARNING and f.title == "Low model FLOPs utilisation"
    assert "12% MFU" in f.message and "H100" in f.message
    assert "Llama 3 405B on H100 38%-43%" in f.message
    assert "waits 25%" in f.message and "num_workers" in f.snippet
    assert f.evidence["mfu"] == pytest.approx(0.1213, abs=1e-4)
    assert f.evidence["typical"][0]["source"]


def test_cost_mfu_good_run_is_info():
    ev = _evidence(flops=6e12, step_s=0.012)                   # ~50% MFU
    (f,) = _mfu_findings(ev)
    assert f.severity is Severity.INFO and "51% MFU" in f.message


def test_cost_mfu_fp32_suggests_autocast():
    ev = _evidence(precision="fp32", peak=67e12, flops=6e11, step_s=0.05)
    (f,) = _mfu_findings(ev)
    assert "autocast" in f.snippet and "fp32" in f.message


def test_cost_mfu_recompute_reports_hfu():
    ev = _evidence(flops=8e12, fwd=2e12, recompute=True, step_s=0.012)
    (f,) = _mfu_findings(ev)
    assert f.evidence["hfu"] > f.evidence["mfu"]
    assert "HFU" in f.message


def test_cost_mfu_above_100_percent_blames_the_catalogue():
    ev = _evidence(flops=6e14, step_s=0.05)
    (f,) = _mfu_findings(ev)
    assert f.severity is Severity.WARNING and "catalogue" in f.message


def test_cost_mfu_skips_with_reasons():
    (f,) = _mfu_findings(_evidence(device="cpu", device_name=None, gpu=None, peak=None, precision="fp32"))
    assert f.severity is Severity.SKIPPED and "CPU" in f.message and f.evidence["achieved_tflops"] > 0
    ev = Evidence(ranks=[RankEvidence()])
    ev.primary.flops = {"status": "the run ended after 2 step(s), before step 3 finished"}
    (f,) = _mfu_findings(ev)
    assert f.severity is Severity.SKIPPED and "before step 3" in f.message
    (f,) = _mfu_findings(Evidence(ranks=[RankEvidence()]))
    assert f.severity is Severity.SKIPPED and "not measured" in f.message
    (f,) = _mfu_findings(Evidence())
    assert f.severity is Severity.SKIPPED
