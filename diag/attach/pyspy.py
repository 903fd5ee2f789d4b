"""py-spy, driven through its machine formats only.

* ``py-spy dump --pid PID --json``: the stacks of every thread now (one JSON list of threads).
* ``py-spy record --pid PID --format speedscope --nonblocking --idle [--subprocesses]``: a window of
  samples; the speedscope file keeps each thread's samples in the order they were taken (``samples``
  are lists of indices into ``shared.frames``, outermost first, with one ``weights`` entry each), which
  is what hang and step-cycle detection need (``--format raw`` only keeps counts).

``--nonblocking`` means py-spy reads the target's memory without stopping it (the target is never
paused or signalled; a sample may occasionally be torn, which py-spy reports as an error and skips).
``--idle`` keeps threads that wait (on a lock, a queue, a socket): a stuck job is all idle.

The executable is found next to diag's interpreter (the ``py-spy`` wheel installs it there), then on
PATH; ``DIAG_PYSPY`` names another one (tests use a scripted stand-in to produce the errors a
machine without ptrace rights gives). Every failure becomes a :class:`~diag.errors.DiagError` with
one sentence saying what to run or grant.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from diag.errors import DiagError, ExitCode

ENV_PYSPY = "DIAG_PYSPY"
PTRACE_SCOPE_FILE = "/proc/sys/kernel/yama/ptrace_scope"
CAP_SYS_PTRACE = 19


def executable() -> str:
    """Path of the py-spy executable (DiagError with the install command when there is none)."""
    env = os.environ.get(ENV_PYSPY)
    if env:
        if not (os.path.isfile(env) and os.access(env, os.X_OK)):
            raise DiagError(f"{ENV_PYSPY}={env!r} is not an executable file")
        return env
    cand = Path(sys.executable).parent / "py-spy"
    if cand.is_file() and os.access(cand, os.X_OK):
        return str(cand)
    found = shutil.which("py-spy")
    if found:
        return found
    raise DiagError("diag attach needs py-spy, which is not installed",
                    hint="pip install 'diag[attach]' (or: pip install py-spy)", code=ExitCode.USAGE)


# ---- permissions ------------------------------------------------------------------------------------

def ptrace_scope(path: str | None = None) -> int | None:
    """kernel.yama.ptrace_scope (None when Yama is not enabled)."""
    try:
        return int(Path(path or PTRACE_SCOPE_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def has_cap_sys_ptrace(status_path: str = "/proc/self/status") -> bool | None:
    """Whether this process holds CAP_SYS_PTRACE in its effective set (None: unknown)."""
    try:
        for line in Path(status_path).read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    except (OSError, ValueError, IndexError):
        return None
    return None


def permission_error(pid: int, owner_uid: int | None = None, scope: int | None = None,
                     cap: bool | None = None) -> DiagError:
    """The one sentence for 'not allowed to read this process', naming what to run or grant."""
    euid = os.geteuid()
    if owner_uid is not None and owner_uid != euid and euid != 0:
        try:
            import pwd
            who = pwd.getpwuid(owner_uid).pw_name
        except (KeyError, ImportError):
            who = f"uid {owner_uid}"
        return DiagError(f"PID {pid} belongs to user {who}, and reading another user's process needs root: "
                         f"run 'sudo -E diag attach {pid}' (or run diag as {who})", code=ExitCode.USAGE)
    if scope is not None and scope >= 3:
        return DiagError(f"ptrace is disabled on this machine (kernel.yama.ptrace_scope=3), so no process can "
                         f"read PID {pid}; this setting can only be lowered by rebooting with another value",
                         code=ExitCode.USAGE)
    if scope is not None and scope >= 1 and not cap:
        return DiagError(f"ptrace is restricted to parent processes (kernel.yama.ptrace_scope={scope}): run "
                         f"'sudo -E diag attach {pid}', or allow it with 'sudo sysctl kernel.yama.ptrace_scope=0'",
                         code=ExitCode.USAGE)
    if cap is False:
        return DiagError(f"this container has no CAP_SYS_PTRACE, which reading PID {pid} needs: start it with "
                         "'--cap-add SYS_PTRACE' (docker/podman) or add SYS_PTRACE to the pod's "
                         "securityContext.capabilities.add (Kubernetes)", code=ExitCode.USAGE)
    return DiagError(f"not allowed to read the memory of PID {pid} (ptrace denied): run "
                     f"'sudo -E diag attach {pid}', or grant CAP_SYS_PTRACE to diag's container",
                     code=ExitCode.USAGE)


def _explain(stderr: str, pid: int, owner_uid: int | None) -> DiagError:
    text = stderr.lower()
    if "permission denied" in text or "operation not permitted" in text or "eperm" in text:
        return permission_error(pid, owner_uid, ptrace_scope(), has_cap_sys_ptrace())
    if "failed to find python version" in text or "failed to find python interpreter" in text \
            or "doesn't look like a python" in text or "failed to find a python" in text:
        return DiagError(f"PID {pid} is not a Python process (py-spy finds no Python interpreter in it)",
                         code=ExitCode.USAGE)
    if "no such process" in text or "check that the process is running" in text \
            or "no such file or directory" in text:
        return DiagError(f"PID {pid} does not exist (it may have ended)", code=ExitCode.USAGE)
    first = next((ln.strip() for ln in stderr.splitlines()
                  if ln.strip() and not ln.startswith(" ") and "backtrace" not in ln.lower()), "no message")
    return DiagError(f"py-spy could not read PID {pid}: {first[:300]}", code=ExitCode.USAGE)


# ---- running ------------------------------------------------------------------------------------------

def torn_read(stderr: str) -> bool:
    """A ``--nonblocking`` read that caught the target mid-change (a code object freed or moved while
    py-spy copied it: "Failed to copy PyCodeObject ... Bad address"). About one dump in twenty of a
    busy training process fails this way; the next read usually succeeds."""
    text = stderr.lower()
    return ("failed to get stack trace" in text or "failed to copy" in text or "bad address" in text
            or "os error 14" in text)


DUMP_TRIES = 6


def dump(pid: int, owner_uid: int | None = None, timeout: float = 30.0, tries: int = DUMP_TRIES) -> list[dict]:
    """``py-spy dump --json``: a list of threads, each with ``frames`` (innermost first). A torn
    read (see :func:`torn_read`) is retried up to ``tries`` times before it is an error."""
    exe = executable()
    for attempt in range(max(1, tries)):
        try:
            proc = subprocess.run([exe, "dump", "--pid", str(pid), "--json", "--nonblocking"],
                                  capture_output=True, text=True, timeout=timeout, start_new_session=True,
                                  preexec_fn=_dies_with_diag())
        except subprocess.TimeoutExpired:
            raise DiagError(f"py-spy did not answer within {timeout:.0f} s for PID {pid}") from None
        except OSError as e:
            raise DiagError(f"cannot run py-spy ({exe}): {e.strerror}") from None
        if proc.returncode == 0 or not torn_read(proc.stderr or "") or attempt == tries - 1:
            break
        time.sleep(0.05 * (attempt + 1))
    if proc.returncode != 0:
        raise _explain(proc.stderr or proc.stdout, pid, owner_uid)
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise DiagError(f"py-spy's dump of PID {pid} is not JSON (py-spy too old? diag needs 0.3.10 or newer)") \
            from None
    if not isinstance(data, list):
        raise DiagError(f"py-spy's dump of PID {pid} has an unexpected shape")
    return data


def _dies_with_diag():
    """A ``preexec_fn``: py-spy gets PR_SET_PDEATHSIG=SIGKILL, so it ends when diag dies, however
    (``kill -9`` and ``timeout`` included); SIGTERM and SIGHUP to diag stop it as Ctrl-C does."""
    from diag import supervise

    return supervise.child_preexec(os.getpid())


TMP_PREFIX = "diag-attach-"


def sweep_stale(tmp: str | None = None) -> None:
    """Remove the folders of earlier attaches whose diag died before it could (``kill -9``): their
    names carry diag's pid."""
    tmp = tmp or tempfile.gettempdir()
    try:
        names = os.listdir(tmp)
    except OSError:
        return
    for name in names:
        if not name.startswith(TMP_PREFIX):
            continue
        parts = name[len(TMP_PREFIX):].split("-", 1)
        if not parts[0].isdigit() or int(parts[0]) == os.getpid():
            continue
        path = os.path.join(tmp, name)
        try:
            if os.stat(path).st_uid != os.geteuid():
                continue
            os.kill(int(parts[0]), 0)
            continue                     # its diag is alive
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


