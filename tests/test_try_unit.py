"""diag try, unit level: the judge on synthetic step times and losses, the knob choice, the budget,
the working-directory copy, the renderers, and the probe extension's knobs applied to real torch
objects (on the CPU) through a stand-in probe context."""
from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from diag.knobs import KNOBS, parse_spec
from diag.trial import judge as J
from diag.trial import plan as P
from diag.trial.engine import TryResult, allocate
from diag.trial.workdir import make_copy, tracker_env

# ---- judge ----------------------------------------------------------------------------------------


def _runs(rng, med, n_runs, n, noise=0.03):
    return [list(med * (1 + noise * rng.standard_normal(n))) for _ in range(n_runs)]


def test_clear_speedup_is_faster_with_an_interval_that_excludes_1():
    rng = np.random.default_rng(1)
    base = J.Side(_runs(rng, 0.100, 4, 8), losses=list(1 + 0.05 * rng.standard_normal(32)), samples=32)
    trial = J.Side(_runs(rng, 0.050, 4, 8), losses=list(1 + 0.05 * rng.standard_normal(32)), samples=32)
    t = J.judge(J.Trial("dataloader.workers=2", "restart"), base, trial)
    assert t.verdict == "faster", t
    assert 1.7 < t.speedup < 2.3 and t.ci_low > 1.0 and t.ci_high >= t.speedup
    assert t.samples_per_s == pytest.approx(32 / t.step_s)
    assert "faster" in t.why and "95%" in t.why


def test_same_distribution_is_no_change():
    rng = np.random.default_rng(2)
    calls = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        base = J.Side(_runs(rng, 0.100, 4, 8, noise=0.1))
        trial = J.Side(_runs(rng, 0.100, 4, 8, noise=0.1))
        t = J.judge(J.Trial("amp.bf16", "switch"), base, trial)
        calls += t.verdict == "faster"
        assert t.verdict in ("no change", "faster", "slower")
    assert calls <= 1     # a 95% interval and a 3% floor: rarely, never routinely


def test_trimmed_mean():
    assert J.trimmed_mean([1.0] * 9 + [100.0]) == 1.0          # one load spike in ten steps: trimmed
    assert J.trimmed_mean([1.0, 3.0]) == 2.0
    m = J.trimmed_mean(np.array([[1.0] * 9 + [100.0], [2.0] * 10]), axis=1)
    assert list(m) == [1.0, 2.0]


def test_tiny_significant_effect_is_no_change():
    base = J.Side([[0.100, 0.1001, 0.0999, 0.1, 0.1]] * 5)
    trial = J.Side([[0.099, 0.0991, 0.0989, 0.099, 0.099]] * 5)
    t = J.judge(J.Trial("k", "switch"), base, trial)
    assert t.speedup == pytest.approx(1.0101, rel=1e-3)
    assert t.verdict == "no change" and "under the 3%" in t.why


def test_slower():
    rng = np.random.default_rng(3)
    t = J.judge(J.Trial("compile", "restart"), J.Side(_runs(rng, 0.05, 3, 10)), J.Side(_runs(rng, 0.1, 3, 10)))
    assert t.verdict == "slower" and t.ci_high < 1


def test_nan_loss_breaks_even_when_faster():
    rng = np.random.default_rng(4)
    base = J.Side(_runs(rng, 0.1, 3, 8), losses=[1.0] * 24)
    trial = J.Side(_runs(rng, 0.05, 3, 8), losses=[1.0] * 10 + [math.nan] * 14)
    t = J.judge(J.Trial("amp.bf16", "switch"), base, trial)
    assert t.verdict == "broke" and "nan" in t.why
    assert t.speedup is not None     # the numbers are kept beside the verdict


def test_departed_loss_breaks_but_small_drift_does_not():
    rng = np.random.default_rng(5)
    base_l = list(2.0 + 0.05 * rng.standard_normal(40))
    near = list(2.04 + 0.05 * rng.standard_normal(40))     # +2%: within tolerance
    far = list(3.0 + 0.05 * rng.standard_normal(40))       # +50%
    steps = _runs(rng, 0.1, 2, 10)
    ok = J.judge(J.Trial("matmul.tf32", "switch"), J.Side(steps, base_l), J.Side(steps, near))
    assert ok.verdict != "broke" and abs(ok.loss_change) < J.LOSS_TOLERANCE
    bad = J.judge(J.Trial("matmul.tf32", "switch"), J.Side(steps, base_l), J.Side(steps, far))
    assert bad.verdict == "broke" and "departed" in bad.why and bad.loss_change > 0.4


