"""diag.report.console: the text report."""
from __future__ import annotations

from diag.findings import Severity


def test_console_report_keeps_passed_and_skipped_to_a_line_each():
    """Problems in full; each passed or skipped check on one line cut to the terminal; -v in full."""
    import io
    import sys
    from pathlib import Path

    from rich.console import Console

    from diag.findings import count_phrase
    from diag.report.console import render_console

    sys.path.insert(0, str(Path(__file__).parent))
    from tui_support import demo_evidence, demo_findings

    ev, findings = demo_evidence(), demo_findings()
    rest = [f for f in findings if f.severity in (Severity.PASS, Severity.SKIPPED)]
    long = max(rest, key=lambda f: len(f.message))
    assert len(long.message) > 80

    def text(verbose: bool) -> str:
        c = Console(file=io.StringIO(), width=80, color_system=None, record=True)
        render_console(ev, findings, c, verbose=verbose)
        return c.export_text()

    short, full = text(False), text(True)
    rows = [ln for ln in short.splitlines() if ln.startswith(("PASS ", "SKIPPED "))]
    assert len(rows) == len(rest)                     # one line each, none wrapped
    row = next(ln for ln in rows if f" {long.id} " in ln)
    assert row.rstrip().endswith("…") and len(row.rstrip()) <= 80
    assert "-v shows" in short and "-v shows" not in full
    assert " ".join(long.message.split()[-3:]) in " ".join(full.split())   # the whole message with -v
    n = sum(1 for f in findings if f.severity is Severity.WARNING)
    assert count_phrase(Severity.WARNING, n) in short
    assert count_phrase(Severity.WARNING, 1) == "1 warning" and count_phrase(Severity.PASS, 2) == "2 passed"