class Recording:
    """``py-spy record`` running in the background for a window; :meth:`wait` returns the speedscope
    document. py-spy runs in its own session and is always ended (SIGINT makes it write what it has,
    then SIGKILL after a grace period), and it dies with diag (PR_SET_PDEATHSIG)."""

    def __init__(self, pid: int, duration: float, rate: int, subprocesses: bool = True,
                 owner_uid: int | None = None):
        self.pid, self.duration, self.rate, self.owner_uid = pid, duration, rate, owner_uid
        sweep_stale()
        self._dir = tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-")
        self.output = os.path.join(self._dir, "profile.speedscope.json")
        cmd = [executable(), "record", "--pid", str(pid), "--format", "speedscope", "--output", self.output,
               "--rate", str(rate), "--duration", str(max(1, int(round(duration)))), "--nonblocking", "--idle",
               "--full-filenames"]
        if subprocesses:
            cmd.append("--subprocesses")
        self.command = cmd
        self.interrupted = False
        self._err = open(os.path.join(self._dir, "stderr.txt"), "w+")
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._err, stderr=self._err,
                                         start_new_session=True, preexec_fn=_dies_with_diag())
        except OSError as e:
            self._err.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise DiagError(f"cannot run py-spy ({cmd[0]}): {e.strerror}") from None

    def stop(self) -> None:
        """Ask py-spy to finish early (it writes the samples taken so far)."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
            self.proc.wait()
        try:
            self._err.close()
        except Exception:
            pass
        shutil.rmtree(self._dir, ignore_errors=True)

    def wait(self) -> dict:
        """The speedscope document. On Ctrl-C, py-spy is asked to finish and what it sampled so far
        is returned (``interrupted`` is then True); with nothing sampled yet, KeyboardInterrupt."""
        try:
            self.proc.wait(timeout=self.duration + 60)
        except subprocess.TimeoutExpired:
            self.stop()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        except KeyboardInterrupt:  # Ctrl-C: py-spy (its own session) writes what it has, then ends
            self.interrupted = True
            self.stop()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        except BaseException:
            self.kill()
            raise
        self._err.seek(0)
        err = self._err.read()
        self._err.close()
        try:
            text = Path(self.output).read_text(encoding="utf-8") if os.path.exists(self.output) else ""
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
        if not text.strip():
            if self.interrupted:
                raise KeyboardInterrupt
            raise _explain(err or "no output", self.pid, self.owner_uid)
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            raise DiagError("py-spy's speedscope output is not JSON") from None
        doc["_stderr"] = err[-2000:]
        return doc
