"""One sampling window over a running job: py-spy on every target (with its DataLoader workers), the
CPU of every process (psutil), and GPU telemetry (diag.gpu) at the same time. The targets are only
read: never paused, never signalled."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from diag.attach import pyspy
from diag.attach.analyse import main_thread, other_threads, parse_speedscope, summarise_main, summarise_worker
from diag.attach.target import Target, describe, ranks_under, require_python, require_training, workers_of
from diag.errors import DiagError, ExitCode

DEFAULT_DURATION_S = 10.0
# 20 samples a second: 200 samples over the default window, a phase share known to about +-3.5
# points, at a cost to the target measured by bench/attach_overhead.py (docs/attach.md)
DEFAULT_RATE_HZ = 20


@dataclass
class ProcessWindow:
    target: Target
    main: dict = field(default_factory=dict)
    workers: list[dict] = field(default_factory=list)
    threads: list[dict] = field(default_factory=list)
    cpu_percent: float | None = None
    alive_after: bool = True


@dataclass
class Window:
    started_at: float
    ended_at: float
    rate: int
    duration_s: float
    processes: list[ProcessWindow]
    gpu: dict[str, Any]
    job_pid: int | None = None
    pyspy_version: str | None = None
    notes: list[str] = field(default_factory=list)
    simulated_gpus: str | None = None
    interrupted: bool = False          # Ctrl-C ended the window early (what was sampled is kept)


class _Cpu:
    """CPU% of a set of processes between two reads (children found at either end)."""

    def __init__(self):
        self.t0 = time.time()
        self.first: dict[int, float] = {}

    @staticmethod
    def _times(pid: int) -> float | None:
        import psutil
        try:
            c = psutil.Process(pid).cpu_times()
            return c.user + c.system
        except psutil.Error:
            return None

    def start(self, pids: list[int]) -> None:
        self.t0 = time.time()
        for p in pids:
            v = self._times(p)
            if v is not None:
                self.first[p] = v

    def percent(self, pid: int, t1: float) -> float | None:
        import psutil
        v = self._times(pid)
        if v is None:
            return None
        v0 = self.first.get(pid)
        t0 = self.t0
        if v0 is None:       # started during the window
            try:
                t0 = max(self.t0, psutil.Process(pid).create_time())
            except psutil.Error:
                return None
            v0 = 0.0
        wall = max(1e-3, t1 - t0)
        return round(100.0 * (v - v0) / wall, 1)


def _check_target(pid: int, require_torch: bool) -> Target:
    t = describe(pid)
    require_python(t)
    if require_torch:
        require_training(t)
    return t


def _version() -> str | None:
    import subprocess
    try:
        out = subprocess.run([pyspy.executable(), "--version"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip().replace("py-spy ", "") or None
    except (OSError, subprocess.TimeoutExpired, DiagError):
        return None


def sample(pid: int | None = None, job: int | None = None, duration: float = DEFAULT_DURATION_S,
           rate: int = DEFAULT_RATE_HZ, simulate_gpus: str | None = None, gpu_interval: float = 1.0,
           require_torch: bool = True, on_progress=None) -> Window:
    """Sample one training process (``pid``) or every rank under a launcher (``job``)."""
    from diag.gpu.sampler import build_run_sampler

    if job is not None:
        launcher = describe(job)
        targets = ranks_under(job)
        if not targets:
            raise DiagError(f"PID {job} has no ranks under it (no Python child process with RANK in its environment); "
                            "give the torchrun/launcher PID, or attach to one process without --job",
                            code=ExitCode.USAGE)
        root = launcher.pid
    else:
        targets = [_check_target(pid, require_torch)]
        root = pid
    # one instant dump each first: permission problems and non-Python targets are told before the window
    for t in targets:
        pyspy.dump(t.pid, owner_uid=t.uid)
    sampler = build_run_sampler(simulate_gpus, gpu_interval)
    sampler.track(root)
    cpu = _Cpu()
    worker_pids = {t.pid: workers_of(t.pid) for t in targets}
    cpu.start([t.pid for t in targets] + [w for ws in worker_pids.values() for w in ws])
    started = time.time()
    sampler.start()
    recs = []
    try:
        for t in targets:
            recs.append((t, pyspy.Recording(t.pid, duration, rate, subprocesses=True, owner_uid=t.uid)))
        if on_progress:
            on_progress(f"sampling {len(targets)} process(es) at {rate} Hz for {duration:g} s")
        docs = []
        for t, r in recs:
            if any(x.interrupted for _, x in recs):
                r.stop()                   # Ctrl-C during an earlier rank's wait: finish this one now
            docs.append((t, r.wait()))
        interrupted = any(r.interrupted for _, r in recs)
    finally:
        for _, r in recs:
            r.kill()
        ended = time.time()
        sampler.stop()
    procs = []
    for t, doc in docs:
        by_pid = parse_speedscope(doc)
        threads = by_pid.get(t.pid, [])
        main = main_thread(threads, t.pid)
        pw = ProcessWindow(target=t)
        pw.main = summarise_main(main, rate) if main else {"samples": 0, "phases": {}, "hot_lines": [],
                                                           "sync_lines": [], "stuck": None, "cycles": 0}
        pw.threads = other_threads(threads, main)
        kids = set(worker_pids.get(t.pid, [])) | set(workers_of(t.pid)) | (set(by_pid) - {t.pid})
        for w in sorted(kids):
            d = summarise_worker(by_pid.get(w, []), w)
            d["cpu_percent"] = cpu.percent(w, ended)
            pw.workers.append(d)
        pw.cpu_percent = cpu.percent(t.pid, ended)
        try:
            import psutil
            pw.alive_after = psutil.pid_exists(t.pid) and psutil.Process(t.pid).status() != psutil.STATUS_ZOMBIE
        except Exception:
            pw.alive_after = False
        procs.append(pw)
    w = Window(started_at=started, ended_at=ended, rate=rate, duration_s=round(ended - started, 3),
               processes=procs, gpu=sampler.to_evidence(), job_pid=job, pyspy_version=_version(),
               interrupted=interrupted)
    prov = sampler.provider
    if getattr(prov, "simulated", False):
        w.simulated_gpus = prov.scenario
    return w
