"""Issue 27, classes 2 and 20: -o and --html never write over an input of the run (the script, a file
among its arguments, the evidence read by --from, a baseline, the run directory's files) nor each
other: one sentence, exit 2, before anything runs, the input unchanged. Relative report paths are
fixed before anything runs."""
from __future__ import annotations

import os

import pytest

from conftest import run_diag
from diag.testing import EvidenceBuilder

SCRIPT = "print('training')\n"


def evidence(path):
    EvidenceBuilder().cuda_training().steps(10, total_s=2.5, samples=8).build().save(path)
    return path


def refused(r, *needles):
    assert r.code == 2, (r.code, r.stdout[-500:], r.stderr)
    assert "Traceback" not in r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


@pytest.mark.parametrize("opt", ["-o", "--html"])
def test_a_report_never_replaces_the_script(tmp_path, opt):
    s = tmp_path / "s.py"
    s.write_text(SCRIPT)
    r = run_diag("check", "--script", "s.py", opt, "s.py", cwd=tmp_path)
    refused(r, "is the training script", "never writes over an input")
    assert s.read_text() == SCRIPT
    assert not (tmp_path / ".diag").exists()          # refused before anything ran
    link = tmp_path / "link.py"
    link.symlink_to(s)
    hard = tmp_path / "hard.py"
    os.link(s, hard)
    for other in ("link.py", "hard.py"):
        refused(run_diag("check", "--script", "s.py", opt, other, cwd=tmp_path), "training script")
    assert s.read_text() == SCRIPT


def test_a_report_never_replaces_the_evidence_it_judges(tmp_path):
    rd = tmp_path / "rd"
    rd.mkdir()
    ev = evidence(rd / "evidence.json")
    before = ev.read_bytes()
    for src in (str(ev), str(rd)):
        for opt in ("-o", "--html"):
            refused(run_diag("check", "--from", src, "--format", "json", opt, str(ev), cwd=tmp_path),
                    "the evidence read by --from")
    refused(run_diag("attach", "--from", str(ev), "-o", str(ev), cwd=tmp_path), "the evidence read by --from")
    assert ev.read_bytes() == before


def test_a_report_never_replaces_a_baseline_a_script_argument_or_the_other_report(tmp_path):
    base = evidence(tmp_path / "base.json")
    new = evidence(tmp_path / "new.json")
    before = base.read_bytes()
    refused(run_diag("compare", str(base), str(new), "-o", str(base), cwd=tmp_path), "the baseline compared")
    refused(run_diag("compare", str(base), str(new), "--format", "json", "-o", str(new), cwd=tmp_path),
            "the run compared")
    refused(run_diag("check", "--from", str(new), "--baseline", str(base), "-o", str(base), cwd=tmp_path),
            "the baseline read by --baseline")
    assert base.read_bytes() == before
    s = tmp_path / "s.py"
    s.write_text(SCRIPT)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("lr: 1\n")
    refused(run_diag("check", "--script", "s.py", "-o", "cfg.yaml", "--", "--config", "cfg.yaml", cwd=tmp_path),
            "a file among the script's arguments")
    refused(run_diag("check", "--script", "s.py", "-o", "cfg.yaml", "--", "--config=cfg.yaml", cwd=tmp_path),
            "a file among the script's arguments")
    assert cfg.read_text() == "lr: 1\n"
    refused(run_diag("check", "--from", str(new), "--format", "json", "-o", "r.html", "--html", "./r.html",
                     cwd=tmp_path), "both name")
    rd = tmp_path / "rd"
    rd.mkdir()
    refused(run_diag("check", "--script", "s.py", "--run-dir", str(rd), "-o", str(rd / "evidence.json"),
                     cwd=tmp_path), "a file diag writes in --run-dir")


def test_the_report_may_still_replace_an_earlier_report(tmp_path):
    ev = evidence(tmp_path / "evidence.json")
    out = tmp_path / "report.json"
    out.write_text("old")
    r = run_diag("check", "--from", str(ev), "--format", "json", "--fail-on", "never", "-o", "report.json",
                 cwd=tmp_path)
    assert r.code == 0, r.stderr
    assert out.read_text().startswith("{")
