"""diag compare on real runs of a tiny CPU training script (tests/scripts/compare_train.py): the same
script twice, a planted slowdown in one phase, a planted memory growth, a planted new finding,
refusals; and diag check --baseline."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tests" / "scripts" / "compare_train.py"
STEPS = "30"

pytestmark = pytest.mark.slow


def diag(*args, env=None, timeout=600, cwd=REPO):
    e = dict(os.environ)
    e.pop("GITHUB_ACTIONS", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "diag", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=e)


def _report(tmp: Path, name: str, *script_args: str, script=SCRIPT) -> Path:
    out = tmp / f"{name}.json"
    r = diag("check", "--script", str(script), "--run-dir", str(tmp / name), "--format", "json",
             "--fail-on", "never", "-o", str(out), "--", "--steps", STEPS, *script_args)
    assert r.returncode == 0, r.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compare-runs")
    return {
        "base": _report(tmp, "base"),
        "same": _report(tmp, "same"),
        "slow": _report(tmp, "slow", "--slow", "backward=0.005"),
        "memory": _report(tmp, "memory", "--hidden", "1024"),
        "finding": _report(tmp, "finding", "--anomaly"),
        "tmp": tmp,
    }


def _json(r):
    assert "Traceback" not in r.stderr
    return json.loads(r.stdout)


def test_the_same_script_twice_is_not_a_regression(runs):
    r = diag("compare", str(runs["base"]), str(runs["same"]), "--format", "json")
    doc = _json(r)
    assert r.returncode == 0, doc["headline"]
    assert doc["verdict"] == "ok" and doc["regressions"] == []
    step = next(m for m in doc["metrics"] if m["key"] == "step_time")
    assert step["low"] < step["high"]
    assert step["verdict"] != "regression"
    assert doc["findings"] == {"new": [], "gone": [], "changed": []}
    # the run directory and the evidence file are inputs too
    r = diag("compare", str(runs["tmp"] / "base"), str(runs["tmp"] / "same" / "evidence.json"))
    assert r.returncode == 0 and "step time" in r.stdout


def test_a_planted_backward_slowdown_is_found_and_attributed(runs):
    r = diag("compare", str(runs["base"]), str(runs["slow"]), "--min-runs", "1", "--format", "json")
    doc = _json(r)
    assert r.returncode == 1
    assert "step_time" in doc["regressions"]
    step = next(m for m in doc["metrics"] if m["key"] == "step_time")
    assert step["low"] > 0.05                       # the whole interval beyond the threshold
    assert doc["attribution"] and doc["attribution"][0]["phase"] == "backward"
    assert 0.003 < doc["attribution"][0]["delta_s"] < 0.012
    assert "backward +" in doc["headline"]
    # a generous threshold turns the same numbers into a pass, and says it got worse
    r = diag("compare", str(runs["base"]), str(runs["slow"]), "--max-regression", "step=400%,throughput=400%")
    assert r.returncode == 0, r.stdout
    assert "worse" in r.stdout


def test_a_planted_memory_growth_is_found(runs):
    r = diag("compare", str(runs["base"]), str(runs["memory"]), "--format", "json",
             "--max-regression", "step=1000%,throughput=1000%,memory=10%")
    doc = _json(r)
    mem = next(m for m in doc["metrics"] if m["key"] == "persistent_memory")
    assert mem["change"] > 5 and mem["verdict"] == "regression"
    assert doc["regressions"] == ["persistent_memory"] and r.returncode == 1


def test_a_planted_new_finding_is_reported(runs):
    r = diag("compare", str(runs["base"]), str(runs["finding"]), "--format", "json", "--max-regression", "1000%")
    doc = _json(r)
    ids = [f["id"] for f in doc["findings"]["new"]]
    assert "debug.anomaly-detection" in ids
    r = diag("compare", str(runs["finding"]), str(runs["base"]), "--format", "json", "--max-regression", "1000%")
    assert "debug.anomaly-detection" in [f["id"] for f in _json(r)["findings"]["gone"]]


def test_markdown_parses_back_and_junit_validates(runs):
    from diag.report.compare import parse_markdown_table

    r = diag("compare", str(runs["base"]), str(runs["slow"]), "--min-runs", "1", "--format", "markdown")
    assert r.returncode == 1
    assert r.stdout.startswith("### ")
    rows = {row["metric"]: row for row in parse_markdown_table(r.stdout)}
    assert rows["step time"]["verdict"] == "REGRESSION"
    assert rows["· backward"]["change"].startswith("+")
    assert set(rows["step time"]) == {"metric", "base", "new", "change", "95% CI", "threshold", "verdict"}
    r = diag("compare", str(runs["base"]), str(runs["slow"]), "--min-runs", "1", "--format", "junit")
    assert r.returncode == 1
    xmlschema = pytest.importorskip("xmlschema")
    schema = xmlschema.XMLSchema(str(REPO / "tests" / "fixtures" / "schemas" / "junit-10.xsd"))
    schema.validate(r.stdout)
    import xml.etree.ElementTree as ET

    root = ET.fromstring(r.stdout)
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert cases["step_time"].find("failure") is not None
    assert cases["phase.data"].find("failure") is None
    # GitHub Actions: workflow commands on stderr, stdout untouched
    r = diag("compare", str(runs["base"]), str(runs["slow"]), "--min-runs", "1", "--format", "json", env={"GITHUB_ACTIONS": "true"})
    assert json.loads(r.stdout)["verdict"] == "regression"
    assert "::error title=diag compare%3A step time::step time +" in r.stderr
    # text, written to a file too
    out = runs["tmp"] / "cmp.txt"
    r = diag("compare", str(runs["base"]), str(runs["slow"]), "--min-runs", "1", "-o", str(out))
    assert "REGRESSION" in r.stdout and "REGRESSION" in out.read_text()


def test_refusals_and_bad_input(runs, tmp_path):
    other = tmp_path / "other_train.py"
    other.write_text(SCRIPT.read_text())
    rep = _report(tmp_path, "other", script=other)
    # two scripts: a before/after, compared with a note (issue 33), not refused
    r = diag("compare", str(runs["base"]), str(rep), "--format", "json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    doc = json.loads(r.stdout)
    assert doc["forced"] == [] and any("scripts differ (compare_train.py vs other_train.py)" in n
                                       for n in doc["notes"])
    # one run per side: not enough runs to judge, said in the text
    r = diag("compare", str(runs["base"]), str(rep))
    assert r.returncode == 0 and "NOT JUDGED: not enough runs to judge" in r.stdout
    # batch size differs
    doc = json.loads(runs["same"].read_text())
    doc["compare"]["facts"]["batch"] = 64
    p = tmp_path / "batch.json"
    p.write_text(json.dumps(doc))
    r = diag("compare", str(runs["base"]), str(p))
    assert r.returncode == 2 and "batch sizes differ (16 vs 64)" in r.stderr
    # bad inputs: one sentence, exit 2
    for args, words in [((str(tmp_path / "missing.json"), str(runs["base"])), "does not exist"),
                        ((str(runs["base"]), str(runs["base"]), "--max-regression", "fast"), "percentage"),
                        ((str(runs["base"]), str(runs["base"]), "--max-regression", "speed=5%"), "unknown metric")]:
        r = diag("compare", *args)
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = diag("compare", str(bad), str(runs["base"]))
    assert r.returncode == 2 and "not valid JSON" in r.stderr


def test_check_with_a_baseline_judges_and_compares(runs, tmp_path):
    r = diag("check", "--script", str(SCRIPT), "--run-dir", str(tmp_path / "pr"), "--format", "json",
             "--baseline", str(runs["base"]), "--min-runs", "1", "--", "--steps", STEPS, "--slow", "backward=0.005")
    doc = json.loads(r.stdout)
    assert r.returncode == 1                        # the comparison's regression; the checks found no error
    assert doc["comparison"]["verdict"] == "regression"
    assert doc["comparison"]["attribution"][0]["phase"] == "backward"
    assert doc["compare"]["steps"]["index"]         # the report is a baseline itself
    # re-judging a saved run against the baseline: junit holds both suites and validates; text shows both
    r = diag("check", "--from", str(tmp_path / "pr"), "--baseline", str(runs["base"]), "--format", "junit",
             "--fail-on", "never", "--min-runs", "1")
    assert r.returncode == 1
    xmlschema = pytest.importorskip("xmlschema")
    xmlschema.XMLSchema(str(REPO / "tests" / "fixtures" / "schemas" / "junit-10.xsd")).validate(r.stdout)
    assert "diag.compare" in r.stdout and 'name="diag"' in r.stdout
    r = diag("check", "--from", str(tmp_path / "pr"), "--baseline", str(runs["same"]), "--min-runs", "1")
    assert r.returncode == 1 and "diag compare" in r.stdout and "backward +" in r.stdout
    r = diag("check", "--from", str(tmp_path / "pr"), "--baseline", str(runs["same"]), "--format", "sarif")
    assert r.returncode == 2 and "SARIF holds findings only" in r.stderr
    r = diag("check", "--script", str(SCRIPT), "--baseline", str(tmp_path / "nope.json"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    r = diag("check", "--from", str(runs["tmp"] / "same"), "--max-regression", "5%")
    assert r.returncode == 2 and "only apply with --baseline" in r.stderr


def test_scripts_run_several_times_per_side(tmp_path):
    # the mechanics of --runs (the runs alternate: base, new, base, new); a generous threshold, as two
    # repeats on a loaded 2-core machine can differ by tens of percent
    r = diag("compare", "--runs", "2", "--steps", "20", "--format", "json", "--max-regression", "60%",
             str(SCRIPT), str(SCRIPT), "--", "--steps", "20", cwd=tmp_path)
    doc = json.loads(r.stdout)
    assert r.returncode == 0, doc["headline"]
    order = [line.split(":")[1].strip() for line in r.stderr.splitlines() if line.endswith(SCRIPT.name)
             and " of 2:" in line]
    assert order == ["baseline 1 of 2", "new run 1 of 2", "baseline 2 of 2", "new run 2 of 2"]
    assert len(doc["base"]) == 2 and len(doc["new"]) == 2
    step = next(m for m in doc["metrics"] if m["key"] == "step_time")
    assert step["method"] == "repeats"
    r = diag("compare", "--runs", "2", str(SCRIPT), str(tmp_path / "x.json"), cwd=tmp_path)
    assert r.returncode == 2 and "does not exist" in r.stderr
