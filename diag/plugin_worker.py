"""Third-party checks run here, in a worker process, never in diag's own.

diag's process lists plugin entry points from their metadata only; everything a plugin's code does
(importing it, running its checks) happens in one worker process per :class:`~diag.registry.Registry`,
started once (not per check) and reused for every run of the registry (the TUI re-judges live).

The worker is held to limits that do not depend on its cooperation:

* **time**: diag waits for each import and each check at most ``DIAG_CHECK_TIMEOUT`` seconds, then
  kills the worker (SIGKILL: a check stuck in C code holding the GIL is stopped too) and starts a new
  one for the checks left; the overrunning check is a ``crashed`` finding;
* **memory**: the worker's data size is capped (``RLIMIT_DATA``) at what it holds before each import
  and each check plus ``DIAG_CHECK_MEMORY`` MiB (default 2048): a check that allocates more gets
  ``MemoryError`` at once (instead of filling the machine);
* **output**: the worker's stdin is /dev/null and its stdout/stderr go to a file per check, so what a
  plugin prints never reaches diag's stdout (``--format json|sarif`` stay data only); it is kept in the
  finding (``evidence.plugin_output``);
* **its own process**: ``os._exit``, ``sys.exit`` at import, ``atexit`` handlers, ``os.chdir``,
  monkeypatching, closed file descriptors stay in the worker. A worker that dies mid-check makes that
  check ``crashed`` ("the plugin ended its worker process"); diag's exit code is its own. The worker
  runs in a private temporary directory, in a session of its own, dies with diag
  (``PR_SET_PDEATHSIG``, and a watchdog thread), is ended with SIGKILL (its ``atexit`` handlers
  never run) and its process group and descendants are killed with it.

Protocol: JSON lines over two pipes (not stdin/stdout, which belong to the plugin's prints).
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MEMORY_ENV = "DIAG_CHECK_MEMORY"
DEFAULT_MEMORY_MIB = 2048
OUTPUT_KEEP = 4000          # characters of a check's output kept in its finding
LOAD_EVIDENCE_TIMEOUT_S = 120.0
START_TIMEOUT_S = 60.0


def memory_limit_mib() -> int | None:
    """DIAG_CHECK_MEMORY in MiB (0 or 'none': no limit). A bad value is a usage error."""
    from diag.errors import DiagError

    raw = os.environ.get(MEMORY_ENV, "").strip()
    if not raw:
        return DEFAULT_MEMORY_MIB
    if raw.lower() in ("0", "none", "off"):
        return None
    try:
        v = int(raw)
    except ValueError:
        raise DiagError(f"{MEMORY_ENV}={raw!r} is not a whole number of MiB") from None
    if v < 64:
        raise DiagError(f"{MEMORY_ENV}={raw!r} must be at least 64 (MiB), or 0 for no limit")
    return v


class WorkerDied(Exception):
    """The worker ended or broke the protocol; ``why`` is one sentence."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


class WorkerTimeout(Exception):
    pass


# ---- diag's side -------------------------------------------------------------------------------------

