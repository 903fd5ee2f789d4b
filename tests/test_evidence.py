"""diag.evidence: the JSON round trip and the loader's one-sentence errors."""
from __future__ import annotations

import json

import pytest

from check_support import ev_with, steps
from diag.errors import DiagError
from diag.evidence import (SCHEMA_VERSION, DataLoaderInfo, ExceptionInfo, ForwardSite, ModelInfo, RankEvidence,
                           StepRecord, load_evidence)


def test_evidence_json_round_trip(tmp_path):
    r = RankEvidence(steps=steps(3, 0.02, 0.005), dataloaders=[DataLoaderInfo(id=1, num_workers=2)],
                     forwards=[ForwardSite(key="s1", model=1, module="Net", location={"file": "t.py", "line": 3})],
                     models=[ModelInfo(id=1, cls="Net", params_total=10)],
                     exceptions=[ExceptionInfo(type="ValueError", message="x")],
                     memory={"samples": [{"allocated": 1}]})
    ev = ev_with(r)
    ev.gpu = {"provider": "none"}
    p = tmp_path / "evidence.json"
    ev.save(p)
    back = load_evidence(p)
    assert back.to_dict() == ev.to_dict()
    assert isinstance(back.primary.steps[0], StepRecord)
    assert back.primary.forwards[0].location["line"] == 3
    assert back.schema_version == SCHEMA_VERSION
    assert load_evidence(tmp_path).to_dict() == ev.to_dict()    # a run directory works too


@pytest.mark.parametrize("content,needle", [
    ("", "is empty"),
    ('{"schema_version": 1, "run": {', "not valid JSON"),
    ("[1, 2]", "JSON object"),
    ('{"run": {}}', "no schema_version"),
    (json.dumps({"schema_version": SCHEMA_VERSION + 1}), "newer than this diag"),
    (json.dumps({"schema_version": 1, "ranks": [{"steps": 5}]}), "malformed"),
])
def test_bad_evidence_files_are_one_sentence(tmp_path, content, needle):
    p = tmp_path / "e.json"
    p.write_text(content)
    with pytest.raises(DiagError) as e:
        load_evidence(p)
    assert needle in e.value.message
    assert "\n" not in e.value.message


def test_missing_evidence_file(tmp_path):
    with pytest.raises(DiagError, match="does not exist"):
        load_evidence(tmp_path / "nope.json")


def test_median_step_skips_warmup_and_instrumented():
    r = RankEvidence(steps=steps(6, 0.01, 0.0))
    r.steps[0].total_s = 5.0                # warm-up
    r.steps[3].total_s = 9.0
    r.steps[3].instrumented = True          # FLOP counting: not timing
    med = r.median_step()
    assert med["total_s"] == pytest.approx(0.01) and med["n"] == 4
