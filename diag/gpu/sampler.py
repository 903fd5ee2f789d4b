"""The sampler: a background thread that reads a provider every ``interval`` seconds.

It keeps a ring buffer of the last ``history`` samples per device (for live panes) and, for
Evidence, a bounded whole-run series per device that halves its resolution when full (pairs of
points are merged: mean, or max for memory, or OR for throttle reasons), plus exact running
aggregates over every sample. With :meth:`Sampler.track` it also measures the process tree of the
run (CPU, resident memory, GPU memory held by its processes).

Listeners (``add_listener(cb)``) are called with each :class:`Snapshot` from the sampler thread;
a listener that raises is dropped from that call and counted, never fatal.
"""
from __future__ import annotations

import collections
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from diag.errors import DiagError
from diag.gpu.provider import (
    NA, THROTTLE_BITS, DeviceSample, DeviceStatic, GpuProcess, HostMonitor, HostSample, is_na,
    throttle_mask, to_jsonable,
)

MIN_INTERVAL_S = 0.1
DEFAULT_INTERVAL_S = 1.0
# A script run samples the devices faster at first (gpu.low-utilization needs enough samples inside the
# steady steps of a short run: at 1 s a 5-s run gave 3, straddling start-up and shutdown): every
# BURST_INTERVAL_S for the first BURST_S seconds, then the configured interval. The extra samples read
# the devices only (no process tree, no host), go to the Evidence series, not to the live panes.
BURST_INTERVAL_S = 0.1
BURST_S = 60.0
DEFAULT_HISTORY = 300           # live ring buffer per device (5 minutes at 1 s)
EVIDENCE_POINTS = 240           # whole-run series per device in Evidence; halves resolution when full
MAX_PROCESSES_KEPT = 64


def check_interval(interval: float, option: str = "--gpu-interval") -> float:
    """The sampling interval, or one sentence (DiagError) when it is unusable."""
    try:
        v = float(interval)
    except (TypeError, ValueError):
        raise DiagError(f"{option} must be a number of seconds, not {interval!r}") from None
    if not (v >= MIN_INTERVAL_S) or v != v or v == float("inf"):
        raise DiagError(f"{option} must be at least {MIN_INTERVAL_S:g} s (got {interval:g}); NVML refreshes "
                        "most counters only a few times per second")
    return v


@dataclass(frozen=True)
class RunUsage:
    """The run's own process tree at one sample."""
    t: float
    pids: tuple[int, ...] = ()
    nproc: int = 0
    cpu_percent: Any = NA           # summed over the tree (100 = one core)
    rss: Any = NA                   # bytes, summed over the tree
    gpu_memory: dict[int, int] = field(default_factory=dict)   # device index -> bytes held by the tree


@dataclass(frozen=True)
class Snapshot:
    """Everything read in one sampling round."""
    t: float                                    # unix time
    devices: list[DeviceSample]
    processes: list[GpuProcess] | None = None   # None when processes are not sampled
    host: HostSample | None = None
    run: RunUsage | None = None
    duration_s: float = 0.0                     # how long the round took


# ---- bounded series -------------------------------------------------------------------------------

def _mean(values, weights=None):
    pairs = [(v, 1 if weights is None else w) for v, w in zip(values, weights or [1] * len(values))
             if v is not None]
    if not pairs:
        return None
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total


def _max(values, weights=None):
    vals = [v for v in values if v is not None]
    return max(vals) if vals else None


def _or(values, weights=None):
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    m = 0
    for v in vals:
        m |= int(v)
    return m


_REDUCERS = {"mean": _mean, "max": _max, "or": _or}


