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


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (a CI job cancelled, a terminal closed): the same clean stop as Ctrl-C."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def on_stop_signals(handler, only_if_default: bool = False):
    """Install ``handler`` for SIGTERM and SIGHUP (``only_if_default``: where the signal still has its
    default action); returns a function that puts the previous handlers back. Outside the main thread
    nothing can be installed, and the returned function does nothing."""
    import signal
    import threading

    previous: dict = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                if only_if_default and signal.getsignal(sig) not in (signal.SIG_DFL, None):
                    continue
                previous[sig] = signal.signal(sig, handler)
            except (ValueError, OSError):
                pass

    def restore() -> None:
        for sig, h in previous.items():
            try:
                signal.signal(sig, h)
            except (ValueError, OSError):
                pass

    return restore