def test_noisy_loss_difference_within_noise_is_not_broke():
    rng = np.random.default_rng(6)
    base_l = list(1.0 + 0.8 * rng.standard_normal(6))
    trial_l = list(1.15 + 0.8 * rng.standard_normal(6))    # 15% apart, but far inside the noise
    steps = _runs(rng, 0.1, 2, 6)
    t = J.judge(J.Trial("k", "switch"), J.Side(steps, base_l), J.Side(steps, trial_l))
    assert t.verdict != "broke"


def test_too_few_steps_is_unknown():
    t = J.judge(J.Trial("k", "restart"), J.Side([[0.1]]), J.Side([[0.05]]))
    assert t.verdict == "unknown" and "too few steps" in t.why
    # a clear 2x in 4 blocks of 4 steps: still too few for a verdict on a shared machine
    t = J.judge(J.Trial("k", "switch"), J.Side([[0.1] * 4] * 4), J.Side([[0.05, 0.051, 0.049, 0.05]] * 4))
    assert t.verdict == "unknown" and t.speedup == pytest.approx(2.0, rel=0.02) and "--budget" in t.why


def test_scheduler_noise_in_few_blocks_is_not_faster():
    """The clean twin on a 2-core VM at load 9: steps of 2 ms or 300 ms at random. Whatever the
    arm, no verdict of faster from such blocks."""
    for seed in range(20):
        rng = np.random.default_rng(seed)

        def block():
            return list(np.where(rng.random(4) < 0.5, 0.002, 0.3) * (1 + 0.1 * rng.random(4)))

        base = J.Side([block() for _ in range(6)])
        trial = J.Side([block() for _ in range(6)])
        assert J.judge(J.Trial("amp.bf16", "switch"), base, trial).verdict != "faster", seed


def test_split_arms_drops_warmup_and_each_blocks_first_step():
    steps, losses = [], {}
    arms = ["base", "amp.bf16"]
    i = 0
    for w in range(2):
        i += 1
        steps.append({"index": i, "total_s": 9.0, "extra": {"try": "warmup", "try_block": -1}})
    for blk in range(4):
        for j in range(4):
            i += 1
            arm = arms[blk % 2]
            steps.append({"index": i, "total_s": 5.0 if j == 0 else (0.1 if arm == "base" else 0.05),
                          "samples": 8, "extra": {"try": arm, "try_block": blk}})
            losses[i] = 1.0
    sides = J.split_arms(steps, losses)
    assert set(sides) == {"base", "amp.bf16"}
    assert [len(r) for r in sides["base"].runs] == [3, 3]
    assert all(v == 0.1 for r in sides["base"].runs for v in r)        # first-of-block 5.0 s left out
    assert sides["amp.bf16"].samples == 8 and len(sides["amp.bf16"].losses) == 6
    t = J.judge(J.Trial("amp.bf16", "switch"), sides["base"], sides["amp.bf16"])
    assert t.speedup == pytest.approx(2.0)


def test_summary_names_the_best():
    a = J.Trial("a", "switch", verdict="faster", speedup=1.5, ci_low=1.2, ci_high=1.8, steps=40, loss_change=0.01)
    b = J.Trial("b", "restart", verdict="faster", speedup=2.5, ci_low=2.0, ci_high=3.0, steps=60, loss_change=0.0)
    assert J.summary([a, b]).startswith("b: 2.50x faster (2.00-3.00) in 60 steps, same loss curve")
    assert "no knob" in J.summary([J.Trial("c", "switch", verdict="no change")])


# ---- knobs and the plan ---------------------------------------------------------------------------

def test_every_knob_has_a_trial_mode_and_a_reason_when_none():
    for k in KNOBS.values():
        assert k.mode in ("switch", "restart", "none"), k.id
        if k.mode == "none":
            assert k.outside, k.id


def test_parse_spec():
    assert parse_spec("dataloader.workers=4") == ("dataloader.workers", 4)
    assert parse_spec(" amp.bf16 ") == ("amp.bf16", None)
    for bad, word in (("amp.bf17", "unknown knob"), ("amp.bf16=2", "takes no value"),
                      ("dataloader.workers=x", "whole number"), ("dataloader.workers=-1", "from 0 to")):
        with pytest.raises(ValueError, match=word):
            parse_spec(bad)


