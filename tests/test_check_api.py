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


# ---- evidence sources: what a check can observe (probe vs attach) ------------------------------------

def _attach_evidence():
    ev = EvidenceBuilder().steps(5, total_s=0.1).build()
    ev.run.source = "attach"
    return ev


def test_a_check_judges_probe_evidence_by_default_and_is_skipped_on_sampled_evidence():
    calls = []

    @api.check(id="t.steps", title="steps", needs=["ranks.steps"])
    def steps(ctx):
        calls.append(1)
        return ctx.passed("fine")

    @api.check(id="t.telemetry", title="telemetry", needs=["gpu.devices"])
    def telemetry(ctx):
        return ctx.passed("fine")

    assert steps.judges == ("probe",) and telemetry.judges == ("probe", "attach")
    (f,) = run_check(steps, _attach_evidence())
    assert f.severity is Severity.SKIPPED and calls == []          # never called on what it cannot see
    assert f.message.startswith("Not observable by sampling") and "ranks.steps" in f.message
    assert f.evidence["reason"] == api.NOT_OBSERVABLE
    assert run_check(telemetry, _attach_evidence())[0].severity is Severity.PASS
    assert run_check(steps, EvidenceBuilder().build())[0].severity is Severity.PASS


def test_sources_are_validated_at_declaration():
    with pytest.raises(ValueError):
        api.check(id="t.bad", title="bad", sources=["py-spy"])
    with pytest.raises(ValueError):
        api.check(id="t.none", title="none", sources=[])


def test_a_variant_replaces_a_check_on_its_sources_through_the_registry():
    @api.check(id="t.x", title="X", needs=["ranks.steps"])
    def x(ctx):
        return ctx.finding("from the probe")

    @api.check(id="t.x-sampled", title="X (sampled)", sources=["attach"], replaces="t.x")
    def x_sampled(ctx):
        return ctx.finding("from samples", title="X")

    @api.check(id="t.only-sampled", title="only sampled", sources=["attach"])
    def only_sampled(ctx):
        return ctx.passed("seen")

    reg = Registry([x, x_sampled, only_sampled])
    on_attach = reg.run(_attach_evidence())
    assert [(f.id, f.check, f.message) for f in on_attach if f.id == "t.x"] == [("t.x", "t.x-sampled", "from samples")]
    assert [f.severity for f in on_attach if f.id == "t.only-sampled"] == [Severity.PASS]
    on_probe = reg.run(EvidenceBuilder().build())
    assert [(f.id, f.check, f.message) for f in on_probe if f.id == "t.x"] == [("t.x", "t.x", "from the probe")]
    (skip,) = [f for f in on_probe if f.id == "t.only-sampled"]
    assert skip.severity is Severity.SKIPPED and "diag attach" in skip.message
    # selecting the usual id takes the variant too; ignoring the variant leaves the usual check skipped
    assert {s.id for s in reg.select(["t.x"]).specs} == {"t.x", "t.x-sampled"}
    (alone,) = [f for f in reg.select(ignore=["t.x-sampled"]).run(_attach_evidence()) if f.id == "t.x"]
    assert alone.severity is Severity.SKIPPED and alone.check == "t.x"
    # the catalogue says what each check judges
    assert x_sampled.to_dict()["judges"] == ["attach"] and x_sampled.to_dict()["replaces"] == "t.x"


def test_builtin_attach_variants_answer_under_the_usual_ids():
    reg = Registry.discover(load_plugins=False)
    by_id = {s.id: s for s in reg.specs}
    for variant, usual in (("attach.dataloader-workers", "dataloader.workers"),
                           ("attach.sync-host-device", "sync.host-device"),
                           ("attach.gpu-low-utilization", "gpu.low-utilization"),
                           ("attach.distributed-straggler", "distributed.straggler")):
        assert by_id[variant].replaces == usual and by_id[variant].judges == ("attach",)
        assert "probe" in by_id[usual].judges
    assert by_id["run.hung"].judges == ("attach",) and by_id["gpu.lost"].judges == ("probe", "attach")
