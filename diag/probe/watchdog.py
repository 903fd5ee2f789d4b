"""The probe's side of supervision (diag/supervise.py has diag's side). Runs in the user's process.

- :func:`setup` starts a watchdog thread that notices the parent (diag, or torchrun's launcher for a
  rank) is gone: it kills every process carrying the run marker, then this process. It wakes twice a
  second and does one ``getppid()``: nothing on the hot path.
- :func:`restore_environment` undoes what diag set only for the probe's own start-up
  (``PYTHONSAFEPATH``, so that a ``json.py`` or ``diag.py`` in the current directory shadows nothing of
  diag's), so the script and what it starts see the user's environment.
- :class:`TaggedSink` wraps the event sink: every event carries the run id (the runner ignores events
  of another run written into the same directory), the script's arguments in the start event are
  redacted, the events file is private (0600), and a full disk never raises inside the user's script.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
from diag.evidence import events as E

MARKER = "DIAG_RUN_ID"
CHECK_EVERY_S = 0.5


def run_id() -> str | None:
    return os.environ.get(MARKER) or None


def _pkg_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def restore_environment() -> None:
    if os.environ.pop("DIAG_SAFEPATH_SET", None):
        os.environ.pop("PYTHONSAFEPATH", None)
    # diag's runner puts diag's source tree first on PYTHONPATH when diag runs from one (diag/runner.py):
    # the probe is imported by now; the script and what it starts get the user's PYTHONPATH back
    if run_id() is not None:
        parts = os.environ.get("PYTHONPATH", "").split(os.pathsep)
        if parts and parts[0] == _pkg_root():
            rest = os.pathsep.join(parts[1:])
            if rest:
                os.environ["PYTHONPATH"] = rest
            else:
                os.environ.pop("PYTHONPATH", None)


def setup() -> threading.Thread | None:
    """Start the parent watchdog (only under diag: the run marker is set)."""
    rid = run_id()
    ppid = os.getppid()
    if rid is None or ppid <= 1:
        return None
    t = threading.Thread(target=_watch, args=(ppid, rid), daemon=True, name="diag-watchdog")
    t.start()
    return t


def _watch(ppid: int, rid: str) -> None:
    import time

    while True:
        time.sleep(CHECK_EVERY_S)
        if os.getppid() != ppid:
            break
    # the parent is gone (diag killed, the launcher killed): take the whole run down with us
    try:
        from diag.supervise import kill_pids, marked_pids

        for _ in range(3):
            pids = marked_pids(rid)
            if not pids:
                break
            kill_pids(pids)
    except BaseException:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


class TaggedSink:
    """The event sink as the probe uses it (``sink(event)``, ``sink.close()``), see the module doc."""

    def __init__(self, sink, path: str | None = None):
        self._sink = sink
        self.run_id = run_id()
        self.disk_error: str | None = None
        if path:
            try:
                os.chmod(path, 0o600)
            except OSError:
                pass

    def __call__(self, event: dict) -> None:
        if self.disk_error is not None:
            return
        if self.run_id is not None:
            event["run"] = self.run_id
        if event.get("kind") == E.START and "argv" in event:
            from diag.redact import redact_args

            event["argv"] = redact_args(event["argv"])
        try:
            self._sink(event)
        except OSError as e:   # a full disk: diag sees it and ends the run; the script is not hurt
            self.disk_error = e.strerror or str(e)
            if getattr(self._sink, "ready", None) is not None:
                self._sink.ready = False   # its step path (step_path) stops too

    def step_path(self):
        """The wrapped sink's fast path for deferred events (:meth:`diag.probe.sink.FileSink.step_path`)
        with this sink's tag: None when it has none, or when ``argv`` redaction could apply."""
        inner = getattr(self._sink, "step_path", None)
        got = inner() if callable(inner) and self.disk_error is None else None
        if got is None:
            return None
        sink, tags = got
        tags = dict(tags)
        if self.run_id is not None:
            tags["run"] = self.run_id
        return sink, tags

    def close(self) -> None:
        self._sink.close()

    def __getattr__(self, name):
        return getattr(self._sink, name)


def script_path(script: str) -> None:
    """``sys.path`` as ``python script.py`` has it: the script's directory first (not the current
    directory, which ``python -m`` would have put there)."""
    here = os.path.dirname(script)
    cwd = os.getcwd()
    if not getattr(sys.flags, "safe_path", False) and sys.path and sys.path[0] in ("", cwd):
        del sys.path[0]
    root = _pkg_root()
    if root in sys.path and _installed_elsewhere(root):
        sys.path.remove(root)   # came from the runner's PYTHONPATH: `python script.py` has no such entry
    sys.path.insert(0, here)


def _installed_elsewhere(root: str) -> bool:
    """Whether an import finder other than sys.path's (an editable install's) finds diag at ``root``:
    then a child process (a spawned DataLoader worker) finds diag without ``root`` on sys.path."""
    import importlib.machinery

    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder or not hasattr(finder, "find_spec"):
            continue
        try:
            spec = finder.find_spec("diag", None)
        except Exception:
            continue
        origin = getattr(spec, "origin", None) or ""
        if origin.startswith(root + os.sep):
            return True
    return False