class _F:
    def __init__(self, id, severity, evidence=None):
        self.id = self.check = id
        self.severity = severity
        self.evidence = evidence or {}


def test_findings_point_to_knobs():
    picks = P.from_findings([
        _F("dataloader.workers", "error", {"knob": "dataloader.workers", "recommended_workers": 3}),
        _F("debug.anomaly-detection", "warning"),
        _F("optim.zero-grad", "info"),                 # info: not by default
        _F("gpu.low-utilization", "warning"),          # several knobs word it: none without its own
        _F("amp.fp16-without-scaler", "error"),
    ])
    by = {p.knob: p for p in picks}
    assert set(by) == {"dataloader.workers", "debug.anomaly", "amp.fp16"}
    assert by["dataloader.workers"].spec == "dataloader.workers=3"
    plan = P.split(picks)
    assert [p.knob for p in plan.switch] == ["debug.anomaly"]
    assert [p.knob for p in plan.restart] == ["dataloader.workers"]
    assert plan.not_applicable[0][0].knob == "amp.fp16" and "GradScaler" in plan.not_applicable[0][1]


def test_specs_refuse_duplicates():
    with pytest.raises(ValueError, match="twice"):
        P.from_specs(["amp.bf16", "amp.bf16"])
    assert [p.spec for p in P.from_specs(["amp.bf16,dataloader.workers=2"])] == ["amp.bf16", "dataloader.workers=2"]


def test_budget_allocation():
    big = allocate(300, startup_s=5, step_s=0.1, steps=40, n_switch=2, n_restart=1, block=5)
    assert big["switch"] >= 2 and big["restart"] >= 3 and big["restart_knobs"] == 1
    small = allocate(60, startup_s=5, step_s=0.1, steps=40, n_switch=0, n_restart=3, block=5)
    assert small["restart"] == 2 and 0 < small["restart_knobs"] < 3     # knobs dropped to fit 2 rounds
    none = allocate(5, startup_s=5, step_s=0.1, steps=40, n_switch=1, n_restart=1, block=5)
    assert none == {"switch": 0, "restart": 0, "restart_knobs": 0}


# ---- the working-directory copy -------------------------------------------------------------------

def test_copy_contains_writes_and_links_big_files(tmp_path):
    src = tmp_path / "proj"
    (src / "sub").mkdir(parents=True)
    (src / "train.py").write_text("print('x')\n")
    (src / "sub" / "cfg.json").write_text("{}")
    (src / "big.bin").write_bytes(b"\0" * (2 << 20))
    (src / ".git").mkdir()
    (src / ".diag").mkdir()
    c = make_copy(src, str(src / "train.py"), parent=tmp_path)
    try:
        assert c.script == str(c.root / "train.py") and os.path.isfile(c.script)
        assert not (c.root / "train.py").is_symlink() and (c.root / "sub" / "cfg.json").read_text() == "{}"
        assert (c.root / "big.bin").is_symlink() and (c.root / ".git").is_symlink()
        assert not (c.root / ".diag").exists()
        (c.root / "checkpoint.pt").write_text("w")
        assert not (src / "checkpoint.pt").exists()
        env = tracker_env(c.root)
        assert env["WANDB_MODE"] == "disabled" and env["MLFLOW_TRACKING_URI"].startswith("file:")
    finally:
        c.remove()
    assert not c.root.exists() and (src / "big.bin").exists()


def test_copy_of_a_script_outside_the_directory_says_so(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "t.py").write_text("")
    c = make_copy(tmp_path / "a", str(tmp_path / "b" / "t.py"), parent=tmp_path)
    try:
        assert c.script == str(tmp_path / "b" / "t.py") and "not contained" in c.notes[0]
    finally:
        c.remove()


# ---- renderers ------------------------------------------------------------------------------------

def _result():
    r = TryResult(script="train.py", framework="transformers", device="cpu",
                  baseline={"median_step_s": 0.1, "steps": 40})
    r.trials = [J.Trial("dataloader.workers=2", "restart", verdict="faster", speedup=2.0, ci_low=1.8, ci_high=2.2,
                        steps=90, step_s=0.05, knobs=["dataloader.workers=2"], why="2.00x faster"),
                J.Trial("amp.bf16", "switch", verdict="broke", why="the loss became nan with the knob on",
                        knobs=["amp.bf16"])]
    r.not_tried = [{"knob": "amp.fp16", "verdict": "not applicable", "why": "GradScaler"}]
    r.summary = J.summary(r.trials)
    return r


