"""Evaluation runs end to end: real tiny scripts under `diag check` (a subprocess each).

tests/scripts/eval_only.py is an evaluation-only script done right (no warning, exit 0); each flag plants
one mistake. tests/scripts/train_with_eval.py trains with periodic evaluation on its own loader."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import SCRIPTS, check_json, findings_by_id, severities

pytestmark = pytest.mark.slow

EVAL = "eval_only.py"
TIMEOUT = 300


def _evidence(tmp_path) -> dict:
    (ev,) = list(Path(tmp_path).glob(".diag/runs/*/evidence.json"))
    return json.loads(ev.read_text())


def _script_line(marker: str) -> int:
    lines = (SCRIPTS / EVAL).read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if marker in line)


def test_clean_evaluation_run_is_judged_as_one(diag_cli, tmp_path):
    r, rep = check_json(diag_cli, EVAL, "--fail-on", "warning", timeout=TIMEOUT)
    assert r.code == 0, rep["findings"]
    bad = [(f["id"], f["severity"]) for f in rep["findings"] if f["severity"] in ("warning", "error")]
    assert bad == []
    assert severities(rep, "run.no-steps") == ["pass"]
    for cid in ("eval.no-grad", "eval.train-mode", "eval.inference-mode", "eval.small-batch", "eval.host-sync"):
        assert severities(rep, cid) == ["pass"], cid
    ev = _evidence(tmp_path)
    assert ev["run"]["kind"] == "evaluation"
    rank = ev["ranks"][0]
    assert rank["step_stats"]["count"] == 0
    steps = rank["eval_steps"]
    assert len(steps) == 16 and rank["eval_stats"]["count"] == 16    # 1024 samples / 64
    assert sum(s["samples"] for s in steps) == 1024
    for s in steps:   # the phase-sum guarantee
        assert s["data_s"] + s["h2d_s"] + s["forward_s"] + s["other_s"] == pytest.approx(s["total_s"], abs=1e-9)
        assert min(s["data_s"], s["forward_s"], s["other_s"]) >= 0
    # the steps tile the evaluation pass
    (p,) = rank["evaluations"]
    assert sum(s["total_s"] for s in steps) == pytest.approx(p["time_s"], rel=1e-6)
    assert [d["role"] for d in rank["dataloaders"]] == ["eval"]
    # one forward counted with FlopCounterMode, beside 2·N·D
    fe = rank["flops"]["eval"]
    w = 4096      # eval_only.py WIDTH
    params = 128 * w + w + w * w + w + w * 2 + 2
    assert fe["params"] == params and fe["samples"] == 64
    assert fe["analytic_flops"] == 2 * params * 64
    assert 0.95 < fe["flops"] / fe["analytic_flops"] <= 1.0       # biases are not multiply-adds
    # and the text summary speaks of evaluation throughput
    text = diag_cli("check", "--from", str(next(Path(tmp_path).glob(".diag/runs/*"))), timeout=TIMEOUT)
    assert "evaluation run" in text.stdout and "batches/s" in text.stdout and "samples/s" in text.stdout
    assert "ERROR  run.no-steps" not in text.stdout and "No training step observed" not in text.stdout


@pytest.mark.parametrize("flag, cid, severity, marker", [
    (["--grad"], "eval.no-grad", "warning", "out = model(x)"),
    (["--train-mode"], "eval.train-mode", "warning", "out = model(x)"),
    (["--no-grad"], "eval.inference-mode", "info", "out = model(x)"),
    # on a CPU, eval.small-batch warns only on a measured per-batch fixed cost (issue 33: batch 8 and 64
    # gave the same throughput); batch 1 with no second batch size is a pass that says it was not measured
    # (the warning path: tests/test_false_alarms.py, and CUDA evidence in test_eval_checks.py)
    (["--bs", "1", "--samples", "256"], "eval.small-batch", "pass", None),
    (["--item"], "eval.host-sync", "info", "PLANTED-ITEM"),
])
def test_planted_twins(diag_cli, flag, cid, severity, marker):
    r, rep = check_json(diag_cli, EVAL, script_args=flag, timeout=TIMEOUT)
    assert r.code == 0
    hits = [f for f in rep["findings"] if f["id"] == cid]
    assert [f["severity"] for f in hits] == [severity], rep["findings"]
    if marker:
        assert hits[0]["location"]["line"] == _script_line(marker)
    assert severities(rep, "run.no-steps") == ["pass"]
    others = [(f["id"], f["severity"]) for f in rep["findings"] if f["severity"] in ("warning", "error")
              and f["id"] != cid]
    assert others == []


def test_slow_getitem_without_workers_on_the_evaluation_loader(diag_cli):
    r, rep = check_json(diag_cli, EVAL, script_args=["--slow", "--samples", "512"], timeout=TIMEOUT)
    (f,) = findings_by_id(rep)["dataloader.workers"]
    assert f["evidence"]["evaluation"] is True and f["evidence"]["num_workers"] == 0
    if (f["evidence"].get("host") or {}).get("contended"):
        # a busy machine (issue 33): found, and said that a worker count will not help there
        assert f["severity"] == "info" and "will not help" in f["message"]
    else:
        assert f["severity"] in ("warning", "error") and f["evidence"]["recommended_workers"] >= 1
    # located where the fix goes: the DataLoader(...) call, not the loop that iterates it (issue 33)
    assert f["location"]["line"] == _script_line("loader = DataLoader(")


def test_max_time_stops_an_evaluation_and_still_judges_it(diag_cli, tmp_path):
    r, rep = check_json(diag_cli, EVAL, "--max-time", "6", script_args=["--forever"], timeout=TIMEOUT)
    assert r.code == 0
    assert rep["run"]["status"] == "timeout"
    assert severities(rep, "run.no-steps") == ["pass"]
    assert severities(rep, "eval.no-grad") == ["pass"]
    ev = _evidence(tmp_path)
    assert ev["run"]["kind"] == "evaluation" and ev["ranks"][0]["eval_stats"]["count"] > 16


def test_training_with_periodic_evaluation(diag_cli, tmp_path):
    """The evaluation share is reported; training verdicts and step counts are those of the same
    training without evaluation; the evaluation loader's waits never land in a training step."""
    r, rep = check_json(diag_cli, "train_with_eval.py", timeout=TIMEOUT,
                        script_args=["--eval-every", "8", "--slow-eval", "--eval-batches", "2"])
    ev = json.loads(Path(rep["run"]["evidence"]).read_text())
    rank = ev["ranks"][0]
    assert ev["run"]["kind"] == "training+evaluation"
    assert rank["step_stats"]["count"] == 24 and len(rank["evaluations"]) == 3
    assert {d["id"]: d["role"] for d in rank["dataloaders"]} == {1: "train", 2: "eval"}
    # one epoch of the training loader: the evaluation loader's three passes are not epochs
    assert {s["epoch"] for s in rank["steps"]} == {1}
    # each evaluation batch took >= 40 ms to load; no training step waited that long
    assert max(s["data_s"] for s in rank["steps"]) < 0.04
    assert all(p["data_wait_s"] >= 2 * 0.04 for p in rank["evaluations"])
    assert rank["eval_stats"]["count"] == 6
    # the same training without evaluation: the same training verdicts
    r0, rep0 = check_json(diag_cli, "train_with_eval.py", timeout=TIMEOUT, script_args=["--eval-every", "1000"])
    judged = ("run.no-steps", "dataloader.workers", "dataloader.main-thread-data", "optim.zero-grad",
              "eval.no-grad", "run.failed")
    def training(r, cid):   # the training loader's verdicts (the evaluation loader's own wait is apart)
        return [f["severity"] for f in r["findings"] if f["id"] == cid and not f["evidence"].get("evaluation")]

    for cid in judged:
        assert training(rep, cid) == training(rep0, cid), cid
    # the evaluation loader's own wait (>= 40 ms a batch, planted) is an info of its own (issue 33)
    (ev_wait,) = [f for f in rep["findings"] if f["id"] == "dataloader.workers" and f["evidence"].get("evaluation")]
    assert ev_wait["severity"] == "info" and ev_wait["evidence"]["loader_id"] == 2
    assert rep0["summary"]["steps"] == rep["summary"]["steps"] == 24
    # the evaluation share: on the summary line and from diag cost
    run_dir = rep["run"]["run_dir"]
    text = diag_cli("check", "--from", run_dir, timeout=TIMEOUT).stdout
    assert "of training+evaluation time" in text and "a pass every 8 steps" in text
    c = diag_cli("cost", "--from", run_dir, "--eval-samples", "1M", "--format", "json", timeout=TIMEOUT)
    assert c.code == 0, c.stderr
    d = c.json()
    f = d["frequency"]
    assert f["passes"] == 3 and f["every"] == 8 and 0 < f["share"] < 1
    assert [row["every"] for row in f["rows"]] == [2, 4, 8, 16, 32, 80]
    e, m = d["estimate"], d["measured"]
    assert e["seconds"] == pytest.approx(1e6 / m["units_per_s"])
    assert e["analytic_flops"] == pytest.approx(2 * m["params"] * 1e6)     # 2·N·D


