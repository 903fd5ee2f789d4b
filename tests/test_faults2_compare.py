"""Issue 27, classes 6 and 17: `diag compare` and `--baseline` do not trust the report they read. A
100k-deep JSON, a malformed compare block, NaN step times, an integer of thousands of digits, odd
findings: one sentence naming the file, exit 2 (bad input), never a traceback and never
"no significant regression"."""
from __future__ import annotations

import copy
import json

import pytest

from conftest import run_diag
from diag.testing import EvidenceBuilder


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    d = tmp_path_factory.mktemp("rep")
    ev = d / "evidence.json"
    EvidenceBuilder().cuda_training().steps(30, total_s=2.5, samples=8).build().save(ev)
    r = run_diag("check", "--from", str(ev), "--format", "json", "--fail-on", "never", cwd=d)
    assert r.code == 0, r.stderr
    data = json.loads(r.stdout)
    assert isinstance(data.get("compare"), dict)
    return data


def bad_input(r):
    assert r.code == 2, (r.code, r.stdout[-400:], r.stderr)
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("diag: error:")]
    assert len(lines) == 1, r.stderr
    return lines[0]


def both(tmp_path, good, bad_path):
    """diag compare BAD GOOD, and diag check --from GOOD's evidence --baseline BAD."""
    ev = tmp_path / "good-evidence.json"
    EvidenceBuilder().cuda_training().steps(30, total_s=2.5, samples=8).build().save(ev)
    a = bad_input(run_diag("compare", str(bad_path), str(good), cwd=tmp_path))
    b = run_diag("check", "--from", str(ev), "--baseline", str(bad_path), "--fail-on", "never", cwd=tmp_path)
    b_line = bad_input(b)
    return a, b_line


def mutate(report, fn):
    d = copy.deepcopy(report)
    fn(d)
    return d


CASES = {
    "nan-totals": (lambda d: d["compare"]["steps"].__setitem__("total_s", [float("nan")] * len(d["compare"]["steps"]["index"])),
                   "not a finite number"),
    "string-totals": (lambda d: d["compare"]["steps"].__setitem__("total_s", ["x"] * len(d["compare"]["steps"]["index"])),
                      "not a finite number"),
    "short-column": (lambda d: d["compare"]["steps"].__setitem__("total_s", [0.1]), "malformed"),
    "steps-a-list": (lambda d: d["compare"].__setitem__("steps", [1, 2]), "malformed"),
    "block-a-list": (lambda d: d.__setitem__("compare", [1]), "compare block is list"),
    "facts-odd": (lambda d: d["compare"]["facts"].__setitem__("batch", {"x": 1}), "the fact 'batch'"),
    "scalars-nan": (lambda d: d["compare"]["scalars"].__setitem__("mfu", float("inf")), "not a finite number"),
    "index-string": (lambda d: d["compare"]["steps"].__setitem__("index", ["a"] * len(d["compare"]["steps"]["index"])),
                     "not a whole number"),
    "findings-dict": (lambda d: d.__setitem__("findings", {"a": 1}), "findings are dict"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_malformed_report_is_one_sentence_exit_2(tmp_path, report, case):
    fn, needle = CASES[case]
    good = tmp_path / "good.json"
    good.write_text(json.dumps(report))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(mutate(report, fn)))
    for line in both(tmp_path, good, bad):
        assert needle in line and "bad.json" in line, line


def test_deep_json_and_huge_integers(tmp_path, report):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(report))
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for line in both(tmp_path, good, deep):
        assert "nested too deeply" in line
    huge = tmp_path / "huge.json"
    huge.write_text('{"findings": [], "tool": "diag", "compare": {"version": 1, "steps_total": ' + "9" * 5000 + "}}")
    for line in both(tmp_path, good, huge):
        assert "huge.json" in line


def test_odd_findings_in_a_report_do_not_break_the_diff(tmp_path, report):
    d = mutate(report, lambda d: d["findings"].extend([{"id": ["x"], "severity": "error"}, "text",
                                                       {"id": "odd.one", "severity": "error", "title": {"a": 1},
                                                        "location": {"file": 3, "line": "x"}}]))
    a = tmp_path / "a.json"
    a.write_text(json.dumps(d))
    b = tmp_path / "b.json"
    b.write_text(json.dumps(report))
    r = run_diag("compare", str(a), str(b), "--format", "json", cwd=tmp_path)
    assert r.code in (0, 1), r.stderr
    assert "Traceback" not in r.stderr
    json.loads(r.stdout)


def test_an_integer_of_thousands_of_digits_in_evidence(tmp_path):
    ev = tmp_path / "evidence.json"
    EvidenceBuilder().cuda_training().steps(5, total_s=2.5, samples=8).build().save(ev)
    text = ev.read_text().replace('"schema_version": ', '"huge": ' + "7" * 5000 + ', "schema_version": ', 1)
    ev.write_text(text)
    for args in (("check", "--from", str(ev)), ("attach", "--from", str(ev))):
        line = bad_input(run_diag(*args, cwd=tmp_path))
        assert "evidence.json" in line and "malformed" in line


@pytest.mark.parametrize("case,needle", [
    ("negative", "a duration (negative or NaN)"),
    ("ranks", "rank 0 appears 3 times"),
    ("wall", "negative duration"),
])
def test_impossible_values_in_evidence_are_refused(tmp_path, case, needle):
    ev = tmp_path / "evidence.json"
    EvidenceBuilder().cuda_training().steps(5, total_s=2.5, samples=8).build().save(ev)
    d = json.loads(ev.read_text())
    if case == "negative":
        d["ranks"][0]["steps"][2]["forward_s"] = -4.0
    elif case == "ranks":
        d["ranks"] = [d["ranks"][0]] * 3
    else:
        d["run"]["wall_s"] = -10
    ev.write_text(json.dumps(d))
    line = bad_input(run_diag("check", "--from", str(ev), cwd=tmp_path))
    assert needle in line, line