def test_json_schema_and_framework_words():
    from diag.report.try_ import render

    data = json.loads(render(_result(), "json"))
    assert data["schema_version"] == 1
    for t in data["trials"]:
        for key in ("knob", "speedup", "ci_low", "ci_high", "verdict", "steps", "peak_memory"):
            assert key in t
    assert data["fixes"][0]["knob"] == "dataloader.workers=2"
    assert "dataloader_num_workers=2" in data["fixes"][0]["fix"]      # the HF Trainer's words


def test_text_and_markdown():
    from diag.report.try_ import render

    text = render(_result(), "text")
    assert "2.00x (1.80-2.20)" in text and "broke" in text and "not applicable" in text
    assert "TrainingArguments(dataloader_num_workers=2)" in text
    assert "summary: dataloader.workers=2: 2.00x faster" in text
    md = render(_result(), "markdown")
    assert md.startswith("## diag try") and "| dataloader.workers=2 |" in md


# ---- the probe extension, on real torch objects ---------------------------------------------------

class Ctx:
    """The part of ProbeContext the extension uses."""

    def __init__(self):
        self.events, self.errors, self.steps_done = [], [], 0
        self.current_step = None

    def emit(self, kind, **data):
        self.events.append((kind, data))

    def report_error(self, where, error):
        self.errors.append((where, error))

    def is_live(self):
        return True


def _ext(fixed="", arms="", block=2, warmup=1):
    from diag.probe.knobapply import KnobApply

    env = {"DIAG_TRY_KNOBS": fixed, "DIAG_TRY_ARMS": arms, "DIAG_TRY_BLOCK": str(block),
           "DIAG_TRY_WARMUP": str(warmup)}
    ext, ctx = KnobApply(env), Ctx()
    ext.install(ctx)
    return ext, ctx


def test_dataloader_keywords_overridden_then_restored():
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, IterableDataset, TensorDataset

    ds = TensorDataset(torch.zeros(8, 2))
    ext, ctx = _ext("dataloader.workers=2,dataloader.persistent-workers")
    try:
        dl = DataLoader(ds, 4, True)
        assert dl.num_workers == 2 and dl.persistent_workers and dl.batch_size == 4

        class It(IterableDataset):
            def __iter__(self):
                return iter(range(3))

        assert DataLoader(It()).num_workers == 0      # an IterableDataset is not replicated
    finally:
        ext.on_exit(ctx, "completed")
        ext.uninstall(ctx)
    assert DataLoader(ds, 4).num_workers == 0
    st = ext.status
    assert st["dataloader.workers"]["applied"] == 1 and "IterableDataset" in " ".join(st["dataloader.workers"]["notes"])
    assert ctx.events[-1][1]["path"] == "extras.try" and not ctx.errors


def test_fused_optimizer_and_refusal():
    torch = pytest.importorskip("torch")
    p = torch.nn.Parameter(torch.zeros(4))
    ext, ctx = _ext("optim.fused")
    try:
        opt = torch.optim.SGD((q for q in [p]), lr=0.1)        # a generator is read once: kept for the retry
        assert opt.defaults["fused"] is True and len(opt.param_groups[0]["params"]) == 1
        kept = torch.optim.Adam([p], foreach=True)
        assert not kept.defaults.get("fused")
    finally:
        ext.uninstall(ctx)
    assert not torch.optim.SGD([p], lr=0.1).defaults.get("fused")
    assert ext.status["optim.fused"]["applied"] == 1


def test_switch_knobs_alternate_in_blocks_with_autocast_until_backward():
    torch = pytest.importorskip("torch")
    from torch import nn

    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ext, ctx = _ext(arms="base;amp.bf16;optim.set-to-none", block=2, warmup=1)
    seen = []
    try:
        for i in range(1, 8):
            ext.on_step_start(ctx, i)
            opt.zero_grad(set_to_none=False)
            ext.on_forward_start(ctx, model)
            out = model(torch.randn(3, 4))
            loss = out.float().pow(2).mean()
            on_in_loss = torch.is_autocast_enabled("cpu")
            loss.backward()
            after = torch.is_autocast_enabled("cpu")
            opt.step()
            step = {"index": i, "extra": {}}
            ext.on_step_end(ctx, step)
            ctx.steps_done = i
            seen.append((step["extra"]["try"], out.dtype, on_in_loss, after, model.weight.grad is None))
        ext.on_exit(ctx, "completed")
    finally:
        ext.uninstall(ctx)
    arms = [s[0] for s in seen]
    assert arms == ["warmup", "base", "base", "amp.bf16", "amp.bf16", "optim.set-to-none", "optim.set-to-none"]
    for arm, dtype, in_loss, after, _ in seen:
        assert (dtype == torch.bfloat16) == (arm == "amp.bf16") and in_loss == (arm == "amp.bf16")
        assert not after                                   # left before the backward
    losses = [v for kind, d in ctx.events if d.get("path") == "extras.try_losses" for v in d["value"]]
    assert [i for i, _ in losses] == list(range(1, 8)) and all(math.isfinite(v) for _, v in losses)
    assert ext.status["optim.set-to-none"]["applied"] == 2 and ext.status["amp.bf16"]["applied"] == 2
    assert not torch.is_autocast_enabled("cpu")


