"""diag try, end to end: real scripts run under the probe with knobs applied from outside.

The quick ones check usage errors. The slow ones (several runs of a training script each) check that
a knob that truly helps is measured faster with an interval that excludes 1, that a knob that breaks
the run is reported `broke` (never a crash of diag), and that the knobs reach the objects the Hugging
Face Trainer and Lightning build, with no edit to the script."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_diag

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "scripts" / "corpus"

# data loading bound by waiting (a sleep per item, as reading files over a network would be): two
# workers fetch two batches at once even on a loaded 2-core machine
SLOW_DATA = '''
import argparse, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

ap = argparse.ArgumentParser()
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--nan-bf16", action="store_true")
ap.add_argument("--crash-in-worker", action="store_true")
args = ap.parse_args()


class Slow(Dataset):
    def __len__(self):
        return 256

    def __getitem__(self, i):
        if args.crash_in_worker and torch.utils.data.get_worker_info() is not None:
            raise RuntimeError("this dataset cannot run in a worker process")
        time.sleep(0.03)
        g = torch.Generator().manual_seed(i)
        x = torch.randn(16, generator=g)
        return x, int(x[0] > 0)


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
loader = DataLoader(Slow(), batch_size=8, shuffle=True)
for epoch in range(args.epochs):
    for x, y in loader:
        opt.zero_grad()
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        if args.nan_bf16 and out.dtype == torch.bfloat16:
            loss = loss * float("nan")
        loss.backward()
        opt.step()
open("written-by-the-script.txt", "w").write("x")
print("done")
'''


def _try(tmp_path, *args, script_args=(), timeout=300):
    script = tmp_path / "train.py"
    if not script.exists():
        script.write_text(SLOW_DATA)
    r = run_diag("try", "--script", str(script), *args, "--format", "json", "--", *script_args,
                 cwd=tmp_path, timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    return r


def test_usage_errors_are_one_sentence(tmp_path):
    (tmp_path / "t.py").write_text("print(1)\n")
    for args, word in ((["--knob", "amp.bf17"], "unknown knob 'amp.bf17'"),
                       (["--knob", "dataloader.workers=many"], "whole number"),
                       (["--rounds", "1"], "at least 2"),
                       (["--budget", "soon"], "duration")):
        r = run_diag("try", "--script", str(tmp_path / "t.py"), *args, cwd=tmp_path)
        assert r.code == 2, (args, r.stderr)
        assert word in r.stderr and "Traceback" not in r.stderr
    r = run_diag("try", cwd=tmp_path)
    assert r.code == 2 and "give --script" in r.stderr
    r = run_diag("try", "--list", "--format", "json", cwd=tmp_path)
    assert r.code == 0
    rows = {row["knob"]: row for row in json.loads(r.stdout)}
    assert rows["dataloader.workers=N"]["mode"] == "restart" and rows["amp.bf16"]["mode"] == "switch"


def test_a_script_that_fails_on_its_own_exits_3(tmp_path):
    (tmp_path / "bad.py").write_text("raise SystemExit('no data here')\n")
    r = run_diag("try", "--script", str(tmp_path / "bad.py"), "--knob", "amp.bf16", cwd=tmp_path, timeout=120)
    assert r.code == 3 and "nothing to try" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_workers_knob_is_measured_faster_and_runs_are_contained(tmp_path):
    r = _try(tmp_path, "--knob", "dataloader.workers=4", "--steps", "12", "--budget", "150s")
    assert r.code == 0, r.stderr[-3000:]
    data = json.loads(r.stdout)
    (t,) = data["trials"]
    assert t["knob"] == "dataloader.workers=4" and t["kind"] == "restart"
    assert t["verdict"] == "faster" and t["ci_low"] > 1.0 and t["speedup"] > 1.5, (t, data["runs"])
    assert t["runs"] >= 2 and t["steps"] >= 20 and "num_workers 0 -> 4" in t["applied"]
    snippet = data["fixes"][0]["snippet"]
    assert snippet.startswith("loader = DataLoader(dataset, batch_size=8, num_workers=4"), snippet
    assert data["summary"].startswith("dataloader.workers=4:")
    # every run wrote its file in its own copy: none here
    assert not (tmp_path / "written-by-the-script.txt").exists()
    assert all(Path(run["run_dir"]).is_dir() for run in data["runs"])


@pytest.mark.slow
def test_a_knob_that_breaks_the_run_is_broke_not_a_crash(tmp_path):
    r = _try(tmp_path, "--knob", "amp.bf16", "--knob", "dataloader.workers=1", "--rounds", "2", "--steps", "10",
             "--block", "3", script_args=("--nan-bf16", "--crash-in-worker"))
    assert r.code == 0, r.stderr[-3000:]
    trials = {t["knob"]: t for t in json.loads(r.stdout)["trials"]}
    assert trials["amp.bf16"]["verdict"] == "broke" and "nan" in trials["amp.bf16"]["why"]
    w = trials["dataloader.workers=1"]
    assert w["verdict"] == "broke" and "cannot run in a worker process" in w["why"], w


def _check_with_knobs(tmp_path, script, knobs, arms, script_args):
    env = {"DIAG_TRY_KNOBS": knobs, "DIAG_TRY_ARMS": arms, "DIAG_TRY_BLOCK": "2", "DIAG_TRY_WARMUP": "1"}
    r = run_diag("check", "--script", str(script), "--format", "json", "--run-dir", str(tmp_path / "run"),
                 "--", *script_args, cwd=tmp_path, env=env, timeout=400)
    assert "Traceback" not in r.stderr.split("CORPUS_TRUTH")[0] or r.code == 0, r.stderr[-3000:]
    ev = json.loads((tmp_path / "run" / "evidence.json").read_text())
    rank = ev["ranks"][0]
    arms_seen = {s["extra"].get("try") for s in rank["steps"]}
    return ev["run"]["status"], rank["extras"]["try"]["knobs"], arms_seen, rank["extras"].get("try_losses")


@pytest.mark.slow
def test_hf_trainer_takes_the_knobs_with_no_edit(tmp_path):
    pytest.importorskip("transformers")
    status, knobs, arms, losses = _check_with_knobs(
        tmp_path, CORPUS / "hf_trainer.py", "dataloader.workers=1,optim.fused", "base;amp.bf16", ("--steps", "7"))
    assert status == "completed"
    assert knobs["dataloader.workers"]["applied"] >= 1, knobs          # the Trainer's own DataLoader
    assert knobs["amp.bf16"]["applied"] >= 1, knobs                    # autocast around the Trainer's forward
    fused = knobs["optim.fused"]                                       # the Trainer's AdamW: fused already, or built so
    assert fused["applied"] or "already fused" in (fused["not_applicable"] or ""), fused
    assert {"base", "amp.bf16"} <= arms and losses


@pytest.mark.slow
def test_lightning_takes_the_knobs_with_no_edit(tmp_path):
    pytest.importorskip("lightning")
    status, knobs, arms, losses = _check_with_knobs(
        tmp_path, CORPUS / "lightning_fit.py", "dataloader.workers=1,optim.fused", "base;amp.bf16;debug.anomaly",
        ("--steps", "9", "--plant"))
    assert status == "completed"
    assert knobs["dataloader.workers"]["applied"] >= 1, knobs          # train_dataloader's DataLoader
    assert knobs["optim.fused"]["applied"] == 1, knobs                 # configure_optimizers' SGD
    assert knobs["amp.bf16"]["applied"] >= 1 and knobs["debug.anomaly"]["applied"] >= 1, knobs   # Trainer(detect_anomaly=True)
    assert {"base", "amp.bf16", "debug.anomaly"} <= arms and losses


@pytest.mark.slow
def test_planted_demo_tries_the_knobs_its_findings_point_to(tmp_path):
    """Issue 32 on the planted demo: the knobs its findings point to are tried, each with a speed-up
    and its interval (or a reason), the fp16 finding's knob is not applicable with why. Whether the
    workers knob's interval excludes 1 depends on the machine's load (docs/try.md has measured runs),
    so this test holds the shape, and test_workers_knob_is_measured_faster... the effect."""
    demo = REPO / "diag" / "demo" / "planted.py"
    r = run_diag("try", "--script", str(demo), "--budget", "150s", "--format", "json", "--", "--epochs", "6",
                 cwd=tmp_path, timeout=400)
    assert r.code == 0, r.stderr[-3000:]
    data = json.loads(r.stdout)
    trials = {t["knob"].split("=")[0]: t for t in data["trials"]}
    assert {"dataloader.workers", "debug.anomaly", "optim.set-to-none"} <= set(trials), trials.keys()
    for t in trials.values():
        assert t["verdict"] in ("faster", "no change", "slower", "unknown"), t
        assert t["why"] and (t["speedup"] is None or t["ci_low"] <= t["speedup"] <= t["ci_high"]), t
    assert trials["dataloader.workers"]["applied"].startswith("dataloader.workers=1: applied")
    na = {n["knob"]: n for n in data["not_tried"]}
    assert "GradScaler" in na["amp.fp16"]["why"]


@pytest.mark.slow
def test_clean_twin_points_to_no_knob(tmp_path):
    demo = REPO / "diag" / "demo" / "clean.py"
    r = run_diag("try", "--script", str(demo), "--format", "json", "--", "--epochs", "1", cwd=tmp_path, timeout=300)
    assert r.code == 0, r.stderr[-3000:]
    data = json.loads(r.stdout)
    assert data["trials"] == [] and any("no finding" in n for n in data["notes"]), data["notes"]
    assert data["summary"] == "no knob could be trialled"
