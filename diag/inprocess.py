"""The in-process API, for notebooks and for users who hold their model and loader in hand::

    import diag

    with diag.watch(max_steps=50) as run:
        train(model, loader)          # stopped quietly after 50 steps when max_steps is given

    run.findings()                    # list[Finding]
    run.evidence                      # Evidence (the same document `diag check` writes)
    print(run.report())               # the console report as text; run.report("json") for JSON

The same probe as ``diag check`` is installed in the current process; its hooks and patches are
removed when the block ends, even on error. An exception from the block propagates unchanged
(after being recorded); a stop at ``max_steps`` is swallowed.
"""
from __future__ import annotations

import os
import sys
import threading
import time

from diag import __version__
from diag.errors import DiagError
from diag.evidence import Evidence
from diag.fold import fold

_active_lock = threading.Lock()
_active: "WatchedRun | None" = None


class WatchedRun:
    def __init__(self, max_steps: int | None = None, save_to: str | None = None):
        if max_steps is not None and max_steps <= 0:
            raise DiagError(f"max_steps must be a positive number of steps, not {max_steps}")
        self.max_steps = max_steps
        self.save_to = save_to
        self.evidence = Evidence(diag_version=__version__)
        self.evidence.run.launcher = "in-process"
        self.evidence.run.cwd = os.getcwd()
        self.evidence.run.args = list(sys.argv)
        self.evidence.run.limits = {"steps": max_steps, "max_time": None}
        self._lock = threading.Lock()
        self._probe = None
        self._t0 = 0.0
        self._findings = None

    # the sink: events fold straight into the evidence
    def _sink(self, event: dict) -> None:
        with self._lock:
            fold(self.evidence, event)
            self._findings = None

    def __enter__(self) -> "WatchedRun":
        global _active
        from diag.probe.core import Probe
        from diag.probe.extensions import load_extensions

        with _active_lock:
            if _active is not None:
                raise DiagError("diag.watch() is already active in this process; nest no second one")
            _active = self
        self._t0 = time.monotonic()
        self.evidence.run.started_at = time.time()
        self._probe = Probe(self._sink, max_steps=self.max_steps, extensions=load_extensions())
        try:
            self._probe.install(scan_modules=True)
        except BaseException:
            self._release()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        from diag.probe.core import DiagStop, is_oom

        probe = self._probe
        suppress = False
        try:
            if exc is None:
                probe.finish("completed", 0)
            elif isinstance(exc, DiagStop):
                probe.finish(exc.status, 0, reason=exc.reason)
                suppress = True
            elif isinstance(exc, KeyboardInterrupt):
                probe.finish("interrupted", 130, exception=exc)
            else:
                probe.finish("oom" if is_oom(exc) else "failed", 1, exception=exc)
        finally:
            probe.uninstall()
            self._release()
            run = self.evidence.run
            run.ended_at = time.time()
            run.wall_s = round(time.monotonic() - self._t0, 3)
            statuses = [r.status for r in self.evidence.ranks] or ["completed"]
            run.status = statuses[0]
            if self.save_to:
                self.evidence.save(self.save_to)
        return suppress

    def _release(self) -> None:
        global _active
        with _active_lock:
            if _active is self:
                _active = None

    # ---- results -----------------------------------------------------------------------------------
    def findings(self, select=(), ignore=()):
        """Run every check over what was observed so far."""
        from diag.registry import Registry

        with self._lock:
            snapshot = Evidence.from_dict(self.evidence.to_dict())
        return Registry.discover().select(select, ignore).run(snapshot)

    def report(self, format: str = "text", width: int = 100) -> str:
        findings = self.findings()
        if format == "text":
            import io

            from rich.console import Console

            from diag.report.console import render_console

            buf = io.StringIO()
            render_console(self.evidence, findings, Console(file=buf, width=width, force_terminal=False))
            return buf.getvalue()
        from diag.errors import exit_code_for
        from diag.report import render

        return render(format, self.evidence, findings, exit_code_for(self.evidence, findings, "error"))


def watch(max_steps: int | None = None, save_to: str | None = None) -> WatchedRun:
    """Install diag's probe in this process for the duration of a ``with`` block."""
    return WatchedRun(max_steps=max_steps, save_to=save_to)