class PluginWorker:
    """One worker process (diag's side of the protocol)."""

    def __init__(self, memory_mib: int | None):
        self.memory_mib = memory_mib
        self.proc: subprocess.Popen | None = None
        self._r = self._w = None
        self._buf = b""
        self._dir: str | None = None     # the worker's own directory, from start() to close()
        self.started_s = 0.0

    # -- life ------------------------------------------------------------------------------------------
    def start(self) -> "PluginWorker":
        from diag import supervise

        t0 = time.monotonic()
        self._dir = tempfile.mkdtemp(prefix="diag-plugins-")
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        env = dict(os.environ)
        env.pop(supervise.MARKER, None)
        pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        if os.path.basename(pkg_root) not in ("site-packages", "dist-packages"):
            env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["DIAG_WORKER_PARENT"] = str(os.getpid())
        env.setdefault("OPENBLAS_NUM_THREADS", "1")   # its per-thread buffers would eat the memory cap
        if self.memory_mib:
            env["DIAG_WORKER_MEMORY_MIB"] = str(self.memory_mib)
        import threading

        main_thread = threading.current_thread() is threading.main_thread()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "diag.plugin_worker", str(req_r), str(resp_w)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                cwd=self._dir, env=env, pass_fds=(req_r, resp_w), start_new_session=True,
                preexec_fn=supervise.child_preexec(os.getpid()) if main_thread else None)
        except OSError as e:
            for fd in (req_r, req_w, resp_r, resp_w):
                os.close(fd)
            raise WorkerDied(f"the plugin worker could not be started: {e.strerror}") from None
        supervise.OWN_HELPERS.add(self.proc.pid)
        os.close(req_r)
        os.close(resp_w)
        self._w, self._r = req_w, resp_r
        os.set_inheritable(self._w, False)
        os.set_inheritable(self._r, False)
        _LIVE.add(self)
        msg = self.receive(START_TIMEOUT_S)
        if msg.get("ev") != "hello":
            raise WorkerDied("the plugin worker did not start")
        self.started_s = time.monotonic() - t0
        return self

    def close(self) -> None:
        """End the worker at once (SIGKILL to it, its process group and its descendants)."""
        _LIVE.discard(self)
        p = self.proc
        self.proc = None
        for fd in (self._w, self._r):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._w = self._r = None
        if p is not None:
            from diag import supervise

            try:
                supervise.kill_everything(None, p.pid if p.poll() is None else None, {}, rounds=2)
            except Exception:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)   # a session of its own: whatever it started
            except OSError:
                pass
            try:
                p.wait(timeout=5)
            except Exception:
                pass
            supervise.OWN_HELPERS.discard(p.pid)
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    # -- messages --------------------------------------------------------------------------------------
    def send(self, msg: dict) -> None:
        data = (json.dumps(msg) + "\n").encode()
        try:
            while data:
                n = os.write(self._w, data)
                data = data[n:]
        except (OSError, TypeError):
            raise WorkerDied(self._death("while diag sent it work")) from None

    def receive(self, timeout: float | None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WorkerTimeout()
            try:
                ready, _, _ = select.select([self._r], [], [], left)
            except InterruptedError:
                continue
            except (OSError, ValueError, TypeError):
                raise WorkerDied(self._death("")) from None
            if not ready:
                continue
            try:
                chunk = os.read(self._r, 1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                raise WorkerDied(self._death(""))
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
        except ValueError:
            raise WorkerDied("the plugin wrote into diag's connection with its worker") from None
        if not isinstance(msg, dict):
            raise WorkerDied("the plugin wrote into diag's connection with its worker")
        return msg

    def _death(self, when: str) -> str:
        p = self.proc
        code = None
        if p is not None:
            try:
                code = p.wait(timeout=2)
            except Exception:
                code = p.poll()
        if code is None:
            how = "closed its connection with diag"
        elif code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return f"the plugin's worker process {how}" + (f" {when}" if when else "")


_LIVE: "set[PluginWorker]" = set()


def close_all() -> None:
    for w in list(_LIVE):
        try:
            w.close()
        except Exception:
            pass


import atexit  # noqa: E402

atexit.register(close_all)


# ---- the worker's side ---------------------------------------------------------------------------------

def _set_memory_limit() -> None:
    """The soft RLIMIT_DATA: what the worker holds now (its modules, the plugins, the evidence) plus
    the budget, set again before each import and each check."""
    mib = os.environ.get("DIAG_WORKER_MEMORY_MIB")
    if not mib:
        return
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_DATA, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        with open("/proc/self/status") as f:
            size = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmData:"))
        limit = size + int(mib) * (1 << 20)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, resource.RLIM_INFINITY))
    except Exception:
        pass


def _no_memory_limit() -> None:
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_DATA, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except Exception:
        pass


def _watch_parent() -> None:
    """Exit when diag is gone (PR_SET_PDEATHSIG only follows the thread that started the worker)."""
    import threading

    parent = int(os.environ.get("DIAG_WORKER_PARENT") or 0)

    def loop():
        while True:
            if parent and os.getppid() != parent:
                os._exit(137)
            time.sleep(0.5)

    threading.Thread(target=loop, daemon=True, name="diag-worker-watchdog").start()


class _Capture:
    """fd 1 and 2 (and sys.stdout/sys.stderr) into a fresh file while a plugin's code runs."""

    def __init__(self):
        self.path = None

    def __enter__(self):
        fd, self.path = tempfile.mkstemp(prefix="out-", dir=os.getcwd() if os.access(".", os.W_OK) else None)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = open(1, "w", closefd=False, errors="backslashreplace")
        sys.stderr = open(2, "w", closefd=False, errors="backslashreplace")
        return self

    def __exit__(self, *exc):
        for s in (sys.stdout, sys.stderr):
            try:
                s.flush()
            except Exception:
                pass
        text = ""
        try:
            with open(self.path, "rb") as f:
                f.seek(0, 2)
                size = f.tell()
                f.seek(max(0, size - OUTPUT_KEEP * 4))
                text = f.read().decode("utf-8", "replace")[-OUTPUT_KEEP:]
            os.unlink(self.path)
        except Exception:
            pass
        self.text = text
        return False


