"""An evaluation-only run (tests/scripts/eval_only.py) in `diag compare` and in the HTML report: its
evaluation steps are what is compared and shown (a training run and an evaluation run are refused)."""
import json
import re
import sys
from pathlib import Path

import pytest

from test_compare_runs import SCRIPT as TRAIN_SCRIPT, diag

REPO = Path(__file__).resolve().parents[1]
EVAL = REPO / "tests" / "scripts" / "eval_only.py"

pytestmark = pytest.mark.slow


def _run(tmp: Path, name: str, *args: str, script=EVAL) -> Path:
    out = tmp / f"{name}.json"
    r = diag("check", "--script", str(script), "--run-dir", str(tmp / name), "--format", "json",
             "--fail-on", "never", "-o", str(out), "--", *args)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("eval-compare")
    return {"base": _run(tmp, "base", "--samples", "1536"),
            "same": _run(tmp, "same", "--samples", "1536"),
            "slow": _run(tmp, "slow", "--samples", "1536", "--slow"),
            "train": _run(tmp, "train", "--steps", "12", script=TRAIN_SCRIPT),
            "tmp": tmp}


def test_the_same_evaluation_twice_compares_evaluation_steps_and_passes(runs):
    block = json.loads(runs["base"].read_text())["compare"]
    assert block["facts"]["kind"] == "evaluation" and block["steps_total"] == 24
    assert set(block["steps"]["backward_s"]) == {0.0}      # no backward, no optimizer in an evaluation step
    # a generous threshold: the two runs are minutes apart on a loaded 2-core machine, and 24 evaluation
    # steps of a few ms each moved by more than the default 5% there (CI saw throughput fall 745
    # samples/s between them); what is tested is that evaluation steps are what is compared
    r = diag("compare", str(runs["base"]), str(runs["same"]), "--format", "json", "--max-regression", "60%")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    c = json.loads(r.stdout)
    assert c["base"][0]["kind"] == "evaluation" and c["base"][0]["steady_steps"] >= 3
    keys = {m["key"]: m for m in c["metrics"]}
    assert keys["step_time"]["label"] == "evaluation step time"
    assert "phase.backward" not in keys and "phase.optimizer" not in keys
    assert c["headline"].startswith("evaluation step time")
    text = diag("compare", str(runs["base"]), str(runs["same"])).stdout
    assert "steady evaluation steps of 24" in text


def test_a_slow_evaluation_loader_is_a_regression_attributed_to_data(runs):
    r = diag("compare", str(runs["base"]), str(runs["slow"]), "--format", "json", "--min-runs", "1")
    assert r.returncode == 1, r.stdout[-2000:]
    c = json.loads(r.stdout)
    assert "step_time" in c["regressions"]
    assert c["attribution"][0]["phase"] == "data"


def test_a_training_run_and_an_evaluation_run_are_refused_in_one_sentence(runs):
    r = diag("compare", str(runs["train"]), str(runs["base"]))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "run kinds differ (training vs evaluation)" in r.stderr


def test_the_html_report_of_an_evaluation_run_shows_its_evaluation_steps(runs):
    r = diag("check", "--from", str(runs["tmp"] / "base"), "--format", "html", "--fail-on", "never")
    assert r.returncode == 0, r.stderr[-2000:]
    page = r.stdout
    tiles = dict(re.findall(r'data-fact="([^"]+)">([^<]*)<', page))
    assert tiles["evaluation steps"] == "24"
    assert tiles["median evaluation step"].endswith("ms")
    assert tiles["throughput"].endswith("samples/s")
    assert '<section id="steps"><h2>Evaluation steps</h2>' in page
    assert "Median evaluation step" in page
