"""The public check API (diag.checks.api), diag.units and diag.testing."""
from __future__ import annotations

import pytest

from diag import units
from diag.checks import api
from diag.findings import Severity
from diag.registry import Registry
from diag.testing import EvidenceBuilder, run_check


def test_units_formatters():
    assert units.fmt_bytes(1.5 * units.GiB) == "1.50 GiB" and units.fmt_bytes(312 * units.MiB) == "312 MiB"
    assert units.fmt_bytes(-2 * units.MiB, signed=True) == "-2 MiB" and units.fmt_bytes(3 * units.MiB, signed=True) == "+3 MiB"
    assert units.fmt_bytes(1.5 * units.GiB, style="short") == "1.5 GiB" and units.fmt_bytes(300 * units.GiB, style="short") == "300 GiB"
    assert units.fmt_bytes(512 * units.MiB, style="gib") == "512 MiB"
    assert units.fmt_bytes(3.4 * units.MiB, style="precise") == "3.4 MiB" and units.fmt_bytes(512, style="precise") == "512 B"
    assert units.fmt_bytes(None) == "N/A"
    assert units.fmt_seconds(2.345) == "2.35 s" and units.fmt_seconds(0.0125) == "12.5 ms"
    assert units.fmt_seconds(12.34, fine=True) == "12.3 s" and units.fmt_seconds(0.00042, fine=True) == "0.42 ms"
    assert units.fmt_pct(0.42) == "42%" and units.fmt_pct(0.005) == "0.5%" and units.fmt_pct(0.1234, digits=1) == "12.3%"
    assert units.fmt_pct(0.042, style="cost") == "4.2%" and units.fmt_pct(None) == "N/A"
    assert units.fmt_sci(1.234e18) == "1.23e18" and units.fmt_sci("x") == "N/A"
    assert units.fmt_flops(2e18) == "2e18 FLOPs" and units.fmt_flops(312e12, per_second=True) == "312.0 TFLOPS"
    assert units.fmt_hours(1234) == "1,234" and units.fmt_hours(0.0001, style="compact") == "<0.001"
    assert units.fmt_hours(2.5e6, style="compact") == "2.50M" and units.fmt_count(1.2e6) == "1.2M"
    with pytest.raises(ValueError):
        units.fmt_bytes(1, style="nope")


def test_the_api_re_exports_the_formatters_and_is_versioned():
    assert api.fmt_bytes is units.fmt_bytes and api.fmt_seconds is units.fmt_seconds
    major, minor = api.API_VERSION.split(".")
    assert major.isdigit() and minor.isdigit()
    for name in api.__all__:
        assert hasattr(api, name), name


def test_unknown_severity_is_refused_at_declaration():
    with pytest.raises(ValueError):
        api.check(id="t.x", title="x", severity="fatal")


def test_a_check_may_return_one_finding_a_list_or_nothing():
    @api.check(id="t.one", title="one")
    def one(ctx):
        return ctx.finding("m", "info", evidence={"n": 1})

    @api.check(id="t.many", title="many")
    def many(ctx):
        return [ctx.passed("a"), ctx.skip("b")]

    @api.check(id="t.none", title="none")
    def none(ctx):
        return None

    ev = EvidenceBuilder().build()
    (f,) = run_check(one, ev)
    assert (f.id, f.title, f.severity, f.evidence) == ("t.one", "one", Severity.INFO, {"n": 1})
    assert [g.severity for g in run_check(many, ev)] == [Severity.PASS, Severity.SKIPPED]
    assert run_check(none, ev) == [] and none(ev) == []


def _mfu_evidence(device_name: str, stored_peak: float | None):
    ev = (EvidenceBuilder().cuda_training(device=device_name).steps(10, total_s=0.5, samples=64)
          .section("flops", status="measured step 3", measured={
              "step": 3, "flops": 1.2e14, "model_flops": 1.2e14, "forward_flops": 4e13, "backward_flops": 8e13,
              "precision": "bf16", "device": "cuda", "device_name": device_name, "world_size": 1,
              **({"peak_flops": stored_peak, "gpu": "old"} if stored_peak else {})})
          .build())
    return ev


def test_mfu_is_judged_in_diag_from_the_recorded_device_name():
    gpu_id, peak, _ = api.peak_flops("NVIDIA H100 80GB HBM3", "bf16")
    assert gpu_id and peak and peak > 1e14
    reg = Registry.discover(load_plugins=False).select(["cost.mfu"])
    # no peak stored by the probe (schema 2): diag looks it up
    (f,) = [x for x in reg.run(_mfu_evidence("NVIDIA H100 80GB HBM3", None)) if x.id == "cost.mfu"]
    assert f.severity in (Severity.WARNING, Severity.INFO)
    assert f.evidence["peak_tflops"] == pytest.approx(peak / 1e12)
    assert f.evidence["mfu"] == pytest.approx(1.2e14 / 0.5 / peak, rel=1e-6)
    # a wrong peak stored by an older probe (schema 1) is re-judged with the catalogue
    (g,) = [x for x in reg.run(_mfu_evidence("NVIDIA H100 80GB HBM3", 1e12)) if x.id == "cost.mfu"]
    assert g.evidence["peak_tflops"] == pytest.approx(peak / 1e12)
    # a device the catalogue does not know: the stored peak (schema 1) is the fallback
    (h,) = [x for x in reg.run(_mfu_evidence("Mystery Accelerator 9000", 5e14)) if x.id == "cost.mfu"]
    assert h.evidence["peak_tflops"] == pytest.approx(500.0)
    (k,) = [x for x in reg.run(_mfu_evidence("Mystery Accelerator 9000", None)) if x.id == "cost.mfu"]
    assert k.severity is Severity.SKIPPED and "not in the GPU catalogue" in k.message
