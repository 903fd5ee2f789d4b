"""diag.compare on hand-built Evidence: the steady-state rule, metrics, thresholds, attribution,
findings diff, guards and every renderer (fast: no script runs)."""
import json

import numpy as np
import pytest

from diag.compare import extract
import functools

from diag.compare import core
from diag.compare.core import parse_thresholds

# these tests judge the statistics on one run per side: gated as on a machine whose run-to-run noise is
# known (--min-runs 1); the default refusal to gate one run per side is tested in test_compare_core.py
compare = functools.partial(core.compare, min_runs=1)
from diag.errors import DiagError
from diag.evidence import DeviceInfo, Evidence, ModelInfo, RankEvidence, StepRecord
from diag.report import compare as rc


H100 = "NVIDIA H100 80GB HBM3"
H100_BF16 = 989e12     # dense bf16 FLOP/s, checked against the catalogue in test_mfu_is_judged_in_diag


def _evidence(n=60, backward=0.004, seed=0, script="/w/train.py", batch=16, instrumented=(3,),
              persistent=1000, device="cpu", gpu=None, torch="2.13.0", mfu=None, first_t=2.0):
    rng = np.random.default_rng(seed)
    ev = Evidence()
    ev.run.script = script
    ev.run.status = "completed"
    ev.environment.torch = torch
    if gpu:
        ev.environment.cuda_available = True
        ev.environment.devices = [DeviceInfo(name=gpu)]
    r = RankEvidence()
    r.models = [ModelInfo(devices=[device])]
    for i in range(1, n + 1):
        ph = {"data_s": 0.002, "forward_s": 0.004, "backward_s": backward, "optimizer_s": 0.001,
              "other_s": 0.001}
        ph = {k: v * (1 + rng.normal(0, 0.02)) for k, v in ph.items()}
        if i == 1:
            ph["forward_s"] += 0.5                      # warm-up
        if i in instrumented:
            ph["backward_s"] += 1.0                     # FLOP counting
        r.steps.append(StepRecord(index=i, t=first_t + 0.01 * i, total_s=sum(ph.values()), samples=batch,
                                  instrumented=i in instrumented, **ph))
    r.step_stats.count = n
    r.memory = {"persistent": {"params": persistent, "grads": persistent, "optimizer_state": 0}}
    if mfu:
        # what the probe records (schema 2): FLOPs and the device's name; diag judges the MFU. The
        # FLOPs are chosen for an MFU of about `mfu` at the nominal 12 ms step on an H100's bf16 peak.
        r.flops = {"measured": {"flops": mfu * H100_BF16 * 0.012, "model_flops": mfu * H100_BF16 * 0.012,
                                "precision": "bf16", "device": "cuda", "device_name": H100}}
    ev.ranks.append(r)
    return ev


def _sample(ev, findings=(), source="x"):
    return extract.from_export(extract.export(ev), source, list(findings))


def test_steady_state_drops_warmup_and_instrumented_steps_alike():
    s = _sample(_evidence(n=60))
    # one steady-steps rule for every reader (issue 28, diag/evidence/phases.py): the warm-up is the
    # first step and the slow steps among the first 10%; only step 1 is slow here (was: always 10%, 6)
    assert s.excluded == {"warmup": 1, "instrumented": 1}
    assert s.steady == 58
    assert s.steps["total_s"].max() < 0.1              # neither the warm-up nor the FLOP step is in
    assert extract.warmup_count(3) == 0 and extract.warmup_count(5) == 1 and extract.warmup_count(1000) == 20


def test_same_evidence_twice_is_unchanged_and_exit_0():
    c = compare([_sample(_evidence(seed=1))], [_sample(_evidence(seed=2))])
    assert c.exit_code == 0
    assert c.metric("step_time").verdict == "unchanged"
    assert "not significant" in c.headline