def worker_main(req_fd: int, resp_fd: int) -> None:
    import atexit as _atexit

    # the protocol's fds, out of the way of fds 0-2 and of a plugin closing low fds
    req = os.dup(req_fd) if req_fd < 10 else req_fd
    resp = os.dup(resp_fd) if resp_fd < 10 else resp_fd
    for fd in {req_fd, resp_fd} - {req, resp}:
        os.close(fd)

    def send(msg: dict) -> None:
        data = (json.dumps(msg, default=str) + "\n").encode()
        while data:
            n = os.write(resp, data)
            data = data[n:]

    _watch_parent()
    from diag.findings import Finding, Severity
    from diag.evidence import Evidence
    from diag.registry import _crashed, _is_builtin, _specs_in, run_one  # noqa: F401
    send({"ev": "hello", "pid": os.getpid()})

    specs: dict[tuple[str, str], object] = {}
    evidence = None
    buf = b""

    def requests():
        nonlocal buf
        while True:
            while b"\n" not in buf:
                chunk = os.read(req, 1 << 20)
                if not chunk:
                    os._exit(0)
                buf += chunk
            line, buf = buf.split(b"\n", 1)
            yield json.loads(line)

    for msg in requests():
        op = msg.get("op")
        if op == "quit":
            break
        if op == "load":
            from importlib.metadata import entry_points

            skip = set(msg.get("skip") or [])
            eps = [ep for ep in entry_points(group="diag.checks") if not _is_builtin(ep)]
            for ep in sorted(eps, key=lambda e: e.name):
                key = f"{ep.name} = {ep.value}"
                if key in skip:
                    continue
                dist = getattr(ep, "dist", None)
                source = f"{getattr(dist, 'name', None) or '?'} ({ep.name})"
                send({"ev": "loading", "ep": key})
                error = None
                out = []
                _set_memory_limit()
                with _Capture() as cap:
                    try:
                        obj = ep.load()
                        found = _specs_in(obj, source)
                    except BaseException as e:  # noqa: BLE001 - SystemExit/KeyboardInterrupt included
                        found = []
                        error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                for s in found:
                    specs.setdefault((s.id, source), s)
                    d = s.to_dict()
                    d["takes_context"] = s.takes_context
                    d["module"] = s.module
                    d["sources"] = s.sources
                    out.append(d)
                send({"ev": "loaded", "ep": key, "source": source, "specs": out, "error": error,
                      "output": cap.text})
            send({"ev": "ready"})
        elif op == "evidence":
            _no_memory_limit()
            try:
                evidence = None
                with open(msg["path"], encoding="utf-8") as f:     # written by diag, just now
                    evidence = Evidence.from_dict(json.loads(f.read()), source=msg["path"])
                send({"ev": "ok"})
            except BaseException as e:  # noqa: BLE001
                send({"ev": "error", "why": f"{type(e).__name__}: {e}"})
        elif op == "run":
            spec = specs.get((msg.get("id"), msg.get("source")))
            if spec is None or evidence is None:
                send({"ev": "result", "findings": None, "output": ""})
                continue
            _set_memory_limit()
            with _Capture() as cap:
                try:
                    found = run_one(spec, evidence, timeout=None)
                except BaseException as e:  # noqa: BLE001 - never from run_one, but a plugin may patch it
                    found = _crashed(spec, f"The check raised {type(e).__name__}: {e}")
            rows = []
            for f in found:
                if isinstance(f.severity, Severity) and isinstance(f, Finding):
                    if isinstance(f.evidence, dict) and f.evidence.get("traceback") and \
                            "MemoryError" in f.message:
                        f.evidence.pop("traceback", None)
                    rows.append(f.to_dict())
            send({"ev": "result", "findings": rows, "output": cap.text})
    _atexit._clear()
    os._exit(0)


if __name__ == "__main__":
    worker_main(int(sys.argv[1]), int(sys.argv[2]))
