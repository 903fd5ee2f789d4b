"""``diag tui --attach PID``: the live app on a running job. A background thread samples consecutive
windows (``window_s`` each) and hands each one to the app as a new snapshot, judged as ``diag attach``
judges it; the Log tab gets one line per window (the phase shares and the hottest line). Quitting the
app ends the sampling (py-spy included); the job itself is never touched.

Textual-free (the app imports nothing from here; diag.commands.tui wires it in).
"""
from __future__ import annotations

import threading
import time

from diag.tui.live import Snapshot, Source

WINDOW_S = 5.0


class AttachFeed(Source):
    mode = "attach"

    def __init__(self, pid: int | None = None, job: int | None = None, window_s: float = WINDOW_S,
                 rate: int | None = None, simulate_gpus: str | None = None, gpu_interval: float = 1.0,
                 run_dir: str | None = None, require_torch: bool = True):
        from diag.attach.session import DEFAULT_RATE_HZ

        self.pid, self.job, self.window_s = pid, job, window_s
        self.rate = rate or DEFAULT_RATE_HZ
        self.simulate_gpus, self.gpu_interval = simulate_gpus, gpu_interval
        self.run_dir = run_dir
        self.require_torch = require_torch
        self.label = f"PID {job} (job)" if job is not None else f"PID {pid}"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._evidence = None
        self._new = False
        self._logs: list[tuple[str, str]] = []
        self.windows = 0
        self.error: str | None = None

    # ---- Source -----------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="diag-attach", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """False: the app has nothing to stop (the job is never stopped from diag); quitting is
        immediate and diag.commands.tui ends the sampling thread (:meth:`stop`, :meth:`wait_ended`)."""
        return False

    @property
    def sampling(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def pending(self) -> bool:
        with self._lock:
            return self._new

    def evaluate(self) -> Snapshot | None:
        from diag.findings import sort_findings
        from diag.registry import Registry

        with self._lock:
            ev, self._new = self._evidence, False
        if ev is None:
            return None
        return Snapshot(ev, sort_findings(Registry.discover().run(ev)), final=False)

    def min_interval(self, refresh_s: float) -> float:
        return refresh_s

    def take_logs(self) -> list[tuple[str, str]]:
        with self._lock:
            out, self._logs = self._logs, []
        return out

    def stop(self, reason: str = "") -> None:
        self._stop.set()

    def wait_ended(self, timeout: float) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.sampling

    # ---- the sampling loop ----------------------------------------------------------------------------
    def _log(self, text: str, stream: str = "stdout") -> None:
        with self._lock:
            self._logs.append((stream, text + "\n"))

    def _loop(self) -> None:
        from diag.attach.evidence import window_to_evidence
        from diag.attach.session import sample
        from diag.errors import DiagError

        self._log(f"diag: sampling {self.label} in windows of {self.window_s:g} s at {self.rate} Hz "
                  "(the job is not paused); q quits")
        while not self._stop.is_set():
            try:
                w = sample(pid=self.pid, job=self.job, duration=self.window_s, rate=self.rate,
                           simulate_gpus=self.simulate_gpus, gpu_interval=self.gpu_interval,
                           require_torch=self.require_torch)
            except DiagError as e:
                self.error = e.message
                self._log(f"diag: {e.message}", "stderr")
                break
            except Exception as e:  # never a traceback in the app
                self.error = f"{type(e).__name__}: {e}"
                self._log(f"diag: sampling failed: {self.error}", "stderr")
                break
            ev = window_to_evidence(w)
            self.windows += 1
            if self.run_dir:
                try:
                    from pathlib import Path
                    ev.run.run_dir = self.run_dir
                    ev.save(Path(self.run_dir) / "evidence.json")
                except OSError:
                    ev.run.run_dir = None
            for r in ev.ranks:
                main = (r.extras.get("attach") or {}).get("main") or {}
                ph = sorted(((p, d.get("share", 0)) for p, d in (main.get("phases") or {}).items()),
                            key=lambda x: -x[1])
                top = (main.get("hot_lines") or [None])[0]
                shares = ", ".join(f"{p} {100 * s:.0f}%" for p, s in ph if s >= 0.01)
                where = f" · hottest {top['file'].rsplit('/', 1)[-1]}:{top['line']} {top.get('code') or ''}" \
                    if top else ""
                stuck = " · STUCK" if main.get("stuck") else ""
                self._log(f"{time.strftime('%H:%M:%S')} window {self.windows} rank {r.rank} "
                          f"(PID {r.pid}): {shares}{where}{stuck}")
            with self._lock:
                self._evidence = ev
                self._new = True
            if any(not (r.extras.get("attach") or {}).get("alive_after", True) for r in ev.ranks):
                self._log("diag: the job ended; sampling stopped")
                break