def test_a_backward_slowdown_is_a_regression_attributed_to_backward():
    c = compare([_sample(_evidence(seed=1))], [_sample(_evidence(seed=2, backward=0.007))])
    m = c.metric("step_time")
    assert m.verdict == "regression" and c.exit_code == 1
    assert 0.2 < m.change < 0.35 and m.low > 0.05
    assert [a["phase"] for a in c.attribution] == ["backward"]
    assert "backward +3.0 ms" in c.headline
    assert c.metric("samples_per_s").verdict == "regression"
    # the same as an improvement the other way round
    c = compare([_sample(_evidence(seed=2, backward=0.007))], [_sample(_evidence(seed=1))])
    assert c.exit_code == 0 and "step_time" in [m.key for m in c.improvements]


def test_thresholds_per_metric():
    t = parse_thresholds(["step=10%,memory=20%", "mfu=3"])
    assert t["step"] == 0.10 and t["memory"] == 0.20 and t["mfu"] == 0.03 and t["throughput"] == 0.05
    assert parse_thresholds(["2%"])["memory"] == 0.02
    for bad in ("fast", "speed=5%", "step=-1%"):
        with pytest.raises(DiagError):
            parse_thresholds([bad])
    c = compare([_sample(_evidence(seed=1))], [_sample(_evidence(seed=2, backward=0.0045))],
                thresholds=parse_thresholds(["step=40%,throughput=40%"]))
    assert c.exit_code == 0 and c.metric("step_time").verdict in ("worse", "unchanged")


def test_memory_growth_and_mfu():
    a = _sample(_evidence(seed=1, mfu=0.40))
    b = _sample(_evidence(seed=2, persistent=1500, mfu=0.30))
    c = compare([a], [b], thresholds=parse_thresholds(["memory=10%,mfu=3%"]))
    mem = c.metric("persistent_memory")
    assert mem.verdict == "regression" and abs(mem.change - 0.5) < 1e-9
    mfu = c.metric("mfu")
    assert mfu.method == "from step time" and mfu.verdict == "regression"
    assert set(c.to_dict()["regressions"]) == {"persistent_memory", "mfu"}


def test_mfu_is_judged_in_diag_as_the_cost_check_does():
    """The probe records FLOPs and the device name only: compare computes the MFU in diag's process
    with the catalogue, through the same function as the cost.mfu check (flops_summary)."""
    from diag.checks.api import flops_summary, peak_flops

    assert peak_flops(H100, "bf16")[1] == pytest.approx(H100_BF16, rel=0.01)
    ev = _evidence(seed=1, mfu=0.40)
    scal = extract.export(ev)["scalars"]
    _m, summary = flops_summary(ev.primary)
    assert scal["mfu"] == pytest.approx(summary["mfu"]) and 0.3 < scal["mfu"] < 0.5
    # a device the catalogue does not know: no MFU, never a made-up one
    ev.primary.flops["measured"]["device_name"] = "Imaginary GPU 9000"
    assert extract.export(ev)["scalars"]["mfu"] is None


def test_findings_diff_new_gone_changed():
    fa = [{"id": "a.gone", "severity": "warning", "message": "m"}, {"id": "b.same", "severity": "info"},
          {"id": "c.sev", "severity": "info"}, {"id": "p.pass", "severity": "pass"}]
    fb = [{"id": "b.same", "severity": "info"}, {"id": "c.sev", "severity": "error"},
          {"id": "probe.overhead", "severity": "warning", "message": "diag's probe took 2.1%"},
          {"id": "d.new", "severity": "warning", "message": "new sync",
           "location": {"file": "/w/train.py", "line": 88}}]
    c = compare([_sample(_evidence(seed=1), fa)], [_sample(_evidence(seed=2, backward=0.007), fb)])
    # probe.overhead is about diag's probe, not the job: never a new finding of the job
    assert [f["id"] for f in c.findings["new"]] == ["d.new"]
    assert c.findings["new"][0]["location"] == "train.py:88"
    assert [f["id"] for f in c.findings["gone"]] == ["a.gone"]
    assert c.findings["changed"][0]["severity_before"] == "info"
    text = rc.render_annotations(c)
    assert "::warning file=train.py,line=88,title=new finding d.new::new sync" in text
    assert text.splitlines()[0].startswith("::error title=diag compare%3A step time::step time +")


