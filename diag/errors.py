"""Exit codes and the one error type diag turns into a one-sentence message."""
from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0              # nothing at or above --fail-on
    FINDINGS = 1        # findings at or above --fail-on
    USAGE = 2           # usage error or bad input
    SCRIPT_FAILED = 3   # the user's script failed (its traceback is shown, findings still come out)
    INTERRUPTED = 130   # Ctrl-C


class DiagError(Exception):
    """A problem with the user's input: printed as one sentence, exit code 2 (unless given)."""

    def __init__(self, message: str, code: int = ExitCode.USAGE, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = int(code)
        self.hint = hint
