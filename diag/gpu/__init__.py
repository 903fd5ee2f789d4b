"""GPU telemetry for diag: one small, thread-safe library API shared by ``diag gpus``, ``diag check``
(the sampler records series into ``Evidence.gpu``) and the TUI's GPU panes.

Importing this package is cheap: no NVML, no torch, no textual. NVML (nvidia-ml-py) is imported and
initialised lazily, once, under a lock, on the first call that needs it.

Quick use::

    from diag.gpu import get_provider, Sampler, fmt, NA

    provider = get_provider()                  # NVML; or get_provider("healthy-8") for simulated GPUs
    for d in provider.devices():               # list[DeviceStatic]: name, uuid, memory_total, ...
        print(d.index, d.name, fmt(d.memory_total, "B"))
    for s in provider.sample():                # list[DeviceSample]: gpu_util, memory_used, power_w, ...
        print(s.index, fmt(s.gpu_util, "%"), "lost" if s.lost else "")
    provider.processes()                       # list[GpuProcess]: pid, device, used_memory, name, user

    sampler = Sampler(provider, interval=1.0, history=300).start()
    sampler.add_listener(lambda snap: ...)     # called from the sampler thread with a Snapshot
    sampler.latest()                           # Snapshot | None: devices, processes, host, run
    sampler.history(0)                         # last `history` DeviceSamples of device 0
    sampler.stop()

API
---
``get_provider(simulate=None, *, strict=True, visible_only=False, seed=0, clock=None, start=0.0)``
    ``simulate``: a scenario name (see :data:`SCENARIOS`); None reads ``DIAG_SIMULATE_GPUS``; ``""``
    forces real GPUs. Without simulation it returns the NVML provider. With ``strict=True`` a missing
    nvidia-ml-py package, NVML library or driver raises :class:`~diag.errors.DiagError` (one sentence
    and a hint); with ``strict=False`` it returns a provider with zero devices whose ``reason`` says
    why. ``visible_only`` honours ``CUDA_VISIBLE_DEVICES``. ``seed``/``clock``/``start`` go to the
    simulated provider (inject a clock for reproducible values).
``Provider`` (protocol; ``name`` "nvml" | "simulated" | "none", ``simulated``, ``scenario``, ``reason``)
    ``devices() -> list[DeviceStatic]``, ``sample() -> list[DeviceSample]``,
    ``processes() -> list[GpuProcess]``, ``driver() -> dict``, ``notes() -> list[str]``, ``close()``.
    Every method is thread-safe; a lost GPU is a sample with ``lost=True``, never an exception.
``Sampler(provider, interval=1.0, history=300, *, processes=True, host=True, visible=None)``
    ``start()``, ``stop()``, ``running``, ``sample_once()``, ``latest()``, ``history(index)``,
    ``host_history()``, ``run_history()``, ``devices()``, ``add_listener(cb)``,
    ``remove_listener(cb)``, ``track(pid)`` (measure a process tree), ``to_evidence()``.
    ``interval`` below 0.1 s raises DiagError.
``host_sample(prime_s=0.1) -> HostSample`` and ``HostMonitor().sample()``: host CPU and RAM.
``NA``: the value of a field the driver cannot give (falsy, prints ``N/A``, JSON ``null``).
``fmt(value, unit)``: text for people; units ``%``, ``B``, ``B/s``, ``W``, ``C``, ``MHz``, ``s``.
``to_jsonable(obj)``: any of these dataclasses as plain JSON values (NA -> None).

Everything a simulated provider returns has ``simulated=True``; every output must say "simulated".
The full description, with the shape of ``Evidence.gpu``, is in docs/gpus.md.
"""
from __future__ import annotations

import os

from diag.gpu.provider import (
    NA, POWER_REASONS, SLOWDOWN_REASONS, THERMAL_REASONS, THROTTLE_BITS, THROTTLE_DESCRIPTIONS,
    DeviceSample, DeviceStatic, GpuProcess, HostMonitor, HostSample, MigSample, MigStatic, NAType,
    NoGpuProvider, Provider, fmt, host_sample, is_na, to_jsonable,
)
from diag.gpu.sampler import (
    DEFAULT_HISTORY, DEFAULT_INTERVAL_S, MIN_INTERVAL_S, RunUsage, Sampler, Snapshot, check_interval,
)
from diag.gpu.simulated import SCENARIOS, SimulatedProvider, scenario_names

ENV_SIMULATE = "DIAG_SIMULATE_GPUS"

__all__ = [
    "NA", "NAType", "fmt", "is_na", "to_jsonable", "get_provider", "simulate_from_env", "Provider",
    "NoGpuProvider", "SimulatedProvider", "SCENARIOS", "scenario_names", "DeviceStatic", "DeviceSample",
    "MigStatic", "MigSample", "GpuProcess", "HostSample", "HostMonitor", "host_sample", "Sampler",
    "Snapshot", "RunUsage", "check_interval", "MIN_INTERVAL_S", "DEFAULT_INTERVAL_S", "DEFAULT_HISTORY",
    "THROTTLE_BITS", "THROTTLE_DESCRIPTIONS", "THERMAL_REASONS", "POWER_REASONS", "SLOWDOWN_REASONS",
    "ENV_SIMULATE",
]


def simulate_from_env(value: str | None = None) -> str | None:
    """The scenario to simulate: ``value`` when given, else ``DIAG_SIMULATE_GPUS`` (None when
    neither is set or the value is empty)."""
    if value is None:
        value = os.environ.get(ENV_SIMULATE)
    value = (value or "").strip()
    return value or None


def get_provider(simulate: str | None = None, *, strict: bool = True, visible_only: bool = False,
                 seed: int = 0, clock=None, start: float = 0.0):
    """The telemetry source: simulated (scenario name, or ``DIAG_SIMULATE_GPUS`` when ``simulate``
    is None) or NVML. See the module docstring."""
    scenario = simulate_from_env(simulate)
    if scenario:
        return SimulatedProvider(scenario, seed=seed, clock=clock, start=start)
    from diag.gpu.nvml import NvmlProvider

    provider = NvmlProvider(visible_only=visible_only)
    if strict:
        provider.ensure()      # raises DiagError with a hint when NVML cannot be used
    return provider
