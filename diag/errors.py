"""Exit codes, the rule that picks one for a judged run, and the one error type diag turns into a
one-sentence message."""
from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0              # nothing at or above --fail-on
    FINDINGS = 1        # findings at or above --fail-on
    USAGE = 2           # usage error or bad input
    SCRIPT_FAILED = 3   # the user's script failed (its traceback is shown, findings still come out)
    INTERRUPTED = 130   # Ctrl-C



def exit_code_for(evidence, findings, fail_on: str) -> ExitCode:
    """The exit code of a judged run: the script's fate first (interrupted, failed), then the findings at or
    above ``fail_on`` (``error``, ``warning``, ``info`` or ``never``; a crashed check counts as an error)."""
    from diag.findings import FAIL_ON_LEVELS

    if evidence.run.status == "interrupted":
        return ExitCode.INTERRUPTED
    if evidence.run.status in ("failed", "oom", "killed"):
        return ExitCode.SCRIPT_FAILED
    level = FAIL_ON_LEVELS[fail_on]
    if any(f.severity.rank >= level for f in findings):
        return ExitCode.FINDINGS
    return ExitCode.OK


class DiagError(Exception):
    """A problem with the user's input: printed as one sentence, exit code 2 (unless given)."""

    def __init__(self, message: str, code: int = ExitCode.USAGE, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = int(code)
        self.hint = hint
