"""The runner: starts the user's script under the probe in a child process, follows its events,
folds them into Evidence, enforces limits, and leaves no process behind.

Used by ``diag check`` (blocking, :meth:`Run.wait`) and by the TUI (``start`` then listeners).
This module must not import torch or textual.
"""
from __future__ import annotations

import atexit
import codecs
import collections
import errno
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from diag import __version__, supervise
from diag.errors import DiagError, ExitCode, Terminated, on_stop_signals
from diag.evidence import Evidence
from diag.fold import fold
from diag.logtext import shown_line
from diag.redact import redact_args

GRACE_S = 5.0          # between SIGTERM and SIGKILL
SAVE_EVERY_S = 1.0     # evidence.json is rewritten at most this often while the run goes on,
SAVE_SHARE = 0.01      # and less often as it grows: rewriting it takes at most this share of one core
SAVE_MAX_S = 30.0      # (one rewrite of a 2,000-step evidence is ~0.1 s of CPU: every 10 s) but never
                       # less often than this; the raw events file holds everything in between
POLL_S = 0.05
EVENT_FILES_EVERY_S = 1.0   # the run directory is listed again for new ranks' event files
_cpu = time.thread_time  # the CPU one rewrite of evidence.json takes (save)


CHUNK = 65536
OUTPUT_LINE_WAIT_S = 0.05   # how long one stream's text waits for the other's unfinished line
MAX_PARTIAL_LINE = 65536      # a longer unfinished line is handed to the listeners as it is


def _last_redraw(partial: str) -> str:
    """An unfinished line keeps only its last redraw (a bar updated for an hour stays small); a
    trailing \\r is kept, a \\n may follow it."""
    i = partial.rfind("\r", 0, len(partial) - 1)
    return partial[i + 1:] if i >= 0 else partial


@dataclass
class RunConfig:
    script: str
    args: list[str] = field(default_factory=list)
    steps: int | None = None
    max_time: float | None = None
    run_dir: str | None = None
    runs_root: str = ".diag/runs"
    echo: str | None = "stdout"        # where the script's output is echoed: stdout | stderr | None
    env: dict[str, str] = field(default_factory=dict)
    # torchrun (multi-process): processes per node (a positive int, or "cpu"/"gpu"/"auto"/"xpu" as
    # torchrun accepts) and pass-through launcher options (["--nnodes=2", "--node-rank=1", ...])
    nproc_per_node: int | str | None = None
    torchrun_args: list[str] = field(default_factory=list)
    python: str = sys.executable
    # GPU telemetry sampled in diag's own process while the script runs (diag/gpu, docs/gpus.md)
    gpu: bool = True
    simulate_gpus: str | None = None    # scenario name (None: DIAG_SIMULATE_GPUS when set, else NVML)
    gpu_interval: float = 1.0
    cwd: str | None = None              # the script's working directory (None: diag's own)


def validate_script(path: str) -> str:
    """One clear sentence (DiagError) for each way a script path can be wrong."""
    p = Path(path)
    if not p.exists():
        raise DiagError(f"script {path!r} does not exist")
    if p.is_dir():
        raise DiagError(f"script {path!r} is a directory; give the path of a Python file")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise DiagError(f"cannot read script {path!r}: {e.strerror}") from None
    if b"\0" in raw[:4096]:
        raise DiagError(f"script {path!r} is not a Python source file (it looks binary)")
    try:
        source = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise DiagError(f"script {path!r} is not a Python source file (not UTF-8 text)") from None
    if p.suffix not in (".py", ".pyw", "") and not source.startswith("#!"):
        raise DiagError(f"script {path!r} is not a Python file (expected a .py file)")
    try:
        compile(source, str(p), "exec")
    except SyntaxError as e:
        raise DiagError(f"script {path!r} has a syntax error at line {e.lineno}: {e.msg}") from None
    except ValueError as e:
        raise DiagError(f"script {path!r} cannot be compiled: {e}") from None
    # absolute, but not resolved: a symlinked script runs as `python link.py` runs it (its __file__
    # and argv[0] name the link, so the files beside the link are found)
    return os.path.abspath(path)


