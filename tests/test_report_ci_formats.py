"""SARIF and JUnit as CI systems accept them: validated against the SARIF 2.1.0 JSON schema and the
JUnit XSD CI readers use (both vendored in tests/fixtures/schemas, see SOURCES.md)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from diag.evidence import Evidence, RankEvidence
from diag.findings import Finding, Location, Severity
from diag.report.junit import render_junit
from diag.report.sarif import render_sarif

SCHEMAS = Path(__file__).parent / "fixtures" / "schemas"
REPO = Path(__file__).resolve().parents[1]


def _sarif_validator():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((SCHEMAS / "sarif-2.1.0-rtm.5.json").read_text())
    return jsonschema.Draft4Validator(schema)


def _junit_schema():
    xmlschema = pytest.importorskip("xmlschema")
    return xmlschema.XMLSchema(str(SCHEMAS / "junit-10.xsd"))


def _checkout(tmp_path) -> Path:
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / "src" / "train.py").write_text("print('x')\n" * 50)
    return root


def _evidence(script: Path) -> Evidence:
    ev = Evidence()
    ev.run.script = str(script)
    ev.run.cwd = str(script.parent)
    ev.ranks.append(RankEvidence())
    return ev


def _findings(script: Path, line=12) -> list[Finding]:
    return [
        Finding(id="eval.no-grad", severity=Severity.ERROR, title="Evaluation without no_grad",
                message="Evaluation forwards build graphs.", fix="wrap in torch.no_grad()",
                location=Location(str(script), line, "evaluate"), docs="https://pytorch.org/docs/x"),
        Finding(id="dataloader.workers", severity=Severity.WARNING, title="Too few workers",
                message="Data waits 40% of the step.", docs="https://pytorch.org/docs/y"),
        Finding(id="cost.mfu", severity=Severity.INFO, title="MFU", message="MFU is 31%."),
        Finding(id="sync.item", severity=Severity.WARNING, title="Host sync", message="a sync",
                location=Location("/usr/lib/python3/site.py", 3)),
        Finding(id="amp.unused", severity=Severity.PASS, title="AMP", message="ok"),
        Finding(id="gpu.util", severity=Severity.SKIPPED, title="GPU", message="no GPU"),
        Finding(id="broken.check", severity=Severity.CRASHED, title="Broken", message="raised KeyError",
                evidence={"traceback": "Traceback ...\nKeyError: 'x'"}),
    ]


def test_sarif_is_valid_repo_relative_and_located(tmp_path):
    root = _checkout(tmp_path)
    script = root / "src" / "train.py"
    doc = json.loads(render_sarif(_evidence(script), _findings(script)))
    errors = sorted(_sarif_validator().iter_errors(doc), key=str)
    assert not errors, errors[0]
    run = doc["runs"][0]
    assert run["originalUriBaseIds"]["SRCROOT"]["uri"] == root.resolve().as_uri() + "/"
    results = {r["ruleId"]: r for r in run["results"]}
    assert set(results) == {"eval.no-grad", "dataloader.workers", "cost.mfu", "sync.item", "broken.check"}
    for r in results.values():
        assert r["locations"], r["ruleId"]                     # every result has a location
        assert r["partialFingerprints"]["diagFinding/v1"]
    art = results["eval.no-grad"]["locations"][0]["physicalLocation"]
    assert art["artifactLocation"] == {"uri": "src/train.py", "uriBaseId": "SRCROOT"}
    assert art["region"]["startLine"] == 12
    # no line of its own: reported at the script
    art = results["dataloader.workers"]["locations"][0]["physicalLocation"]
    assert art["artifactLocation"] == {"uri": "src/train.py", "uriBaseId": "SRCROOT"}
    # outside the checkout: an absolute file URI, no base id
    art = results["sync.item"]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert art["uri"].startswith("file:///") and "uriBaseId" not in art
    rules = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    assert rules["eval.no-grad"]["shortDescription"]["text"] == "Evaluation without no_grad"
    assert rules["eval.no-grad"]["helpUri"] == "https://pytorch.org/docs/x"
    for r in run["results"]:
        assert run["tool"]["driver"]["rules"][r["ruleIndex"]]["id"] == r["ruleId"]
    assert "/tmp" not in json.dumps(results["eval.no-grad"]["locations"])


def test_sarif_fingerprint_survives_moved_lines_and_source_root(tmp_path):
    root = _checkout(tmp_path)
    script = root / "src" / "train.py"
    a = json.loads(render_sarif(_evidence(script), _findings(script, line=12)))
    b = json.loads(render_sarif(_evidence(script), _findings(script, line=40)))
    fa = {r["ruleId"]: r["partialFingerprints"] for r in a["runs"][0]["results"]}
    fb = {r["ruleId"]: r["partialFingerprints"] for r in b["runs"][0]["results"]}
    assert fa == fb
    c = json.loads(render_sarif(_evidence(script), _findings(script), str(root / "src")))
    res = c["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["artifactLocation"]
    assert res == {"uri": "train.py", "uriBaseId": "SRCROOT"}


def test_sarif_without_git_uses_the_script_directory(tmp_path):
    script = tmp_path / "plain" / "train.py"
    script.parent.mkdir()
    script.write_text("pass\n")
    doc = json.loads(render_sarif(_evidence(script), _findings(script)))
    assert not list(_sarif_validator().iter_errors(doc))
    assert doc["runs"][0]["originalUriBaseIds"]["SRCROOT"]["uri"] == script.parent.resolve().as_uri() + "/"


def test_check_cli_sarif_source_root(tmp_path):
    ev = _evidence(tmp_path / "train.py")
    p = tmp_path / "e.json"
    ev.save(p)
    r = subprocess.run([sys.executable, "-m", "diag", "check", "--from", str(p), "--format", "sarif",
                        "--source-root", str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=300)
    doc = json.loads(r.stdout)
    assert not list(_sarif_validator().iter_errors(doc))
    r = subprocess.run([sys.executable, "-m", "diag", "check", "--from", str(p), "--format", "sarif",
                        "--source-root", str(tmp_path / "nope")], capture_output=True, text=True, cwd=REPO,
                       timeout=300)
    assert r.returncode == 2 and "--source-root" in r.stderr and "Traceback" not in r.stderr


def test_junit_is_valid_against_the_ci_schema(tmp_path):
    script = tmp_path / "train.py"
    xml = render_junit(_evidence(script), _findings(script), fail_on="warning")
    schema = _junit_schema()
    schema.validate(xml)
    import xml.etree.ElementTree as ET

    suite = ET.fromstring(xml)
    assert suite.get("failures") == "3" and suite.get("errors") == "1" and suite.get("skipped") == "1"