def test_guards_refuse_with_one_sentence_and_force_overrides():
    base = [_sample(_evidence(seed=1))]
    cases = [(dict(batch=32), "batch sizes differ (16 vs 32)"),
             (dict(device="cuda:0"), "devices differ (cpu vs cuda)"),
             (dict(gpu="NVIDIA H100"), "GPU models differ (none vs NVIDIA H100)")]
    for kw, words in cases:
        with pytest.raises(DiagError) as e:
            compare(base, [_sample(_evidence(seed=2, **kw))])
        assert words in e.value.message and e.value.message.count(".") <= 2
        c = compare(base, [_sample(_evidence(seed=2, **kw))], force=True)
        assert c.forced
    c = compare(base, [_sample(_evidence(seed=2, torch="2.14.0"))])
    assert {"fact": "torch", "base": "2.13.0", "new": "2.14.0", "blocking": False} in c.differences
    with pytest.raises(DiagError, match="steady-state"):
        compare(base, [_sample(_evidence(n=2, instrumented=()))])


def test_two_scripts_are_a_before_after_with_a_note():
    """issue 33: `diag compare before.json after.json` of two different scripts is the everyday
    before/after of a fix: compared, with a note, not refused."""
    c = compare([_sample(_evidence(seed=1))], [_sample(_evidence(seed=2, script="/w/train_fixed.py"))])
    assert any("scripts differ (train.py vs train_fixed.py)" in n and "before/after" in n for n in c.notes)
    assert {"fact": "script_name", "base": "train.py", "new": "train_fixed.py", "blocking": False} in c.differences
    assert c.to_dict()["notes"] == c.notes and not c.forced


def test_one_run_per_side_is_reported_not_gated():
    """issue 33: one run per side carries no measure of run-to-run variance (an unchanged makemore
    pair read +26%, CI +10..+65%, and -21% swapped): timing metrics are reported, not gated, exit 0,
    "not enough runs to judge" with the hint --runs; memory (deterministic) still gates; two runs per
    side gate."""
    from diag.report import compare as rc

    slow = _sample(_evidence(seed=2, backward=0.007, persistent=1000))
    c = core.compare([_sample(_evidence(seed=1))], [slow])
    m = c.metric("step_time")
    assert m.verdict == "regression" and not m.gated and c.exit_code == 0
    assert c.unjudged and "not enough runs to judge" in c.unjudged and "--runs" in c.unjudged
    assert "step time" in c.unjudged and "would have failed" in c.unjudged
    assert rc.status_line(c).startswith("NOT JUDGED: not enough runs to judge")
    assert c.to_dict()["judged"] is False and c.to_dict()["exit_code"] == 0
    assert "not enough runs to judge" in rc.render_markdown(c).splitlines()[0]
    # memory is gated from one run per side
    c = core.compare([_sample(_evidence(seed=1))], [_sample(_evidence(seed=2, persistent=2000))])
    assert c.exit_code == 1 and c.regressions[0].key == "persistent_memory"
    # two runs per side: not judged either (2v2 interleaved same-code pairs alarmed 3 times in 90 on a
    # loaded 2-core VM); three per side: judged
    two = core.compare([_sample(_evidence(seed=1)), _sample(_evidence(seed=3))],
                       [_sample(_evidence(seed=2, backward=0.007)), _sample(_evidence(seed=4, backward=0.007))])
    assert two.unjudged and two.exit_code == 0
    c = core.compare([_sample(_evidence(seed=s)) for s in (1, 3, 5)],
                     [_sample(_evidence(seed=s, backward=0.007)) for s in (2, 4, 6)])
    assert c.unjudged is None and c.exit_code == 1 and c.metric("step_time").gated


def test_repeats_per_side():
    a = [_sample(_evidence(seed=i)) for i in range(3)]
    b = [_sample(_evidence(seed=10 + i)) for i in range(3)]
    c = compare(a, b)
    m = c.metric("step_time")
    assert m.method == "repeats" and c.exit_code == 0
    assert c.noise["run_spread_base"] is not None