def new_run_dir(root: str) -> Path:
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)
    d = Path(root) / run_id
    d.mkdir(parents=True, exist_ok=False, mode=0o700)
    return d


def disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def disk_full_message(where) -> str:
    return (f"the disk is full: diag cannot write to {where}; the script was stopped and what was "
            "observed so far is kept")


class DiskFull(DiagError):
    """A full disk found before the script starts: nothing runs."""

    def __init__(self, where):
        super().__init__(f"the disk is full: diag cannot write to {where}; nothing was started",
                         code=ExitCode.USAGE)


_LIVE_RUNS: "set[Run]" = set()


@atexit.register
def _kill_live_runs() -> None:
    """diag is exiting (an exception, sys.exit, a second Ctrl-C): nothing it started may outlive it."""
    for run in list(_LIVE_RUNS):
        try:
            run.kill_all()
        except BaseException:
            pass


class Run:
    """One execution of a script under the probe."""

    def __init__(self, config: RunConfig):
        self.config = config
        self.script = validate_script(config.script)
        if config.steps is not None and config.steps <= 0:
            raise DiagError(f"--steps must be a positive number of steps, not {config.steps}")
        if config.max_time is not None and not (config.max_time > 0):
            raise DiagError(f"--max-time must be a positive number of seconds, not {config.max_time}")
        from diag.torchrun import validate_torchrun, with_local_rendezvous

        config.nproc_per_node = validate_torchrun(config.nproc_per_node, config.torchrun_args, config.python)
        if config.nproc_per_node:
            config.torchrun_args = with_local_rendezvous(config.torchrun_args)
        if config.run_dir:
            self.run_dir = Path(config.run_dir)
            if self.run_dir.exists() and not self.run_dir.is_dir():
                raise DiagError(f"--run-dir {config.run_dir!r} exists and is not a directory")
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as e:
                if disk_full(e):
                    raise DiskFull(config.run_dir) from None
                raise DiagError(f"cannot create the run directory {config.run_dir!r}: {e.strerror}") from None
            self._lock_fd = _lock_run_dir(self.run_dir, config.run_dir)
            _clear_previous_run(self.run_dir)
        else:
            try:
                self.run_dir = new_run_dir(config.runs_root)
            except OSError as e:
                if disk_full(e):
                    raise DiskFull(config.runs_root) from None
                raise DiagError(f"cannot create the run directory under {config.runs_root!r}: {e.strerror}") from None
            self._lock_fd = _lock_run_dir(self.run_dir, str(self.run_dir))
        try:
            os.chmod(self.run_dir, 0o700)
        except OSError:
            pass
        self.run_dir = self.run_dir.resolve()
        # the run marker: inherited by everything the script starts, carried by every event
        self.run_id = supervise.new_run_id(self.run_dir.name)
        self.guard: supervise.Guard | None = None
        self.disk_error: str | None = None
        self._killed_all = False
        self.log_path = self.run_dir / "log.txt"
        self.evidence_path = self.run_dir / "evidence.json"
        self.lock = threading.RLock()
        # the script's two streams come through two pipes: a line one stream has begun is finished before
        # the other stream's text goes in (print() writes its text and its newline apart; a stderr line
        # read in between landed mid-line in log.txt and on the terminal, where the script alone never
        # shows it so). A stream waits at most OUTPUT_LINE_WAIT_S for the other's line.
        self._out_cond = threading.Condition()   # its own lock: the events thread never waits on output
        self._partial: str | None = None      # the stream whose last write did not end its line
        self.evidence = Evidence(diag_version=__version__)
        run = self.evidence.run
        run.id = self.run_dir.name
        run.script = self.script
        try:   # the script's own flags and DataLoader(...) calls: where a fix is made (diag/scriptfacts.py)
            from diag.scriptfacts import read as _read_facts

            run.script_facts = _read_facts(self.script) if self.script else None
        except Exception:
            run.script_facts = None
        run.args = redact_args(list(config.args))
        run.cwd = config.cwd or os.getcwd()
        run.run_dir = str(self.run_dir)
        run.log_path = str(self.log_path)
        run.limits = {"steps": config.steps, "max_time": config.max_time}
        run.launcher = "torchrun" if config.nproc_per_node else "python"
        self.listeners: list[Callable[[dict], None]] = []
        self.log_listeners: list[Callable[[str, str], None]] = []
        self.log_tail: collections.deque[tuple[str, str]] = collections.deque(maxlen=5000)
        self.proc: subprocess.Popen | None = None
        self._threads: list[threading.Thread] = []
        self._done = threading.Event()
        self._stop_reason: tuple[str, str] | None = None   # (status, reason) when diag ended the run
        self._signal: str | None = None   # the signal that interrupted wait(), other than SIGINT
        self._dirty = False
        self._last_save = 0.0
        self._save_every = SAVE_EVERY_S     # grows with what one rewrite costs (save)
        self._event_offsets: dict[str, int] = {}
        self._event_files_at = 0.0                    # when the run directory was last listed
        self._event_paths: list[Path] = []
        self._descendants: dict[int, tuple[float, bool]] = {}  # pid -> (create_time, group leader)
        self._last_scan = 0.0
        self._steps_reached_at: float | None = None
        self._last_df = 0.0
        self._internal_error: str | None = None
        self._foreign_events = 0
        self._log_file = None
        self.run_deleted = False
        self.returncode: int | None = None
        # the GPU sampler (diag/gpu): started with the script, recorded into evidence.gpu
        self.sampler = None
        if config.gpu:
            from diag.gpu.sampler import attach_to_run

            self.sampler = attach_to_run(self)

    # ---- command ------------------------------------------------------------------------------------
    def events_pattern(self) -> str:
        return str(self.run_dir / "events.rank{rank}.jsonl")

    def command(self) -> list[str]:
        c = self.config
        if c.nproc_per_node:
            # torch.distributed.run itself, with its own log lines sent to launcher.log
            return [c.python, "-m", "diag.probe.launch", f"--nproc-per-node={c.nproc_per_node}",
                    *c.torchrun_args, "-m", "diag.probe", self.script, *c.args]
        return [c.python, "-m", "diag.probe", self.script, *c.args]

    # ---- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> "Run":
        cmd = self.command()
        self.evidence.run.command = redact_args(cmd)
        self.evidence.run.started_at = time.time()
        env = dict(os.environ)
        env.update(self.config.env)
        env["DIAG_EVENTS"] = self.events_pattern()
        env["PYTHONUNBUFFERED"] = "1"
        if self.config.steps:
            env["DIAG_MAX_STEPS"] = str(self.config.steps)
        env[supervise.MARKER] = self.run_id
        env["DIAG_ARGV0"] = str(self.config.script)   # sys.argv[0] as the user typed it (python s.py has it so)
        if not env.get("PYTHONSAFEPATH"):
            # `python -m diag.probe` would put the current directory first on sys.path: a json.py or
            # diag.py there would shadow the real module. The probe removes both before the script runs.
            env["PYTHONSAFEPATH"] = "1"
            env["DIAG_SAFEPATH_SET"] = "1"
        if self.config.nproc_per_node:
            env["DIAG_LAUNCHER_LOG"] = str(self.run_dir / "launcher.log")
            _touch_private(self.run_dir / "launcher.log")
            env["DIAG_DEFER_TRACEBACK"] = "1"   # the first failing rank's traceback is shown once, at the end
        # diag itself must be importable by the child even when run from a source tree (an installed
        # diag is found anyway; putting site-packages on PYTHONPATH would put it before the stdlib)
        pkg_root = Path(__file__).resolve().parent.parent
        if pkg_root.name not in ("site-packages", "dist-packages"):
            env["PYTHONPATH"] = str(pkg_root) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        # a full disk is found before anything starts: the first evidence.json and the log are written
        try:
            self._log_file = os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600),
                                       "a", encoding="utf-8", errors="replace")
            self._log_file.write("")
            self._log_file.flush()
            self.save(raise_errors=True)
        except OSError as e:
            self._release_lock()
            if disk_full(e):
                raise DiskFull(self.run_dir) from None
            raise DiagError(f"cannot write to the run directory {str(self.run_dir)!r}: {e.strerror}") from None
        self._t_start = time.monotonic()
        self._t_start_wall = time.time()
        supervise.set_subreaper()
        self.guard = supervise.Guard(self.run_id).start()
        main_thread = threading.current_thread() is threading.main_thread()
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, start_new_session=True, cwd=self.config.cwd or os.getcwd(),
                # PR_SET_PDEATHSIG follows the thread that forked: only from the main thread, which
                # lives as long as diag (the guard and the probe's watchdog cover the rest)
                preexec_fn=supervise.child_preexec(os.getpid()) if main_thread else None,
            )
        except OSError as e:
            self.guard.stop()
            self._release_lock()
            raise DiagError(f"cannot start {cmd[0]!r}: {e.strerror}") from None
        _LIVE_RUNS.add(self)
        if self.sampler is not None:
            self.sampler.track(self.proc.pid).start()
        self.save()
        for name, stream in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            t = threading.Thread(target=self._pump, args=(name, stream), daemon=True, name=f"diag-{name}")
            t.start()
            self._threads.append(t)
        t = threading.Thread(target=self._follow, daemon=True, name="diag-events")
        t.start()
        self._threads.append(t)
        return self

    def wait(self) -> Evidence:
        """Block until the script ends (or a limit ends it). Ctrl-C stops it and re-raises
        KeyboardInterrupt; so do SIGTERM and SIGHUP sent to diag (a CI job cancelled, a terminal
        closed): the script runs in its own session, so without this it would outlive diag."""
        assert self.proc is not None
        restore = _interrupt_on_termination()
        try:
            while not self._done.is_set():
                self._done.wait(0.1)
        except KeyboardInterrupt as e:
            if isinstance(e, Terminated):
                self._signal = e.name
            self.stop("interrupted by Ctrl-C" if self._signal is None else
                      f"interrupted by {self._signal}", "interrupted")
            try:
                self._done.wait(GRACE_S + 5)
            except KeyboardInterrupt:
                # a second Ctrl-C: no more grace, everything dies now
                self.kill_all()
                self._done.wait(5)
            raise
        finally:
            restore()
        return self.evidence

    def kill_all(self) -> None:
        """SIGKILL every process of the run at once: the child, its tree, every process carrying the
        run marker, every descendant seen during the run."""
        p = self.proc
        if p is None:
            return
        self._killed_all = True
        root = p.pid if p.poll() is None else None
        supervise.kill_everything(self.run_id, root, self._known(), exclude=self._own_pids())
        supervise.kill_orphans(self._t_start_wall, exclude=self._own_pids() + (p.pid,))
        if root is not None:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def _known(self) -> dict:
        return {pid: created for pid, (created, _leader) in list(self._descendants.items())}

    def _own_pids(self) -> tuple:
        g = self.guard.proc.pid if self.guard is not None and self.guard.proc is not None else None
        return (os.getpid(),) + ((g,) if g else ())

    @property
    def running(self) -> bool:
        return not self._done.is_set()

    def stop(self, reason: str = "stopped by the user", status: str = "stopped") -> None:
        """Ask the script to stop (SIGTERM to its main process, which unwinds), then kill whatever it
        started that is still alive after the grace period."""
        if self._stop_reason is None:
            self._stop_reason = (status, reason)
        self._terminate()

    def _terminate(self) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        # SIGTERM to the script's main process only: it unwinds (the probe raises DiagStop), and
        # its DataLoader iterators shut their workers down cleanly. Killing the whole group at once
        # would kill the workers first and make torch report them as crashed. torchrun forwards the
        # signal to its ranks. Whatever is still alive after the grace period is killed.
        try:
            os.kill(p.pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass

        def _kill_later():
            deadline = time.monotonic() + GRACE_S
            while time.monotonic() < deadline:
                if p.poll() is not None:
                    return
                time.sleep(0.05)
            self._scan_descendants()
            self.kill_all()

        threading.Thread(target=_kill_later, daemon=True).start()

    # ---- threads ------------------------------------------------------------------------------------
    def _pump(self, name: str, stream) -> None:
        """Copy one of the script's streams as it arrives: to the terminal (echo) and log.txt as
        written, carriage returns included, so a progress bar redrawn with \\r shows live; to the
        listeners (the TUI's Log tab) a line at a time, as a terminal would show it."""
        target = None
        if self.config.echo == "stdout":
            target = sys.stdout if name == "stdout" else sys.stderr
        elif self.config.echo == "stderr":
            target = sys.stderr
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        read = getattr(stream, "read1", stream.read)
        pending = ""
        while True:
            raw = read(CHUNK)
            text = decoder.decode(raw, final=not raw)
            if text:
                with self._out_cond:
                    deadline = time.monotonic() + OUTPUT_LINE_WAIT_S
                    while self._partial not in (None, name) and raw:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._out_cond.wait(left)
                    with self.lock:
                        try:
                            self._log_file.write(text)
                            self._log_file.flush()
                        except Exception as e:
                            if disk_full(e):
                                self._disk_full(self.log_path)
                    if target is not None:
                        try:
                            target.write(text)
                            target.flush()
                        except Exception:
                            pass
                    self._partial = None if text.endswith(("\n", "\r")) else name
                    self._out_cond.notify_all()
                pending += text
                *lines, pending = pending.split("\n")
                pending = _last_redraw(pending)
                if len(pending) > MAX_PARTIAL_LINE:        # a line that never ends: pass it on anyway
                    lines.append(pending)
                    pending = ""
                for line in lines:
                    self._line(name, shown_line(line) + "\n")
            if not raw:
                break
        if pending:
            self._line(name, shown_line(pending))
        stream.close()

    def _line(self, name: str, line: str) -> None:
        with self.lock:
            self.log_tail.append((name, line))
        for cb in list(self.log_listeners):
            try:
                cb(name, line)
            except Exception:
                pass

    def _follow(self) -> None:
        """The events thread. Whatever goes wrong in it (a full disk, a bug), the run still ends: the
        child is stopped, the evidence is finalised in memory and ``_done`` is set: diag never waits
        forever."""
        p = self.proc
        assert p is not None
        try:
            self._follow_loop(p)
        except BaseException as e:     # never die silently: stop the child, finish below
            if disk_full(e):
                self._disk_full(self.run_dir)
            else:
                self._internal_error = f"{type(e).__name__}: {e}"
                self.stop(f"diag's event reader failed ({type(e).__name__}: {e})", "stopped")
                self.kill_all()
        try:
            self._end(p)
        finally:
            self._done.set()
            _LIVE_RUNS.discard(self)
        for cb in list(self.listeners):
            try:
                cb({"kind": "run_end"})
            except Exception:
                pass

    def _follow_loop(self, p) -> None:
        while True:
            exited = p.poll() is not None
            self._read_events(fresh=exited)
            self._check_limits()
            now = time.monotonic()
            if not exited and now - self._last_scan >= 0.5:
                self._scan_descendants()
            if self._dirty and now - self._last_save >= self._save_every:
                self.save()
            if not exited and now - self._last_df >= SAVE_EVERY_S:
                self._last_df = now
                if _no_space_left(self.run_dir):
                    self._disk_full(self.run_dir)
            if exited:
                break
            time.sleep(POLL_S)

    def _end(self, p) -> None:
        # the child is gone: leave nothing behind (DataLoader workers, grandchildren in their own
        # sessions or process groups, torchrun's ranks): its tree, the run marker, all pids seen
        try:
            p.wait(timeout=GRACE_S + 5)
        except subprocess.TimeoutExpired:
            pass
        supervise.kill_everything(self.run_id, p.pid if p.poll() is None else None, self._known(),
                                  exclude=self._own_pids())
        # an orphan of the run re-parented to diag that cleared its environment (a double-forked daemon)
        supervise.kill_orphans(self._t_start_wall, exclude=self._own_pids() + (p.pid,))
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=5)
        if self.guard is not None:
            self.guard.stop()
        try:
            self._read_events(fresh=True)
        except Exception:
            pass
        self.returncode = p.returncode
        try:
            self._finalise(p.returncode)
        except BaseException as e:
            if disk_full(e):
                self._disk_full(self.run_dir)
            else:
                raise
        finally:
            try:
                self._log_file.close()
            except Exception:
                pass
            self._release_lock()

    def _disk_full(self, where) -> None:
        """Record a full disk once, stop the child at once (nothing more can be saved)."""
        if self.disk_error is None:
            self.disk_error = disk_full_message(where)
            if self._stop_reason is None:
                self._stop_reason = ("stopped", "the disk is full")
        if self.proc is not None and self.proc.poll() is None:
            self.kill_all()

    def _release_lock(self) -> None:
        fd = getattr(self, "_lock_fd", None)
        if fd is not None:
            self._lock_fd = None
            try:
                os.close(fd)
            except OSError:
                pass
        for cb in list(self.listeners):
            try:
                cb({"kind": "run_end"})
            except Exception:
                pass

    def _scan_descendants(self) -> None:
        """Remember every process under the child. torchrun starts each rank in a session of its
        own, out of reach of a signal to the child's process group, and its ranks outlive it
        when it is killed: they are found here and killed at the end (:func:`diag.supervise.kill_everything`)."""
        self._last_scan = time.monotonic()
        p = self.proc
        if p is None:
            return
        try:
            import psutil

            # the /proc children lists (microseconds; psutil's tree walk reads every process on
            # the machine), every half second while the job runs; a pid is looked up once
            for pid in supervise.live_tree_pids(p.pid):
                if pid in self._descendants:
                    continue
                try:
                    self._descendants[pid] = (psutil.Process(pid).create_time(), os.getpgid(pid) == pid)
                except (psutil.Error, OSError):
                    pass
        except Exception:
            pass

    def _check_limits(self) -> None:
        mt = self.config.max_time
        now = time.monotonic()
        if mt and self._stop_reason is None and now - self._t_start >= mt:
            self.stop(f"--max-time {mt:g} s reached", "timeout")
        n = self.config.steps
        if n and self._stop_reason is None:
            if self._steps_reached_at is None:
                with self.lock:
                    reached = any(r.step_stats.count >= n for r in self.evidence.ranks)
                if reached:
                    self._steps_reached_at = now
            elif now - self._steps_reached_at >= GRACE_S:
                # the probe asked the script to stop at step N and it went on (a bare `except:`
                # swallowed the stop): SIGTERM now, SIGKILL after the grace period
                self.stop(f"--steps {n} reached; the script caught the stop and went on, so diag ended it",
                          "stopped")

    def _event_files(self, fresh: bool) -> list[Path]:
        """The run's event files (one per rank), listed again every EVENT_FILES_EVERY_S (a rank's file
        appears once; the list is read 20 times a second), on every read until the first appears
        (the first finding waits for it) and when ``fresh`` (the last reads)."""
        now = time.monotonic()
        if fresh or not self._event_paths or now - self._event_files_at >= EVENT_FILES_EVERY_S:
            self._event_files_at = now
            try:
                names = os.listdir(self.run_dir)
            except OSError:
                names = []
            self._event_paths = [self.run_dir / n for n in sorted(names)
                                 if n.startswith("events.rank") and n.endswith(".jsonl")]
        return self._event_paths

    def _read_events(self, fresh: bool = False) -> None:
        for path in self._event_files(fresh):
            key = str(path)
            chunk, self._event_offsets[key] = read_lines_from(path, self._event_offsets.get(key, 0))
            if not chunk:
                continue
            events = _decode_lines(chunk)
            if not events:
                continue
            mine = []
            for e in events:
                if not isinstance(e, dict) or e.pop("run", None) != self.run_id:
                    self._foreign_events += 1     # another run writing into this directory
                    continue
                mine.append(e)
            events = mine
            if not events:
                continue
            with self.lock:
                for e in events:
                    fold(self.evidence, e)
                self._dirty = True
            for cb in list(self.listeners):
                for e in events:
                    try:
                        cb(e)
                    except Exception:
                        pass

    def _finalise(self, returncode: int) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        with self.lock:
            ev = self.evidence
            run = ev.run
            run.ended_at = time.time()
            run.wall_s = round(time.monotonic() - self._t_start, 3)
            statuses = [r.status for r in ev.ranks]
            if self._stop_reason is not None:
                run.status, run.stop_reason = self._stop_reason
                if run.status == "stopped" and any(s in ("failed", "oom") for s in statuses):
                    run.status = next(s for s in statuses if s in ("failed", "oom"))
            elif not ev.ranks or "running" in statuses:
                # the process died without telling the probe (killed, segfault, os._exit)
                sig = -returncode if returncode is not None and returncode < 0 else None
                run.status = "killed" if sig else ("failed" if returncode else "completed")
                if sig:
                    run.stop_reason = f"the script was killed by {signal.Signals(sig).name}" \
                        if sig in signal.Signals._value2member_map_ else f"the script was killed by signal {sig}"
                    if sig == signal.SIGSEGV:
                        run.stop_reason += " (a segmentation fault: a crash in native code)"
                    if sig == signal.SIGKILL:
                        run.stop_reason += " (out of host memory? the kernel's OOM killer sends SIGKILL)"
                for r in ev.ranks:
                    if r.status == "running":
                        r.status = run.status
            else:
                order = ["oom", "failed", "interrupted", "timeout", "stopped", "completed"]
                run.status = min(statuses, key=lambda s: order.index(s) if s in order else len(order))
                for r in ev.ranks:
                    if r.extras.get("end_reason") and r.status in ("stopped", "failed"):
                        run.stop_reason = r.extras["end_reason"]
                        break
            run.exit_code = returncode if returncode is None or returncode >= 0 else None
            run.kind = ev.run_kind()
            notice = self._finalise_ranks() if self.config.nproc_per_node else None
            if not self.run_dir.is_dir():
                # the script removed its own run directory: say so instead of "completed · 0 steps"
                self.run_deleted = True
                run.stop_reason = ((run.stop_reason + "; ") if run.stop_reason else "") + \
                    "the script deleted its run directory, so events written after that and log.txt are lost"
                if run.status == "completed":
                    run.status = "failed" if returncode else "stopped"
            if self.disk_error:
                run.stop_reason = ((run.stop_reason + "; ") if run.stop_reason and
                                   "disk is full" not in run.stop_reason else "") + "the disk is full"
            self._dirty = True
        if not self.run_deleted:
            self.save(final=True)
        if notice:
            self._notice(notice)

    def _finalise_ranks(self) -> str | None:
        """torchrun: the rank that failed first names the failure; returns the text that shows its
        traceback once (the other ranks' errors are its consequences, one line each)."""
        from diag.torchrun import format_root_cause, root_cause, root_cause_summary

        ev = self.evidence
        for r in ev.ranks:
            le = r.distributed.get("launcher_exit") or {}
            if le.get("signal") and r.status in ("running", "failed") and not r.exceptions:
                r.status = "killed"
        if ev.run.status not in ("failed", "oom", "killed"):
            return None
        rc = root_cause(ev)
        if rc is None:
            return None
        ev.run.stop_reason = root_cause_summary(rc)
        return format_root_cause(ev)

    def _notice(self, text: str) -> None:
        """A message from diag about the run: into log.txt, the echo stream and the log listeners."""
        with self.lock:
            try:
                self._log_file.write(text)
                self._log_file.flush()
            except Exception:
                pass
        if self.config.echo is not None:
            try:
                sys.stderr.write(text)
                sys.stderr.flush()
            except Exception:
                pass
        for line in text.splitlines(keepends=True):
            for cb in list(self.log_listeners):
                try:
                    cb("stderr", line)
                except Exception:
                    pass

    def save(self, raise_errors: bool = False, final: bool = False) -> None:
        """Write evidence.json (0600). A full disk stops the run (the evidence stays in memory); a
        vanished run directory is not recreated. While the run goes on the file is written compact
        (the C JSON encoder: a quarter of the CPU); the ``final`` one is indented for people."""
        with self.lock:
            if self.sampler is not None:
                self.evidence.gpu = self.sampler.to_evidence()
            self._dirty = False
            self._last_save = time.monotonic()
            if self.disk_error or self.run_deleted:
                return
            if not raise_errors and not self.run_dir.is_dir():
                return
            cpu = _cpu()
            try:
                self.evidence.save(self.evidence_path, compact=not final)
            except OSError as e:
                if raise_errors:
                    raise
                if disk_full(e):
                    self._disk_full(self.run_dir)
                return
            # the next rewrite waits until this one's CPU is SAVE_SHARE of the time between them: on a
            # machine whose cores the training uses, diag's bookkeeping must not become the slowdown
            self._save_every = min(SAVE_MAX_S, max(SAVE_EVERY_S, (_cpu() - cpu) / SAVE_SHARE))
            try:
                os.chmod(self.evidence_path, 0o600)
            except OSError:
                pass

    def snapshot(self) -> Evidence:
        """A consistent copy of the evidence so far (for live re-evaluation)."""
        with self.lock:
            return Evidence.from_dict(self.evidence.to_dict())