def test_anomaly_off_during_the_step_then_restored():
    torch = pytest.importorskip("torch")
    ext, ctx = _ext("debug.anomaly")
    torch.autograd.set_detect_anomaly(True)
    try:
        ext.on_step_start(ctx, 1)
        assert not torch.is_anomaly_enabled()
        ext.on_step_end(ctx, {"index": 1, "extra": {}})
        assert torch.is_anomaly_enabled()
    finally:
        torch.autograd.set_detect_anomaly(False)
        ext.uninstall(ctx)
    assert ext.status["debug.anomaly"]["applied"] == 1


def test_cpu_only_knobs_say_why_not():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    ext, ctx = _ext("matmul.tf32,cudnn.benchmark,dataloader.pin-memory")
    ext.on_exit(ctx, "completed")
    ext.uninstall(ctx)
    for k in ("matmul.tf32", "cudnn.benchmark", "dataloader.pin-memory"):
        assert "no CUDA GPU" in ext.status[k]["not_applicable"], k
    assert torch.get_float32_matmul_precision() == "highest"


def test_extension_loads_only_under_diag_try(monkeypatch):
    from diag.probe.extensions import load_extensions

    monkeypatch.delenv("DIAG_TRY_KNOBS", raising=False)
    assert not any(type(e).__name__ == "KnobApply" for e in load_extensions())
    monkeypatch.setenv("DIAG_TRY_KNOBS", "")
    assert any(type(e).__name__ == "KnobApply" for e in load_extensions())


def test_pairing_and_bootstrap_must_agree():
    """Four rounds on a machine whose load changes between rounds: each knob run is 2x faster than
    the baseline run beside it. The paired interval (the load cancels by round) is the narrower;
    the verdict takes the wider of the two, and is still faster."""
    from diag.compare.stats import compare

    rng = np.random.default_rng(7)
    load = [1.0, 1.6, 1.2, 1.4]
    base = J.Side([list(0.1 * f * (1 + 0.03 * rng.standard_normal(10))) for f in load])
    trial = J.Side([list(0.05 * f * (1 + 0.03 * rng.standard_normal(10))) for f in load])
    lo, hi = J.paired(base.runs, trial.runs)
    assert 1.8 < lo < hi < 2.2
    boot = compare(trial.runs, base.runs, statistic=J.trimmed_mean)
    assert boot.high - boot.low > hi - lo
    t = J.judge(J.Trial("dataloader.workers=2", "restart"), base, trial)
    assert t.verdict == "faster" and t.ci_low == pytest.approx(min(lo, boot.low))
    assert J.paired(base.runs[:1], trial.runs[:1]) is None


# ---- the engine, with the script's runs simulated --------------------------------------------------