def test_training_evaluated_first_in_the_loop_body(diag_cli, tmp_path):
    """Evaluation between fetching the training batch and training on it: the evaluation loader stays an
    evaluation loader and its 40 ms waits stay out of the training steps."""
    r, rep = check_json(diag_cli, "train_with_eval.py", timeout=TIMEOUT,
                        script_args=["--eval-every", "8", "--slow-eval", "--eval-first", "--eval-batches", "2"])
    rank = _evidence(tmp_path)["ranks"][0]
    assert {d["id"]: d["role"] for d in rank["dataloaders"]} == {1: "train", 2: "eval"}
    assert max(s["data_s"] for s in rank["steps"]) < 0.04
    assert rank["step_stats"]["count"] == 24 and len(rank["evaluations"]) == 2


def test_cost_of_an_evaluation_run(diag_cli, tmp_path):
    check_json(diag_cli, EVAL, timeout=TIMEOUT)
    run_dir = str(next(Path(tmp_path).glob(".diag/runs/*")))
    c = diag_cli("cost", "--from", run_dir, "--eval-samples", "1M", "--price", "2", timeout=TIMEOUT)
    assert c.code == 0, c.stderr
    assert "FLOPs/sample measured" in c.stdout and "2·N" in c.stdout and "Cost" in c.stdout
    d = diag_cli("cost", "--from", run_dir, "--eval-samples", "1M", "--format", "json", timeout=TIMEOUT).json()
    m, e = d["measured"], d["estimate"]
    assert m["kind"] == "evaluation" and m["analytic_per_unit"] == 2 * m["params"]
    assert 0.95 < m["ratio_to_analytic"] <= 1.0
    assert e["flops"] == pytest.approx(m["flops_per_unit"] * 1e6)
    assert d["frequency"] is None
    bad = diag_cli("cost", "--from", run_dir, timeout=TIMEOUT)
    assert bad.code == 2 and "--eval-samples" in bad.stderr and "Traceback" not in bad.stderr
    bad = diag_cli("cost", "--from", run_dir, "--eval-tokens", "1M", timeout=TIMEOUT)
    assert bad.code == 2 and "--eval-samples" in bad.stderr and "Traceback" not in bad.stderr


