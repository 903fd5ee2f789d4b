"""Process supervision: nothing diag starts outlives it, however diag ends.

Four mechanisms, each covering what the others cannot:

- **A run marker** (``DIAG_RUN_ID=<id>``) in the child's environment, inherited by everything it
  starts (DataLoader workers, torchrun's ranks, helpers in a new session or process group). At the end
  of a run every process whose ``/proc/<pid>/environ`` carries the marker is killed, together with
  every process found under the child in the process tree.
- **Parent-death signal**: the child is started with ``PR_SET_PDEATHSIG`` = SIGKILL (set between fork
  and exec, then race-checked against diag's pid: if diag died in between, the child exits at once).
- **A guard process**: a tiny Python process in a session of its own that holds the read end of a
  pipe whose write end only diag holds. When diag dies (``kill -9`` included) the pipe reads EOF and
  the guard kills every process carrying the marker, then exits. On a normal end diag closes the pipe
  after its own clean-up and waits for the guard.
- **Child subreaper**: diag marks itself ``PR_SET_CHILD_SUBREAPER``, so a process orphaned under the
  child (its parent died first) is re-parented to diag instead of init and stays in diag's tree.

The probe adds a watchdog thread on its side (:mod:`diag.probe.watchdog`).

What no mechanism here can do: stop a process that something outside diag's tree keeps alive and
that cleared its environment (it carries no marker and is not a descendant).

Linux only for prctl and /proc; elsewhere the tree scan (psutil) and process groups remain.
"""
from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
import time