class BoundedSeries:
    """Columns of at most ``max_points`` points covering the whole run. When full, adjacent
    points are merged pairwise (mean, max or OR per column) and the stride (raw samples per point)
    doubles; an odd last point becomes the start of the next, wider point (weighted)."""

    def __init__(self, columns: dict[str, str], max_points: int = EVIDENCE_POINTS, digits: dict | None = None):
        self.how = dict(columns)          # column -> reducer name
        self.max_points = max(4, int(max_points))
        self.cols: dict[str, list] = {k: [] for k in self.how}
        self.stride = 1
        self._pending: list[tuple[dict, int]] = []     # (row, raw samples it stands for)
        self.digits = digits or {}

    def _reduce(self, rows: list[tuple[dict, int]]) -> dict:
        weights = [w for _, w in rows]
        return {k: _REDUCERS[h]([r.get(k) for r, _ in rows], weights) for k, h in self.how.items()}

    def add(self, row: dict) -> None:
        self._pending.append((row, 1))
        if sum(w for _, w in self._pending) >= self.stride:
            rows, self._pending = self._pending, []
            self._push(self._reduce(rows))

    def _push(self, row: dict) -> None:
        for k in self.how:
            self.cols[k].append(row[k])
        n = len(next(iter(self.cols.values())))
        if n > self.max_points:
            carry = None
            if n % 2:
                carry = {k: self.cols[k].pop() for k in self.how}
            for k, h in self.how.items():
                col = self.cols[k]
                self.cols[k] = [_REDUCERS[h](col[i:i + 2]) for i in range(0, len(col), 2)]
            if carry is not None:
                self._pending = [(carry, self.stride)] + self._pending
            self.stride *= 2

    def __len__(self) -> int:
        return len(next(iter(self.cols.values()))) + (1 if self._pending else 0)

    def export(self) -> dict[str, list]:
        cols = {k: list(v) for k, v in self.cols.items()}
        if self._pending:
            row = self._reduce(self._pending)
            for k in cols:
                cols[k].append(row[k])
        for k, d in self.digits.items():
            if k in cols:
                cols[k] = [None if v is None else (round(v, d) if d else int(round(v))) for v in cols[k]]
        return cols


def _val(v):
    """NA/None -> None; numbers unchanged."""
    return None if is_na(v) else v


DEVICE_COLUMNS = {
    "t": "mean", "util": "mean", "mem_util": "mean", "mem_used": "max", "temp": "mean", "power": "mean",
    "sm_clock": "mean", "mem_clock": "mean", "pcie_rx": "mean", "pcie_tx": "mean", "fan": "mean",
    "throttle": "or", "run_mem": "max",
}
DEVICE_DIGITS = {"t": 3, "util": 1, "mem_util": 1, "mem_used": 0, "temp": 1, "power": 1, "sm_clock": 0,
                 "mem_clock": 0, "pcie_rx": 0, "pcie_tx": 0, "fan": 1, "run_mem": 0}
RUN_COLUMNS = {"t": "mean", "cpu": "mean", "rss": "max", "nproc": "max", "gpu_mem": "max"}
RUN_DIGITS = {"t": 3, "cpu": 1, "rss": 0, "nproc": 0, "gpu_mem": 0}
# load1: the 1-minute load average (runnable + uninterruptible tasks, the whole machine): with the run's
# own CPU (the processes series) it tells a contended host (host.contention, dataloader.workers)
HOST_COLUMNS = {"t": "mean", "cpu": "mean", "mem_used": "max", "load1": "mean"}
HOST_DIGITS = {"t": 3, "cpu": 1, "mem_used": 0, "load1": 2}