def read_lines_from(path, offset: int) -> tuple[bytes, int]:
    """The whole lines appended to ``path`` since ``offset`` (a line still being written waits for the
    next read), and the offset to read on from; nothing where the file cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except OSError:
        return b"", offset
    end = chunk.rfind(b"\n") + 1
    return chunk[:end], offset + end


def _decode_lines(chunk: bytes) -> list:
    """The JSON values of an events chunk's lines, decoded in one call (a line that does not parse,
    half-written or foreign, sends the chunk through a line at a time, skipping that line)."""
    import json

    text = chunk.decode("utf-8", errors="replace")
    lines = [ln for ln in text.split("\n") if ln.strip()]
    if not lines:
        return []
    try:
        values = json.loads("[" + ",".join(lines) + "]")
        if len(values) == len(lines):        # (a line "1, 2" parses here but not alone)
            return values
    except (ValueError, RecursionError):
        pass
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except (ValueError, RecursionError):
            continue
    return out


def _no_space_left(path: Path) -> bool:
    """The file system under the run directory has no room left for another event line."""
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    free = st.f_bfree if hasattr(os, "geteuid") and os.geteuid() == 0 else st.f_bavail
    return free * st.f_frsize < 4096 and st.f_blocks > 0


def _touch_private(path: Path) -> None:
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        os.chmod(path, 0o600)
    except OSError:
        pass


def _lock_run_dir(run_dir: Path, shown: str):
    """Hold an exclusive lock on the run directory for the whole run: a second diag given the same
    --run-dir is refused (it would otherwise read this run's events, or this run its)."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fd = os.open(run_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        if disk_full(e):
            raise DiskFull(shown) from None
        raise DiagError(f"cannot use the run directory {shown!r}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise DiagError(f"the run directory {shown!r} is in use by another diag run",
                        hint="give each run its own --run-dir (or none: diag makes a new one)") from None
    return fd


def _interrupt_on_termination():
    """While diag waits for a script: SIGTERM and SIGHUP raise KeyboardInterrupt (:class:`Terminated`)
    in the main thread (the same clean stop as Ctrl-C). Returns a function that restores the previous
    handlers."""
    def handler(signum, frame):
        raise Terminated(signal.Signals(signum).name)

    return on_stop_signals(handler)


RUN_FILES = ("events.rank*.jsonl", "evidence.json", "report.json", "log.txt", "launcher.log")


def _clear_previous_run(run_dir: Path) -> None:
    """A reused --run-dir starts fresh: diag's own files from an earlier run are removed (the
    events would otherwise be appended to and folded twice). Nothing else is touched."""
    removed = []
    for pattern in RUN_FILES:
        for p in run_dir.glob(pattern):
            try:
                p.unlink()
                removed.append(p.name)
            except OSError:
                pass
    if removed:
        sys.stderr.write(f"diag: {run_dir} held an earlier run; its files were replaced\n")