MARKER = "DIAG_RUN_ID"
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def new_run_id(name: str) -> str:
    """The run marker: the run directory's name plus a random part (unique even for a reused dir)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:64]
    return f"{safe}-{secrets.token_hex(4)}"


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        f = libc.prctl
        f.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
        f.restype = ctypes.c_int
        return f
    except Exception:
        return None


def set_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux >= 3.4)."""
    f = _prctl()
    return bool(f) and f(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    f = _prctl()
    return bool(f) and f(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def child_preexec(parent_pid: int):
    """A ``preexec_fn`` for Popen: die with diag. The prctl function is looked up here, in the parent,
    so that the forked child only makes one system call (no imports, no allocation-heavy work)."""
    f = _prctl()

    def preexec():
        if f is not None:
            f(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        # diag may have died between fork and prctl: then no signal will ever come
        if os.getppid() != parent_pid:
            os._exit(137)

    return preexec


# ---- finding what a run started ---------------------------------------------------------------------

def marked_pids(run_id: str, exclude: tuple[int, ...] = ()) -> list[int]:
    """Every process whose environment carries ``DIAG_RUN_ID=run_id`` (reads /proc/<pid>/environ)."""
    needle = f"{MARKER}={run_id}".encode()
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    skip = set(exclude) | {os.getpid()}
    for name in entries:
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in skip:
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        for item in env.split(b"\0"):
            if item == needle:
                out.append(pid)
                break
    return out


def live_tree_pids(root: int) -> list[int]:
    """Every descendant of ``root``, read from ``/proc/<pid>/task/<tid>/children`` (the kernel's list
    of each thread's children): tens of microseconds for a training job's tree, where psutil reads
    the parent of every process on the machine (~1 ms here, more on a busy node). For the scans
    repeated while a run goes on; the kernel documents the lists as possibly missing a child that is
    being re-parented at that moment, so the final sweep (:func:`tree_pids`) keeps psutil. Without
    those files (a kernel built without them) this is :func:`tree_pids`."""
    out: list[int] = []
    todo = [root]
    seen = {root}
    for pid in todo:          # breadth first, as psutil lists them (todo grows as it is walked)
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            if pid == root and not os.path.exists("/proc/self/task"):
                return tree_pids(root)
            continue
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    kids = f.read().split()
            except FileNotFoundError:
                if not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children"):
                    return tree_pids(root)        # no such files on this kernel
                continue                          # the thread ended
            except OSError:
                continue
            for k in kids:
                c = int(k)
                if c not in seen:
                    seen.add(c)
                    out.append(c)
                    todo.append(c)
    return out


def tree_pids(root: int) -> list[int]:
    """Every descendant of ``root`` (new sessions and process groups included: the tree is by parent)."""
    try:
        import psutil

        return [c.pid for c in psutil.Process(root).children(recursive=True)]
    except Exception:
        return []


def _start_time(pid: int):
    """The creation time psutil reports (the same clock as the runner's descendant records)."""
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:
        return None


def kill_pids(pids) -> int:
    """SIGKILL each pid (and, when it leads a process group other than diag's, the group). Returns how
    many were signalled."""
    n = 0
    own_group = os.getpgid(0)
    for pid in set(pids):
        if pid <= 1 or pid == os.getpid():
            continue
        try:
            if os.getpgid(pid) == pid and pid != own_group:
                os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.kill(pid, signal.SIGKILL)
            n += 1
        except OSError:
            pass
    return n


def _reap(pid: int) -> None:
    """Collect a killed process that became diag's own child (an orphan re-parented to diag as
    subreaper); else it stays a zombie until diag exits. Never called for diag's Popen children."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        pass


def kill_everything(run_id: str | None, root: int | None, known=(), exclude: tuple[int, ...] = (),
                    rounds: int = 4) -> None:
    """Kill the child's tree, every marked process and every pid seen earlier (checked against its start
    time, so a reused pid is spared). Repeated a few times: a process may fork while being killed."""
    seen: dict[int, int | None] = {}     # pid -> its parent when first seen
    me = os.getpid()
    try:
        for _ in range(rounds):
            if not _kill_round(run_id, root, known, exclude, seen):
                return
            time.sleep(0.02)
    finally:
        # collect the orphans re-parented to diag; never a process diag started itself (its Popen
        # object collects it, and would otherwise lose the exit status)
        for pid, parent in seen.items():
            if pid != root and parent is not None and parent != me:
                _reap(pid)


def _kill_round(run_id, root, known, exclude, seen) -> bool:
    pids = set()
    if root is not None:
        pids.add(root)
        pids.update(tree_pids(root))
    if run_id:
        pids.update(marked_pids(run_id, exclude=exclude))
    for pid, started in list(dict(known).items()):
        if started is not None and _start_time(pid) == started:
            pids.add(pid)
    pids.difference_update(exclude)
    alive = [p for p in pids if _alive(p)]
    for p in alive:
        if p not in seen:
            seen[p] = _ppid(p)
    if not alive:
        return False
    kill_pids(alive)
    return True


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2:][:1] != b"Z"
    except (OSError, ValueError):
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


# ---- orphans re-parented to diag ---------------------------------------------------------------------

OWN_HELPERS: set[int] = set()   # processes diag started for itself (the guard, the plugin worker)


def orphans(since: float, exclude=()) -> list[int]:
    """diag's children that it did not start: processes of the run orphaned and re-parented to diag
    (the child subreaper), a double-forked daemon that cleared its environment (no marker) and left
    the child's tree included. Only those created after ``since`` (the run's start, wall clock), and
    never ``exclude``, :data:`OWN_HELPERS` or diag's own Popen children passed in ``exclude``."""
    try:
        import psutil

        me = psutil.Process()
        kids = me.children(recursive=False)
    except Exception:
        return []
    skip = set(exclude) | OWN_HELPERS
    out = []
    for c in kids:
        try:
            if c.pid in skip or c.status() == psutil.STATUS_ZOMBIE:
                continue
            if c.create_time() >= since - 1.0:
                out.append(c.pid)
        except Exception:
            continue
    return out


def kill_orphans(since: float, exclude=()) -> None:
    """Kill every orphan of the run (:func:`orphans`) and whatever each started."""
    for pid in orphans(since, exclude):
        kill_everything(None, pid, {}, exclude=tuple(exclude), rounds=2)
        _reap(pid)


# ---- the guard ---------------------------------------------------------------------------------------

_GUARD = r"""
import os, signal, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE):
    try: signal.signal(s, signal.SIG_IGN)
    except Exception: pass
run_id = sys.argv[1]
while True:
    try:
        if not os.read(0, 64): break
    except InterruptedError: continue
    except OSError: break
needle = ("DIAG_RUN_ID=" + run_id).encode()
me = os.getpid()
for _ in range(5):
    found = 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me: continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                if needle not in f.read().split(b"\0"): continue
            os.kill(int(name), signal.SIGKILL); found += 1
        except OSError: pass
    if not found: break
    time.sleep(0.05)
"""


class Guard:
    """The process that reaps a run's processes if diag itself dies (see the module docstring)."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.proc: subprocess.Popen | None = None
        self._w: int | None = None

    def start(self) -> "Guard":
        if not os.path.isdir("/proc"):
            return self
        r, w = os.pipe()
        env = {k: v for k, v in os.environ.items() if k != MARKER}
        try:
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _GUARD, self.run_id], stdin=r, cwd="/",
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                         env=env, start_new_session=True, close_fds=True)
        except OSError:
            os.close(w)
            self.proc = None
        else:
            self._w = w
            OWN_HELPERS.add(self.proc.pid)
        finally:
            os.close(r)
        return self

    def stop(self) -> None:
        """diag's own clean-up is done: let the guard do its last sweep and exit."""
        if self._w is not None:
            try:
                os.close(self._w)
            except OSError:
                pass
            self._w = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            OWN_HELPERS.discard(self.proc.pid)
            self.proc = None