class _DeviceStats:
    """Exact aggregates over every sample of one device."""

    def __init__(self):
        self.samples = 0
        self.lost_samples = 0
        self.lost_at: float | None = None
        self.error: str | None = None
        self.util_n = 0
        self.util_sum = 0.0
        self.util_min: float | None = None
        self.util_max: float | None = None
        self.mem_max: int | None = None
        self.mem_min: int | None = None
        self.run_mem_max: int | None = None
        self.temp_max: float | None = None
        self.power_n = 0
        self.power_sum = 0.0
        self.power_max: float | None = None
        self.sm_max: float | None = None
        self.throttle_samples = 0       # samples where reasons were readable
        self.throttle_counts: dict[str, int] = {}

    def add(self, s: DeviceSample, t_rel: float, run_mem: int | None, weight: float = 1.0) -> None:
        """``weight``: the share of a regular interval the sample stands for (a burst sample less)."""
        self.samples += 1
        if s.lost:
            self.lost_samples += 1
            if self.lost_at is None:
                self.lost_at = t_rel
                self.error = s.error
            return
        if not is_na(s.gpu_util):
            u = float(s.gpu_util)
            self.util_n += weight
            self.util_sum += u * weight
            self.util_min = u if self.util_min is None else min(self.util_min, u)
            self.util_max = u if self.util_max is None else max(self.util_max, u)
        if not is_na(s.memory_used):
            m = int(s.memory_used)
            self.mem_max = m if self.mem_max is None else max(self.mem_max, m)
            self.mem_min = m if self.mem_min is None else min(self.mem_min, m)
        if run_mem is not None:
            self.run_mem_max = run_mem if self.run_mem_max is None else max(self.run_mem_max, run_mem)
        if not is_na(s.temperature):
            self.temp_max = s.temperature if self.temp_max is None else max(self.temp_max, s.temperature)
        if not is_na(s.power_w):
            self.power_n += weight
            self.power_sum += s.power_w * weight
            self.power_max = s.power_w if self.power_max is None else max(self.power_max, s.power_w)
        if not is_na(s.sm_clock_mhz):
            self.sm_max = s.sm_clock_mhz if self.sm_max is None else max(self.sm_max, s.sm_clock_mhz)
        if not is_na(s.throttle):
            self.throttle_samples += 1
            for r in s.throttle:
                self.throttle_counts[r] = self.throttle_counts.get(r, 0) + 1

    def export(self) -> dict:
        return {
            "samples": self.samples, "lost_samples": self.lost_samples,
            "util_mean": None if not self.util_n else round(self.util_sum / self.util_n, 2),
            "util_min": self.util_min, "util_max": self.util_max,
            "mem_used_max": self.mem_max, "mem_used_min": self.mem_min, "run_mem_max": self.run_mem_max,
            "temp_max": self.temp_max,
            "power_mean": None if not self.power_n else round(self.power_sum / self.power_n, 1),
            "power_max": self.power_max, "sm_clock_max": self.sm_max,
            "throttle_samples": self.throttle_samples, "throttle_counts": dict(self.throttle_counts),
        }


# ---- the process tree of the run ------------------------------------------------------------------

class _TreeMonitor:
    def __init__(self, root_pid: int):
        self.root_pid = root_pid
        self._procs: dict[int, Any] = {}
        self.max_rss: int | None = None
        self.max_cpu: float | None = None
        self.max_nproc = 0
        self.seen_pids: set[int] = set()

    def measure(self) -> RunUsage:
        import psutil

        from diag.supervise import live_tree_pids

        t = time.time()
        if not os.path.exists(f"/proc/{self.root_pid}") and not psutil.pid_exists(self.root_pid):
            return RunUsage(t=t)
        cpu_total = 0.0
        cpu_known = False
        rss_total = 0
        pids = []
        current: dict[int, Any] = {}
        for pid in [self.root_pid] + live_tree_pids(self.root_pid):
            cached = self._procs.get(pid)
            try:
                proc = cached if cached is not None else psutil.Process(pid)
            except psutil.Error:
                continue
            try:
                with proc.oneshot():
                    rss_total += proc.memory_info().rss
                    c = proc.cpu_percent(None)
                if cached is not None:
                    cpu_total += c
                    cpu_known = True
            except psutil.Error:
                continue
            current[pid] = proc
            pids.append(pid)
        self._procs = current
        self.seen_pids.update(pids)
        cpu = round(cpu_total, 1) if cpu_known else NA
        self.max_rss = rss_total if self.max_rss is None else max(self.max_rss, rss_total)
        if cpu_known:
            self.max_cpu = cpu if self.max_cpu is None else max(self.max_cpu, cpu)
        self.max_nproc = max(self.max_nproc, len(pids))
        return RunUsage(t=t, pids=tuple(pids), nproc=len(pids), cpu_percent=cpu, rss=rss_total)