def test_memory_plan_of_an_evaluation_only_script(diag_cli, tmp_path):
    """`diag memory` replays the evaluation forward itself when the script never trains, and
    memory.eval-batch and eval.small-batch read the largest evaluation batch from that plan."""
    # --steps: `diag memory` stops after one (here: evaluation) step by default; let all 64 batches run
    r = diag_cli("memory", "--script", str(SCRIPTS / EVAL), "--gpu", "H100", "--steps", "1000", "--",
                 "--bs", "1", "--samples", "64", timeout=TIMEOUT)
    assert r.code == 0, r.stderr
    assert "largest evaluation batch under inference_mode" in r.stdout
    assert "evaluation forward (inference_mode)" in r.stdout
    run_dir = str(next(Path(tmp_path).glob(".diag/runs/*")))
    rep = diag_cli("check", "--from", run_dir, "--format", "json", timeout=TIMEOUT).json()
    (m,) = findings_by_id(rep)["memory.eval-batch"]
    assert m["severity"] == "info" and m["evidence"]["eval_batch"] == 1 and m["evidence"]["max_eval_batch"] > 1000
    (s,) = findings_by_id(rep)["eval.small-batch"]
    # a CPU run with one batch size: no measured per-batch fixed cost, so no warning (issue 33)
    assert s["severity"] == "pass" and s["evidence"]["max_eval_batch"] == m["evidence"]["max_eval_batch"]


def test_train_mode_without_no_grad_is_still_an_evaluation_run(diag_cli, tmp_path):
    """Both mistakes at once: the forwards look like training (train mode, a graph), but nothing ever
    reaches a backward or an optimizer: an evaluation run, and one warning that names both."""
    r, rep = check_json(diag_cli, EVAL, script_args=["--grad", "--train-mode"], timeout=TIMEOUT)
    assert r.code == 0
    assert severities(rep, "run.no-steps") == ["pass"]
    (f,) = findings_by_id(rep)["eval.train-mode"]
    assert f["severity"] == "warning" and "gradients enabled" in f["message"]
    assert _evidence(tmp_path)["run"]["kind"] == "evaluation"


def test_steps_counts_evaluation_steps_in_an_evaluation_run(diag_cli, tmp_path):
    r, rep = check_json(diag_cli, EVAL, "--steps", "5", timeout=TIMEOUT)
    loud = [(f["id"], f["severity"], f["message"]) for f in rep["findings"]
            if f["severity"] in ("error", "crashed")]
    assert r.code == 0 and rep["run"]["status"] == "stopped", (rep["run"], loud, r.stderr[-3000:])
    assert "5 evaluation steps" in rep["run"]["stop_reason"]
    assert _evidence(tmp_path)["ranks"][0]["eval_stats"]["count"] == 5
    assert severities(rep, "run.no-steps") == ["pass"]
