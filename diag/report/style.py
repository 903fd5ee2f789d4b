"""How each severity looks, in one table shared by the console report and the TUI (no rich, no textual).

``style`` is a rich style string; ``label`` the badge. Problems (crashed, error, warning, info) are shown in
capitals everywhere; the quiet results (pass, skipped) are capitals in the console report, where they are
the first word of a line, and lower case in the TUI's findings list, where they must not compete with the
problems above them (:func:`list_label`).
"""
from __future__ import annotations

from typing import NamedTuple

from diag.findings import Severity


class SeverityStyle(NamedTuple):
    style: str
    label: str


SEVERITY_STYLES: dict[Severity, SeverityStyle] = {
    Severity.CRASHED: SeverityStyle("bold magenta", "CRASHED"),
    Severity.ERROR: SeverityStyle("bold red", "ERROR"),
    Severity.WARNING: SeverityStyle("bold yellow", "WARNING"),
    Severity.INFO: SeverityStyle("bold cyan", "INFO"),
    Severity.PASS: SeverityStyle("green", "PASS"),
    Severity.SKIPPED: SeverityStyle("dim", "SKIPPED"),
}

QUIET = (Severity.PASS, Severity.SKIPPED)


def list_label(severity: Severity) -> str:
    """The label in the TUI's findings list: quiet results in lower case."""
    label = SEVERITY_STYLES[severity].label
    return label.lower() if severity in QUIET else label