def test_engine_flow_guards_and_combined_on_simulated_runs():
    """The whole engine on simulated runs: a switch knob that helps, one whose loss turns NaN, a
    restart knob that helps, one whose runs crash; the two winners combined; nothing started."""
    from types import SimpleNamespace

    from diag.probe.knobapply import Schedule, parse_arms
    from diag.trial.engine import Engine, RunOut, TryConfig

    rng = np.random.default_rng(0)
    speed = {"debug.anomaly": 0.7, "dataloader.workers=2": 0.5}
    labels = []

    def fake(label, fixed, arms, steps):
        labels.append(label)
        status, error, knob_status = "stopped", None, {}
        for spec in fixed:
            knob_status[spec.split("=")[0]] = {"applied": 1, "not_applicable": None, "notes": []}
        if "optim.fused" in fixed:
            status, error = "failed", "RuntimeError: fused kernels are not supported here"
        sched = Schedule(parse_arms(";".join(arms)) if arms else [], 5, 3)
        rows, losses = [], {}
        for i in range(1, steps + 1):
            name, blk, on = sched.at(i)
            f = 1.0
            for k in list(on) + list(fixed):
                f *= speed.get(k, 1.0)
            load = 1 + 0.2 * math.sin(i / 7)               # a machine whose load drifts
            rows.append({"index": i, "total_s": 0.1 * f * load * (1 + 0.02 * rng.standard_normal()),
                         "samples": 16, "instrumented": False,
                         "extra": {"try": name, "try_block": blk} if arms else {}})
            losses[i] = math.nan if ("amp.bf16" in on and i > 100) else 1.0 + 0.01 * rng.standard_normal()
        for k in {k for _, ks in sched.arms for k in ks}:
            knob_status.setdefault(k, {"applied": 3, "not_applicable": None, "notes": []})
        times = sorted(r["total_s"] for r in rows)
        return RunOut(label, "", 1.0, status, rows, losses, knob_status, None, error, times[len(times) // 2])

    class FakeEngine(Engine):
        def run(self, label, *, fixed, arms=None, steps, block=None):
            return fake(label, fixed, arms, steps)

    cfg = TryConfig(script="train.py", knobs=["debug.anomaly", "amp.bf16", "dataloader.workers=2", "optim.fused",
                                              "eval.batch=64"],
                    steps=30, budget_s=10_000, evidence=SimpleNamespace(ranks=[], primary=None))
    eng = FakeEngine(cfg)
    eng.est_run_s, eng.step_s = 1.0, 0.1
    res = eng.go()
    t = {x.knob: x for x in res.trials}
    assert t["debug.anomaly"].verdict == "faster" and 1.3 < t["debug.anomaly"].speedup < 1.6
    assert t["amp.bf16"].verdict == "broke" and "nan at step" in t["amp.bf16"].why
    assert t["dataloader.workers=2"].verdict == "faster" and t["dataloader.workers=2"].ci_low > 1.5
    assert t["optim.fused"].verdict == "broke" and "fused kernels are not supported" in t["optim.fused"].why
    combined = t["debug.anomaly + dataloader.workers=2"]
    assert combined.kind == "combined" and combined.verdict == "faster" and combined.speedup > 2.3
    assert res.not_tried == [{"knob": "eval.batch=64", "verdict": "not applicable",
                              "why": KNOBS["eval.batch"].outside}]
    assert res.summary.startswith("debug.anomaly + dataloader.workers=2:")
    assert labels[0] == "switch knobs" and any("round 3" in x for x in labels)


def test_check_try_writes_the_measured_effect_into_each_finding(monkeypatch):
    from diag.trial import annotate as A
    from diag.trial import engine as E

    res = TryResult(script="t.py")
    res.trials = [J.Trial("dataloader.workers=3", "restart", verdict="faster", speedup=3.1, ci_low=2.9, ci_high=3.3,
                          steps=60, knobs=["dataloader.workers=3"]),
                  J.Trial("debug.anomaly", "switch", verdict="no change", speedup=1.01, ci_low=0.95, ci_high=1.08,
                          steps=40, knobs=["debug.anomaly"])]
    res.not_tried = [{"knob": "amp.fp16", "verdict": "not applicable", "why": "needs a GradScaler"}]
    seen = {}

    def fake_run_try(cfg):
        seen["cfg"] = cfg
        return res

    monkeypatch.setattr(E, "run_try", fake_run_try)
    fs = [_F("dataloader.workers", "error", {"knob": "dataloader.workers", "recommended_workers": 3}),
          _F("debug.anomaly-detection", "warning"), _F("amp.fp16-without-scaler", "error"),
          _F("eval.no-grad", "warning")]
    for f in fs:
        f.message = "Measured."
    A.annotate("EV", fs, "t.py", ["--epochs", "2"], steps=30)
    assert seen["cfg"].evidence == "EV" and seen["cfg"].findings is fs and seen["cfg"].args == ["--epochs", "2"]
    assert fs[0].message.endswith("Measured by diag try: 3.10x faster (2.90-3.30) in 60 steps.")
    assert fs[0].evidence["measured"]["verdict"] == "faster"
    assert "no significant change (0.95-1.08x) in 40 steps" in fs[1].message
    assert "not applicable (needs a GradScaler)" in fs[2].message
    assert fs[3].message == "Measured."
