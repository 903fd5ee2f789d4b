"""What a PID is: does it exist, is it Python, is it visibly a training job, which of its children are
DataLoader workers, which processes under a launcher are the ranks. psutil and /proc only."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from diag.errors import DiagError, ExitCode


@dataclass
class Target:
    pid: int
    cmdline: list[str] = field(default_factory=list)
    exe: str = ""
    cwd: str = ""
    uid: int | None = None
    username: str = ""
    create_time: float | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    torch_loaded: bool | None = None

    @property
    def script(self) -> str | None:
        """The script the interpreter runs (first ``*.py`` argument), as an absolute path."""
        for a in self.cmdline[1:]:
            if a.endswith(".py"):
                return a if os.path.isabs(a) or not self.cwd else os.path.normpath(os.path.join(self.cwd, a))
        if "-m" in self.cmdline:
            i = self.cmdline.index("-m")
            if i + 1 < len(self.cmdline):
                return "-m " + self.cmdline[i + 1]
        return None

    @property
    def label(self) -> str:
        return f"rank {self.rank}" if self.rank is not None else f"PID {self.pid}"


def _proc(pid: int):
    import psutil

    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        raise DiagError(f"PID {pid} does not exist (no such process on this machine; in a container, use the "
                        "PID as the container sees it)", code=ExitCode.USAGE) from None


def _looks_python(exe: str, cmdline: list[str]) -> bool:
    names = [os.path.basename(exe or "")] + [os.path.basename(cmdline[0]) if cmdline else ""]
    return any(n.startswith(("python", "pypy")) or n in ("torchrun", "accelerate", "deepspeed") for n in names)


def torch_loaded(pid: int) -> bool | None:
    """Whether libtorch is mapped into the process (None when /proc/PID/maps cannot be read)."""
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
            for line in f:
                if "libtorch" in line or "/torch/_C" in line:
                    return True
        return False
    except OSError:
        return None


def _env_int(env: dict, key: str) -> int | None:
    try:
        return int(env[key])
    except (KeyError, ValueError, TypeError):
        return None


def describe(pid: int) -> Target:
    """The target's facts (DiagError when it does not exist)."""
    import psutil

    p = _proc(pid)
    t = Target(pid=pid)
    try:
        with p.oneshot():
            t.cmdline = p.cmdline()
            t.uid = p.uids().real
            t.username = p.username()
            t.create_time = p.create_time()
            try:
                t.exe = p.exe()
            except (psutil.AccessDenied, OSError):
                t.exe = ""
            try:
                t.cwd = p.cwd()
            except (psutil.AccessDenied, OSError):
                t.cwd = ""
            try:
                env = p.environ()
            except (psutil.AccessDenied, OSError):
                env = {}
    except psutil.NoSuchProcess:
        raise DiagError(f"PID {pid} does not exist (it ended)", code=ExitCode.USAGE) from None
    except psutil.ZombieProcess:
        raise DiagError(f"PID {pid} has ended (it is a zombie waiting for its parent)", code=ExitCode.USAGE) \
            from None
    except psutil.AccessDenied:
        from diag.attach.pyspy import has_cap_sys_ptrace, permission_error, ptrace_scope
        raise permission_error(pid, t.uid, ptrace_scope(), has_cap_sys_ptrace()) from None
    t.rank = _env_int(env, "RANK")
    t.local_rank = _env_int(env, "LOCAL_RANK")
    t.world_size = _env_int(env, "WORLD_SIZE")
    t.torch_loaded = torch_loaded(pid)
    return t


def require_python(t: Target) -> None:
    """PID that is plainly not a Python interpreter: one sentence (py-spy would say the same, later)."""
    # an interpreter under another name (embedded, renamed) with PyTorch loaded: py-spy's dump decides
    if t.exe and not _looks_python(t.exe, t.cmdline) and t.torch_loaded is not True:
        name = os.path.basename(t.exe)
        raise DiagError(f"PID {t.pid} is not a Python process (it runs {name}); give the PID of the training "
                        "script's interpreter (ps -ef | grep python)", code=ExitCode.USAGE)


def require_training(t: Target) -> None:
    if t.torch_loaded is False:
        what = " ".join(t.cmdline)[:120] or str(t.pid)
        raise DiagError(f"PID {t.pid} is not visibly a training job: PyTorch is not loaded in it ({what})",
                        code=ExitCode.USAGE)


def children(pid: int) -> list[int]:
    import psutil

    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


def workers_of(pid: int) -> list[int]:
    """Child processes of a training process that are Python (DataLoader workers, spawned helpers).
    Under fork they carry the parent's command line; under spawn, multiprocessing's."""
    import psutil

    out = []
    try:
        kids = psutil.Process(pid).children(recursive=False)
    except psutil.Error:
        return []
    for c in kids:
        try:
            exe = c.exe()
            cmd = c.cmdline()
        except psutil.Error:
            continue
        if _looks_python(exe, cmd) and "torch.distributed.run" not in " ".join(cmd):
            out.append(c.pid)
    return out


def ranks_under(launcher_pid: int) -> list[Target]:
    """The ranks under a torchrun (or any launcher) PID: descendants with RANK in their environment
    and PyTorch loaded, in rank order; the launcher's own helpers and DataLoader workers (children of
    a rank) are left out."""
    import psutil

    try:
        root = psutil.Process(launcher_pid)
        desc = root.children(recursive=True)
    except psutil.NoSuchProcess:
        raise DiagError(f"PID {launcher_pid} does not exist", code=ExitCode.USAGE) from None
    except psutil.AccessDenied:
        from diag.attach.pyspy import has_cap_sys_ptrace, permission_error, ptrace_scope
        raise permission_error(launcher_pid, None, ptrace_scope(), has_cap_sys_ptrace()) from None
    ranks: list[Target] = []
    rank_pids: set[int] = set()
    for c in sorted(desc, key=lambda p: p.pid):
        try:
            if c.ppid() in rank_pids:        # a rank's own child (DataLoader worker)
                rank_pids.add(c.pid)
                continue
            t = describe(c.pid)
        except DiagError:
            continue
        if t.rank is None or not _looks_python(t.exe, t.cmdline):
            continue
        ranks.append(t)
        rank_pids.add(c.pid)
    ranks.sort(key=lambda t: (t.rank if t.rank is not None else 1 << 30, t.pid))
    return ranks
