"""diag.report.console: the text report for people.

The demo's report is compared with a golden text (tests/fixtures/report/demo-80.txt, the recorded demo
run of tests/fixtures/tui at 80 columns). After an intended change, rewrite it with
``DIAG_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_report_console.py`` and read the diff."""
from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from diag.findings import Severity, count_phrase

sys.path.insert(0, str(Path(__file__).parent))
from tui_support import demo_evidence, demo_findings  # noqa: E402

GOLDEN = Path(__file__).parent / "fixtures" / "report" / "demo-80.txt"


def report(verbose: bool = False, width: int = 80, findings=None, evidence=None) -> str:
    from rich.console import Console

    from diag.report.console import render_console

    c = Console(file=io.StringIO(), width=width, color_system=None, record=True)
    render_console(evidence or demo_evidence(), demo_findings() if findings is None else findings, c,
                   verbose=verbose)
    return "\n".join(ln.rstrip() for ln in c.export_text().splitlines()) + "\n"


def test_demo_report_matches_its_golden_text():
    text = report()
    if os.environ.get("DIAG_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "the demo's text report changed (DIAG_UPDATE_GOLDEN=1 rewrites it)"


def test_demo_report_fits_two_screens_findings_first():
    text = report()
    lines = text.splitlines()
    assert len(lines) <= 100, len(lines)
    findings = demo_findings()
    problems = [f for f in findings if f.severity.rank >= Severity.INFO.rank]
    firsts = [next(i for i, ln in enumerate(lines) if f" {f.id} — " in ln) for f in problems]
    quiet = next(i for i, ln in enumerate(lines) if ln.startswith(("PASS ", "SKIPPED ")))
    assert firsts == sorted(firsts) and max(firsts) < quiet      # findings first, worst first
    assert lines[firsts[0]].lstrip().startswith("ERROR")


def test_raw_fields_only_with_verbose():
    """The internal key=value line is behind -v (JSON carries all of them)."""
    short, full = report(), report(verbose=True)
    assert "data_wait_per_step_s=" not in short and "loader_id=" not in short and " · steps=" not in short
    assert "data_wait_per_step_s=" in full
    assert "why: " not in short and "why: " in full
    info = [f for f in demo_findings() if f.severity is Severity.INFO and f.fix]
    assert info and all(" ".join(f.fix.split()[:6]) not in " ".join(short.split()) for f in info)
    assert all(" ".join(f.fix.split()[:6]) in " ".join(full.split()) for f in info)


def test_passed_and_skipped_fold_to_one_line_per_group():
    findings = demo_findings()
    rest = [f for f in findings if f.severity in (Severity.PASS, Severity.SKIPPED)]
    short, full = report(), report(verbose=True)
    rows = [ln for ln in short.splitlines() if ln.startswith(("PASS ", "SKIPPED "))]
    assert 2 <= len(rows) <= 5 < len(rest)
    assert all(len(r) <= 80 for r in rows)                      # cut to the terminal, never wrapped
    n_pass = sum(1 for f in rest if f.severity is Severity.PASS)
    assert rows[0].startswith("PASS") and f"{n_pass} checks passed" in rows[0]
    gpu = [r for r in rows if "GPU checks skipped (a CPU run" in r]
    assert len(gpu) == 1, rows                                   # the GPU checks a CPU run skips: one line, why
    assert "-v: " in short and "-v: " not in full
    # with -v: every passed and skipped check on its own line, its message in full
    long = max(rest, key=lambda f: len(f.message))
    assert all(any(ln.startswith(("PASS ", "SKIPPED ")) and f" {f.id} " in ln for ln in full.splitlines())
               for f in rest)
    assert " ".join(long.message.split()[-3:]) in " ".join(full.split())
    n = sum(1 for f in findings if f.severity is Severity.WARNING)
    assert count_phrase(Severity.WARNING, n) in short
    assert count_phrase(Severity.WARNING, 1) == "1 warning" and count_phrase(Severity.PASS, 2) == "2 passed"


def test_docs_link_is_one_whole_line():
    findings = demo_findings()
    link = max((f.docs for f in findings if f.docs and f.severity.rank > Severity.INFO.rank), key=len)
    assert len(link) > 80
    assert any(ln.strip() == link for ln in report().splitlines())


@pytest.mark.parametrize("gpu_run", [False, True])
def test_gpu_skips_are_folded_only_on_a_cpu_run(gpu_run):
    from diag.report.console import folded_quiet
    from diag.findings import Finding

    ev = demo_evidence()
    if gpu_run:
        for m in ev.primary.models:
            m.devices = ["cuda:0"]
    skipped = [Finding(id="gpu.idle", severity=Severity.SKIPPED, title="t",
                       message="The model trains on cpu: the check is about CUDA training."),
               Finding(id="x.y", severity=Severity.SKIPPED, title="t", message="Nothing to look at.")]
    text = "\n".join(t.plain for t in folded_quiet(skipped, ev))
    assert ("GPU check skipped (a CPU run)" in text) is (not gpu_run)
    assert ("2 other checks skipped" in text) is gpu_run
