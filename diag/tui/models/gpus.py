"""What the GPUs tab shows, as plain data (no textual): built live from a :class:`diag.gpu.Sampler`
or, for a replay, from the ``Evidence.gpu`` section a run recorded.

:class:`GpuFeed` wraps a sampler for the app: the sampler thread's listener only raises a flag;
the app's timer calls :meth:`GpuFeed.poll` and, when the GPUs tab is on screen, :meth:`GpuFeed.view`.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from diag.gpu.provider import (NA, DeviceSample, DeviceStatic, GpuProcess, HostSample, MigSample,
                               MigStatic, is_na, throttle_names)

HISTORY_POINTS = 120     # points of history the panes draw


@dataclass
class MigView:
    static: MigStatic
    sample: MigSample | None = None
    processes: list[GpuProcess] = field(default_factory=list)


@dataclass
class DeviceView:
    static: DeviceStatic
    sample: DeviceSample | None = None
    util_hist: list[float | None] = field(default_factory=list)     # %, oldest first
    mem_hist: list[float | None] = field(default_factory=list)      # % of total
    processes: list[GpuProcess] = field(default_factory=list)       # not on a MIG instance
    mig: list[MigView] = field(default_factory=list)
    used_by_run: bool | None = None
    stats: dict | None = None          # recorded aggregates (replay)


@dataclass
class GpuView:
    provider: str = "none"
    simulated: str | None = None       # scenario name when simulated
    reason: str | None = None          # why there are no devices
    hint: str | None = None
    devices: list[DeviceView] = field(default_factory=list)
    host: HostSample | None = None
    host_simulated: bool = False       # the host figures come from the simulated scenario too
    host_cpu_hist: list[float | None] = field(default_factory=list)
    host_mem_hist: list[float | None] = field(default_factory=list)
    run: Any = None                    # diag.gpu.RunUsage (the run's process tree), or None
    driver: dict = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    interval_s: float | None = None
    samples: int = 0
    recorded: bool = False             # from saved evidence (replay), not live


def _pct(used, total) -> float | None:
    if is_na(used) or is_na(total) or not total:
        return None
    return 100.0 * used / total


def _num(v) -> float | None:
    return None if is_na(v) else float(v)


def view_from_sampler(sampler, points: int = HISTORY_POINTS) -> GpuView:
    prov = sampler.provider
    statics = sampler.devices()
    latest = sampler.latest()
    samples = {s.index: s for s in (latest.devices if latest else [])}
    procs = (latest.processes if latest and latest.processes is not None else [])
    run = latest.run if latest else None
    run_pids = set(run.pids) if run is not None else set()
    devices = []
    for st in statics:
        hist = sampler.history(st.index)[-points:]
        dv = DeviceView(static=st, sample=samples.get(st.index),
                        util_hist=[_num(s.gpu_util) for s in hist],
                        mem_hist=[_pct(s.memory_used, s.memory_total) for s in hist])
        mine = [p for p in procs if p.device == st.index]
        dv.processes = [p for p in mine if p.mig is None]
        msamples = {m.index: m for m in (dv.sample.mig if dv.sample else ())}
        dv.mig = [MigView(m, msamples.get(m.index), [p for p in mine if p.mig == m.index])
                  for m in st.mig_devices]
        if run is not None:
            dv.used_by_run = any(p.pid in run_pids for p in mine)
        devices.append(dv)
    host_hist = sampler.host_history()[-points:]
    try:
        driver = dict(prov.driver())
    except Exception:
        driver = {}
    try:
        notes = list(prov.notes())
    except Exception:
        notes = []
    return GpuView(
        provider=getattr(prov, "name", "none"),
        simulated=(getattr(prov, "scenario", None) or "simulated") if getattr(prov, "simulated", False) else None,
        reason=None if statics else (getattr(prov, "reason", None) or "no GPU was found"),
        hint=getattr(prov, "hint", None),
        devices=devices,
        host=latest.host if latest else None,
        host_simulated=bool(getattr(prov, "simulated", False))
        and getattr(getattr(sampler, "_host_fn", None), "__self__", None) is prov,
        host_cpu_hist=[_num(h.cpu_percent) for h in host_hist],
        host_mem_hist=[_pct(h.mem_used, h.mem_total) for h in host_hist],
        run=run, driver=driver, notes=notes, interval_s=sampler.interval, samples=sampler.samples,
    )


def _na(v):
    return NA if v is None else v


def _static_from_dict(d: dict) -> DeviceStatic:
    fields = DeviceStatic.__dataclass_fields__
    kw = {}
    for k, v in d.items():
        if k not in fields or k == "mig_devices":
            continue
        if k == "compute_capability" and isinstance(v, list):
            v = tuple(v)
        kw[k] = _na(v) if fields[k].default is NA else v
    migs = []
    for m in d.get("mig_devices") or []:
        mf = MigStatic.__dataclass_fields__
        migs.append(MigStatic(**{k: (_na(v) if mf[k].default is NA else v) for k, v in m.items() if k in mf}))
    kw["mig_devices"] = tuple(migs)
    kw.setdefault("index", 0)
    return DeviceStatic(**kw)


def view_from_evidence(gpu: dict, points: int = HISTORY_POINTS) -> GpuView:
    """The GPUs a saved run recorded (``Evidence.gpu``); the last recorded point is "now"."""
    if not gpu:
        return GpuView(reason="this run recorded no GPU telemetry", recorded=True)
    devices = []
    for d in gpu.get("devices") or []:
        try:
            st = _static_from_dict(d)
        except TypeError:
            continue
        series = d.get("series") or {}
        util = list(series.get("util") or [])[-points:]
        mem = list(series.get("mem_used") or [])[-points:]
        total = None if is_na(st.memory_total) else st.memory_total
        mem_pct = [None if (m is None or not total) else 100.0 * m / total for m in mem]

        def last(col):
            vals = series.get(col) or []
            return _na(vals[-1]) if vals else NA

        thr = last("throttle")
        sample = DeviceSample(
            index=st.index, t=0.0, lost=bool(d.get("lost")), gpu_util=last("util"), mem_util=last("mem_util"),
            memory_used=last("mem_used"), memory_total=st.memory_total, temperature=last("temp"),
            power_w=last("power"), power_limit_w=st.power_limit_w, sm_clock_mhz=last("sm_clock"),
            mem_clock_mhz=last("mem_clock"), pcie_rx_bps=last("pcie_rx"), pcie_tx_bps=last("pcie_tx"),
            fan_pct=last("fan"), throttle=NA if thr is NA else throttle_names(int(thr)),
            error=d.get("error"),
        ) if series.get("t") else None
        dv = DeviceView(static=st, sample=sample, util_hist=util, mem_hist=mem_pct,
                        used_by_run=d.get("used_by_run"), stats=d.get("stats"))
        dv.mig = [MigView(m) for m in st.mig_devices]
        procs = (gpu.get("processes") or {})
        for rec in (procs.get("gpu") or []) + (procs.get("others") or []):
            if rec.get("device") != st.index:
                continue
            p = GpuProcess(pid=rec.get("pid", 0), device=st.index, mig=rec.get("mig"),
                           used_memory=_na(rec.get("used_memory_max")), name=rec.get("name") or "",
                           command=rec.get("command") or "", user=rec.get("user") or "",
                           visible=rec.get("visible", True))
            if p.mig is None:
                dv.processes.append(p)
            else:
                for mv in dv.mig:
                    if mv.static.index == p.mig:
                        mv.processes.append(p)
        devices.append(dv)
    host = gpu.get("host") or {}
    hs = host.get("series") or {}
    mem_total = host.get("mem_total")
    host_sample = None
    if hs.get("t"):
        host_sample = HostSample(t=0.0, cpu_percent=_na((hs.get("cpu") or [None])[-1]),
                                 cpu_count=_na(host.get("cpu_count")), mem_total=_na(mem_total),
                                 mem_used=_na((hs.get("mem_used") or [None])[-1]))
    return GpuView(
        provider=gpu.get("provider") or "none",
        simulated=(gpu.get("scenario") or "simulated") if gpu.get("simulated") else None,
        reason=None if devices else (gpu.get("reason") or "no GPU was found"),
        devices=devices, host=host_sample,
        host_cpu_hist=list(hs.get("cpu") or [])[-points:],
        host_mem_hist=[None if (m is None or not mem_total) else 100.0 * m / mem_total
                       for m in list(hs.get("mem_used") or [])[-points:]],
        driver=gpu.get("driver") or {}, notes=list(gpu.get("notes") or []),
        interval_s=gpu.get("interval_s"), samples=gpu.get("samples") or 0, recorded=True,
    )


class GpuFeed:
    """A sampler, seen by the app. ``own``: the feed starts and stops the sampler thread."""

    def __init__(self, sampler, own: bool = True):
        self.sampler = sampler
        self.own = own
        self._lock = threading.Lock()
        self._new = True
        sampler.add_listener(self._on_snapshot)

    # from the sampler thread: only a flag
    def _on_snapshot(self, snap) -> None:
        with self._lock:
            self._new = True

    @property
    def simulated(self) -> str | None:
        prov = self.sampler.provider
        return (getattr(prov, "scenario", None) or "simulated") if getattr(prov, "simulated", False) else None

    def start(self) -> None:
        if self.own and not self.sampler.running:
            self.sampler.start()

    def stop(self) -> None:
        self.sampler.remove_listener(self._on_snapshot)
        if self.own:
            self.sampler.stop(timeout=2.0)

    def track(self, pid: int | None) -> None:
        self.sampler.track(pid)

    def poll(self) -> bool:
        """Did new samples arrive since the last call?"""
        with self._lock:
            new, self._new = self._new, False
        return new

    def view(self) -> GpuView:
        return view_from_sampler(self.sampler)


class RecordedGpu:
    """The GPU telemetry saved in an evidence file (replay): one fixed view."""

    def __init__(self, gpu_section: dict):
        self._view = view_from_evidence(gpu_section)
        self._polled = False

    @property
    def simulated(self) -> str | None:
        return self._view.simulated

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def track(self, pid) -> None:
        pass

    def poll(self) -> bool:
        new, self._polled = not self._polled, True
        return new

    def view(self) -> GpuView:
        return self._view