# ---- the sampler --------------------------------------------------------------------------------------

class Sampler:
    """Reads ``provider`` every ``interval`` seconds in a daemon thread. Thread-safe.

    ``host``: True (psutil, the default), False (no host values) or a callable returning a
    :class:`HostSample` (e.g. ``SimulatedProvider.host`` for deterministic snapshots).
    ``processes``: sample GPU processes every round (True) or never (False).
    ``visible``: indices of the devices the run can see (CUDA_VISIBLE_DEVICES), None for all.
    """

    def __init__(self, provider, interval: float = DEFAULT_INTERVAL_S, history: int = DEFAULT_HISTORY, *,
                 processes: bool = True, host: bool | Callable[[], HostSample] = True,
                 evidence_points: int = EVIDENCE_POINTS, visible: list[int] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.provider = provider
        self.interval = check_interval(interval)
        self.history_len = max(1, int(history))
        self.want_processes = processes
        if host is True:
            self._host_fn: Callable[[], HostSample] | None = HostMonitor().sample
        elif callable(host):
            self._host_fn = host
        else:
            self._host_fn = None
        self._clock = clock
        self.visible = None if visible is None else set(visible)
        self.evidence_points = evidence_points
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._listeners: list[Callable[[Snapshot], None]] = []
        self._latest: Snapshot | None = None
        self._statics: list[DeviceStatic] | None = None
        self._rings: dict[int, collections.deque[DeviceSample]] = {}
        self._host_ring: collections.deque[HostSample] = collections.deque(maxlen=self.history_len)
        self._run_ring: collections.deque[RunUsage] = collections.deque(maxlen=self.history_len)
        self._series: dict[int, BoundedSeries] = {}
        self._stats: dict[int, _DeviceStats] = {}
        self._run_series = BoundedSeries(RUN_COLUMNS, evidence_points, RUN_DIGITS)
        self._host_series = BoundedSeries(HOST_COLUMNS, evidence_points, HOST_DIGITS)
        self._tree: _TreeMonitor | None = None
        self._run_gpu_procs: dict[tuple[int, int], dict] = {}    # (pid, device) -> peak record
        self._other_procs: dict[tuple[int, int], dict] = {}
        self._invisible_pids: set[int] = set()
        self._process_query_ok: bool | None = None
        self._last_host: HostSample | None = None
        self.t0: float | None = None           # unix time of the first sample
        self.samples = 0
        self.sample_time_s = 0.0
        self.errors = 0
        self.last_error: str | None = None
        self.listener_errors = 0
        self.burst_interval: float | None = None   # faster sampling at first (see burst())
        self.burst_s = 0.0
        self._started_at: float | None = None      # self._clock() when the loop started
        self._last_live: float | None = None       # t_rel of the last sample given to the live views

    # ---- control ----
    def burst(self, interval: float = BURST_INTERVAL_S, seconds: float = BURST_S) -> "Sampler":
        """Sample every ``interval`` seconds for the first ``seconds`` after start(), then every
        ``self.interval``. Only the samples at the configured interval reach the live views
        (history rings, listeners) and read the processes and the host; the others record device
        values into the Evidence series. No effect when ``interval`` is not shorter than the
        configured one."""
        interval = check_interval(interval)
        if interval < self.interval and seconds > 0:
            self.burst_interval, self.burst_s = interval, float(seconds)
        return self

    def interval_now(self, now: float | None = None) -> float:
        """The interval to wait before the next sample: the burst interval during the burst."""
        if self.burst_interval is None:
            return self.interval
        now = self._clock() if now is None else now
        start = self._started_at if self._started_at is not None else now
        return self.burst_interval if now - start < self.burst_s else self.interval
    def track(self, pid: int | None) -> "Sampler":
        """Measure the process tree rooted at ``pid`` (the run) from now on."""
        with self._lock:
            self._tree = _TreeMonitor(pid) if pid else None
        bind = getattr(self.provider, "bind_run", None)
        if callable(bind):
            bind(pid)
        return self

    def start(self) -> "Sampler":
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return self
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="diag-gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread. A sampler that was started but never sampled (a run shorter than the
        thread's start) takes one sample now, so that the evidence has the devices."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
            if self.samples == 0 and not t.is_alive():
                try:
                    self.sample_once()
                except Exception as e:
                    self.errors += 1
                    self.last_error = f"{type(e).__name__}: {e}"

    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive() and not self._stop.is_set()

    def add_listener(self, cb: Callable[[Snapshot], None]) -> None:
        with self._lock:
            self._listeners.append(cb)

    def remove_listener(self, cb: Callable[[Snapshot], None]) -> None:
        with self._lock:
            try:
                self._listeners.remove(cb)
            except ValueError:
                pass

    # ---- reading ----
    def devices(self) -> list[DeviceStatic]:
        """The provider's devices (fetched once; the first call may initialise NVML)."""
        with self._lock:
            if self._statics is not None:
                return list(self._statics)
        statics = list(self.provider.devices())      # outside the lock: NVML init can take seconds
        with self._lock:
            if self._statics is None:
                self._statics = statics
            return list(self._statics)

    def latest(self) -> Snapshot | None:
        with self._lock:
            return self._latest

    def history(self, index: int) -> list[DeviceSample]:
        """The last ``history`` samples of device ``index``, oldest first."""
        with self._lock:
            ring = self._rings.get(index)
            return list(ring) if ring is not None else []

    def host_history(self) -> list[HostSample]:
        with self._lock:
            return list(self._host_ring)

    def run_history(self) -> list[RunUsage]:
        with self._lock:
            return list(self._run_ring)

    @property
    def mean_sample_ms(self) -> float | None:
        return None if not self.samples else 1000 * self.sample_time_s / self.samples

    # ---- sampling ----
    def _loop(self) -> None:
        next_t = self._clock()
        if self._started_at is None:
            self._started_at = next_t
        while not self._stop.is_set():
            try:
                self.sample_once()
            except Exception as e:   # never take the thread down; count and go on
                self.errors += 1
                self.last_error = f"{type(e).__name__}: {e}"
            next_t += self.interval_now(next_t)
            now = self._clock()
            if next_t < now:          # a slow round: do not try to catch up
                next_t = now
            if self._stop.wait(max(0.0, next_t - now)):
                break

    def _live_due(self, t: float) -> bool:
        """Is a sample at unix time ``t`` one for the live views (always, outside a burst)?"""
        if self.burst_interval is None or self.t0 is None or self._last_live is None:
            return True
        return t - self.t0 - self._last_live >= self.interval - self.burst_interval / 2

    def sample_once(self) -> Snapshot:
        """Take one sample now (also used by the thread), record it, notify listeners. During a
        burst (:meth:`burst`), a sample between two live ones reads the devices only."""
        t_start = time.perf_counter()
        statics = self.devices()
        samples = self.provider.sample()
        t_snap = samples[0].t if samples else time.time()
        live = self._live_due(t_snap)
        procs: list[GpuProcess] | None = None
        if self.want_processes and live:
            try:
                procs = self.provider.processes()
                ok = True
            except Exception:
                procs, ok = None, False
            with self._lock:
                self._process_query_ok = ok if self._process_query_ok is None else (self._process_query_ok or ok)
        host = self._host_fn() if self._host_fn and live else None
        with self._lock:
            tree = self._tree
        run = tree.measure() if tree is not None and live else None
        if run is not None and procs is not None:
            mine = set(run.pids)
            gm: dict[int, int] = {}
            for p in procs:
                if p.pid in mine and not is_na(p.used_memory):
                    gm[p.device] = gm.get(p.device, 0) + int(p.used_memory)
            run = RunUsage(t=run.t, pids=run.pids, nproc=run.nproc, cpu_percent=run.cpu_percent, rss=run.rss,
                           gpu_memory=gm)
        duration = time.perf_counter() - t_start
        # the providers' own time (an injected clock for simulated GPUs), else now
        snap = Snapshot(t=t_snap, devices=samples, processes=procs, host=host, run=run, duration_s=duration)
        self._record(snap, statics, live)
        if not live:
            return snap
        with self._lock:
            listeners = list(self._listeners)
        for cb in listeners:
            try:
                cb(snap)
            except Exception:
                self.listener_errors += 1
        return snap

    def _record(self, snap: Snapshot, statics: list[DeviceStatic], live: bool = True) -> None:
        with self._lock:
            if live or self._latest is None:
                self._latest = snap
            self.samples += 1
            self.sample_time_s += snap.duration_s
            if self.t0 is None:
                self.t0 = snap.t
            t_rel = snap.t - self.t0
            if live:
                self._last_live = t_rel
            # a burst sample stands for a burst interval: the means over the run stay time-weighted
            weight = (self.burst_interval / self.interval
                      if self.burst_interval is not None and t_rel < self.burst_s else 1.0)
            run_pids = set(snap.run.pids) if snap.run else set()
            for s in snap.devices:
                ring = self._rings.get(s.index)
                if ring is None:
                    ring = self._rings[s.index] = collections.deque(maxlen=self.history_len)
                if live:
                    ring.append(s)
                series = self._series.get(s.index)
                if series is None:
                    series = self._series[s.index] = BoundedSeries(DEVICE_COLUMNS, self.evidence_points,
                                                                   DEVICE_DIGITS)
                    self._stats[s.index] = _DeviceStats()
                run_mem = None
                if snap.run is not None and snap.processes is not None:
                    run_mem = snap.run.gpu_memory.get(s.index, 0)
                series.add({
                    "t": t_rel, "util": _val(s.gpu_util), "mem_util": _val(s.mem_util),
                    "mem_used": _val(s.memory_used), "temp": _val(s.temperature), "power": _val(s.power_w),
                    "sm_clock": _val(s.sm_clock_mhz), "mem_clock": _val(s.mem_clock_mhz),
                    "pcie_rx": _val(s.pcie_rx_bps), "pcie_tx": _val(s.pcie_tx_bps), "fan": _val(s.fan_pct),
                    "throttle": None if is_na(s.throttle) else throttle_mask(s.throttle),
                    "run_mem": run_mem,
                })
                self._stats[s.index].add(s, t_rel, run_mem, weight)
            if snap.host is not None:
                self._host_ring.append(snap.host)
                self._last_host = snap.host
                self._host_series.add({"t": t_rel, "cpu": _val(snap.host.cpu_percent),
                                       "mem_used": _val(snap.host.mem_used), "load1": _val(snap.host.load1)})
            if snap.run is not None:
                self._run_ring.append(snap.run)
                self._run_series.add({"t": t_rel, "cpu": _val(snap.run.cpu_percent), "rss": _val(snap.run.rss),
                                      "nproc": snap.run.nproc,
                                      "gpu_mem": sum(snap.run.gpu_memory.values()) if snap.processes is not None
                                      else None})
            if snap.processes is not None:
                for p in snap.processes:
                    if not p.visible:
                        self._invisible_pids.add(p.pid)
                    key = (p.pid, p.device)
                    table = self._run_gpu_procs if p.pid in run_pids else self._other_procs
                    rec = table.get(key)
                    mem = None if is_na(p.used_memory) else int(p.used_memory)
                    if rec is None:
                        if len(table) >= MAX_PROCESSES_KEPT:
                            continue
                        # other people's command lines stay out of the evidence (they may hold secrets)
                        table[key] = {"pid": p.pid, "device": p.device, "mig": p.mig, "name": p.name,
                                      "command": p.command[:300] if p.pid in run_pids else "",
                                      "user": p.user, "visible": p.visible,
                                      "used_memory_max": mem, "first_t": round(t_rel, 3), "last_t": round(t_rel, 3)}
                    else:
                        rec["last_t"] = round(t_rel, 3)
                        if mem is not None and (rec["used_memory_max"] is None or mem > rec["used_memory_max"]):
                            rec["used_memory_max"] = mem

    # ---- Evidence ----
    def to_evidence(self) -> dict[str, Any]:
        """The ``Evidence.gpu`` section (shape documented in docs/gpus.md)."""
        prov = self.provider
        with self._lock:
            # before the first sample, NVML may not be initialised yet: do not do it here (this is
            # called from the runner's save(), on the caller's thread)
            known = self._statics is not None
            statics = list(self._statics or [])
            reason = getattr(prov, "reason", None) if known else None
            provider_name = getattr(prov, "name", "none")
            if known and not statics and provider_name != "simulated":
                provider_name = "none"
            run_devices = {p["device"] for p in self._run_gpu_procs.values()}
            tracking = self._tree is not None
            # "used by the run" is known when the run's processes could be matched to GPU processes
            matchable = tracking and self.want_processes and bool(self._process_query_ok)
            devices = []
            for st in statics:
                d = to_jsonable(st)
                stats = self._stats.get(st.index)
                series = self._series.get(st.index)
                d["visible"] = self.visible is None or st.index in self.visible
                if not matchable:
                    used = None
                elif st.index in run_devices:
                    used = True
                elif self._invisible_pids:
                    used = None       # the run's processes may be among those we cannot see
                else:
                    used = False
                d["used_by_run"] = used
                d["lost"] = bool(stats and stats.lost_at is not None)
                d["lost_at"] = None if not stats or stats.lost_at is None else round(stats.lost_at, 3)
                d["error"] = stats.error if stats else None
                d["stats"] = stats.export() if stats else _DeviceStats().export()
                d["stride"] = series.stride if series else 1
                d["series"] = series.export() if series else {k: [] for k in DEVICE_COLUMNS}
                devices.append(d)
            notes = []
            try:
                notes = list(prov.notes()) if known else []
            except Exception:
                pass
            tree = self._tree
            processes = {
                "tracked": tracking,
                "root_pid": tree.root_pid if tree else None,
                "pids_seen": sorted(tree.seen_pids)[:MAX_PROCESSES_KEPT] if tree else [],
                "max_rss": tree.max_rss if tree else None,
                "max_cpu_percent": tree.max_cpu if tree else None,
                "max_nproc": tree.max_nproc if tree else 0,
                "gpu_query_ok": self._process_query_ok,
                "invisible_pids": sorted(self._invisible_pids)[:MAX_PROCESSES_KEPT],
                "series": self._run_series.export(),
                "stride": self._run_series.stride,
                "gpu": sorted(self._run_gpu_procs.values(), key=lambda r: (r["device"], r["pid"])),
                "others": sorted(self._other_procs.values(), key=lambda r: (r["device"], r["pid"])),
            }
            host = self._last_host
            host_d = {
                "cpu_count": None if host is None else _val(host.cpu_count),
                "mem_total": None if host is None else _val(host.mem_total),
                "series": self._host_series.export(), "stride": self._host_series.stride,
            }
            try:
                driver = dict(prov.driver()) if known else {}
            except Exception:
                driver = {}
            return {
                "provider": provider_name,
                "simulated": bool(getattr(prov, "simulated", False)),
                "scenario": getattr(prov, "scenario", None),
                "reason": reason if not statics else None,
                "pending": not known,            # no sample taken yet
                "interval_s": self.interval,
                "burst_interval_s": self.burst_interval,
                "burst_s": self.burst_s if self.burst_interval is not None else None,
                "t0": self.t0,
                "samples": self.samples,
                "sample_ms_mean": None if not self.samples else round(1000 * self.sample_time_s / self.samples, 3),
                "sampler_errors": self.errors,
                "last_error": self.last_error,
                "driver": driver,
                "notes": notes,
                "throttle_bits": dict(THROTTLE_BITS),
                "devices": devices,
                "processes": processes,
                "host": host_d,
            }


def parse_visible_devices(value: str | None, statics: list[DeviceStatic]) -> list[int] | None:
    """Indices (into ``statics``) that CUDA_VISIBLE_DEVICES makes visible, in CUDA order; None when
    the variable is unset. Integers are driver (NVML) indices; ``GPU-``/``MIG-`` UUIDs (or unique
    prefixes) are matched too. Like CUDA, parsing stops at the first entry that matches nothing."""
    if value is None:
        return None
    out: list[int] = []
    for raw in value.split(","):
        item = raw.strip()
        if not item:
            break
        match = None
        if item.lstrip("-").isdigit():
            n = int(item)
            if n < 0:
                break
            for s in statics:
                if (s.nvml_index if s.nvml_index is not None else s.index) == n:
                    match = s.index
        else:
            key = item.lower()
            cands = [s.index for s in statics if s.uuid.lower().startswith(key)
                     or any(m.uuid.lower().startswith(key) for m in s.mig_devices)]
            if len(cands) == 1:
                match = cands[0]
        if match is None:
            break
        if match not in out:
            out.append(match)
    return out


def build_run_sampler(simulate: str | None, interval: float, env: dict[str, str] | None = None):
    """The sampler a script run uses: simulated when asked, else NVML, else a provider with zero
    devices and the reason. Never raises for a missing driver (the checks then say why they skip);
    raises DiagError for an unknown scenario or a bad interval."""
    from diag.gpu import get_provider

    interval = check_interval(interval)
    provider = get_provider(simulate, strict=False)   # "" forces real GPUs; None reads DIAG_SIMULATE_GPUS
    env = dict(os.environ if env is None else env)
    visible = None
    if "CUDA_VISIBLE_DEVICES" in env and not getattr(provider, "simulated", False):
        try:
            visible = parse_visible_devices(env["CUDA_VISIBLE_DEVICES"], provider.devices())
        except Exception:
            visible = None
    return Sampler(provider, interval=interval, visible=visible)


def attach_to_run(run) -> Sampler:
    """The sampler of a :class:`diag.runner.Run` (called from ``Run.__init__``): built from
    ``run.config`` (``simulate_gpus``, ``gpu_interval``, ``env``), not started. Labels simulated
    runs in the evidence (``run.simulated_gpus`` and a note) and records the provider's state so far."""
    cfg = run.config
    env = dict(os.environ)
    env.update(getattr(cfg, "env", None) or {})
    simulate = getattr(cfg, "simulate_gpus", None)
    if simulate is None:
        simulate = scenario_from_env(env)
    sampler = build_run_sampler(simulate or "", getattr(cfg, "gpu_interval", DEFAULT_INTERVAL_S), env)
    sampler.burst()       # enough samples inside the steady steps of a short run (gpu.low-utilization)
    prov = sampler.provider
    if getattr(prov, "simulated", False):
        run.evidence.run.simulated_gpus = prov.scenario
        note = f"GPU values are simulated (scenario '{prov.scenario}'), not measured"
        if note not in run.evidence.notes:
            run.evidence.notes.append(note)
    return sampler


def scenario_from_env(env: dict | None = None) -> str | None:
    """DIAG_SIMULATE_GPUS, checked: None when unset or empty, DiagError when unknown."""
    from diag.gpu.simulated import SCENARIOS

    value = ((os.environ if env is None else env).get("DIAG_SIMULATE_GPUS") or "").strip()
    if not value:
        return None
    if value.lower() not in SCENARIOS:
        raise DiagError(f"DIAG_SIMULATE_GPUS={value!r} is not a known scenario; choose one of: {', '.join(SCENARIOS)}")
    return value.lower()