def test_renderers_roundtrip():
    c = compare([_sample(_evidence(seed=1))], [_sample(_evidence(seed=2, backward=0.007))])
    doc = json.loads(rc.render_json(c))
    assert doc["schema_version"] == 1 and doc["verdict"] == "regression" and doc["exit_code"] == 1
    assert {m["key"] for m in doc["metrics"]} >= {"step_time", "phase.backward", "samples_per_s",
                                                  "data_share", "persistent_memory", "time_to_first_step"}
    md = rc.render_markdown(c)
    rows = {r["metric"]: r for r in rc.parse_markdown_table(md)}
    assert rows["step time"]["verdict"] == "REGRESSION" and rows["step time"]["threshold"] == "5%"
    assert rows["· backward"]["change"] == "+3.0 ms"
    xml = rc.render_junit(c)
    xmlschema = pytest.importorskip("xmlschema")
    from pathlib import Path

    xmlschema.XMLSchema(str(Path(__file__).parent / "fixtures" / "schemas" / "junit-10.xsd")).validate(xml)
    assert xml.count("<failure") == 2


def test_loading_inputs(tmp_path):
    ev = _evidence(seed=1)
    ev.save(tmp_path / "evidence.json")
    s = extract.load(tmp_path)                         # a run directory
    assert s.steady == 58 and any(f["severity"] != "pass" for f in s.findings) is not None   # 53 before issue 28
    (tmp_path / "sarif.json").write_text(json.dumps({"$schema": "x", "version": "2.1.0", "runs": []}))
    with pytest.raises(DiagError, match="SARIF"):
        extract.load(tmp_path / "sarif.json")
    old = {"schema_version": 1, "tool": {"name": "diag"}, "findings": [], "run": {"evidence": None}}
    (tmp_path / "old.json").write_text(json.dumps(old))
    with pytest.raises(DiagError, match="predates diag compare"):
        extract.load(tmp_path / "old.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DiagError, match="no evidence.json"):
        extract.load(tmp_path / "empty")


def test_headline_names_the_new_findings_that_probably_caused_it():
    fb = [{"id": "sync.item", "severity": "warning", "message": "a host sync",
           "location": {"file": "/w/train.py", "line": 88}}, {"id": "cost.mfu", "severity": "info"}]
    c = compare([_sample(_evidence(seed=1))], [_sample(_evidence(seed=2, backward=0.007), fb)])
    assert c.headline.endswith("; new findings: sync.item at train.py:88")
    assert "backward +3.0 ms" in c.headline


def test_cuda_memory_peaks_allocator_and_device():
    def with_mem(ev, peak, reserved, nvml):
        ev.primary.memory["steps"] = [{"step": i, "allocated": peak // 2, "peak": peak * i // 3,
                                       "reserved": reserved, "reserved_peak": reserved} for i in (1, 2, 3)]
        ev.gpu = {"devices": [{"index": 0, "stats": {"run_mem_max": nvml}}]}
        return ev
    a = _sample(with_mem(_evidence(seed=1), 8 << 30, 10 << 30, 12 << 30))
    b = _sample(with_mem(_evidence(seed=2), 10 << 30, 11 << 30, 12 << 30))
    assert a.scalars["allocator_peak_bytes"] == 8 << 30 and a.scalars["device_peak_bytes"] == 12 << 30
    c = compare([a], [b], thresholds=parse_thresholds(["memory=10%"]))
    assert c.metric("allocator_peak").verdict == "regression" and abs(c.metric("allocator_peak").change - 0.25) < 1e-9
    assert c.metric("device_peak").verdict == "unchanged"
    assert rc.rows(c)[[r["key"] for r in rc.rows(c)].index("allocator_peak")]["base"] == "8.0 GiB"
    # simulated GPU telemetry never counts as a device peak
    ev = with_mem(_evidence(seed=3), 8 << 30, 1 << 30, 50 << 30)
    ev.gpu["simulated"] = True
    assert _sample(ev).scalars["device_peak_bytes"] == 1 << 30
