"""The GPU provider protocol: what every source of GPU telemetry (NVML, simulated) returns.

Plain frozen dataclasses, no NVML and no torch here. A value the driver cannot give is :data:`NA`
(never 0); :func:`fmt` renders it as ``N/A``. :func:`to_jsonable` turns any of these objects into
JSON-ready dicts (``NA`` becomes ``null``).
"""
from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol, Union, runtime_checkable

from diag import units


# ---- NA ---------------------------------------------------------------------------------------------

class _NAType:
    """A value the driver cannot give (NotSupported, unknown, lost). Falsy, prints as ``N/A``,
    equal only to itself, serialised as ``null``. Never confuse it with 0."""

    _instance: "_NAType | None" = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NA"

    def __str__(self) -> str:
        return "N/A"

    def __format__(self, spec: str) -> str:
        return "N/A"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self):
        return "NA"

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


NA: Any = _NAType()
NAType = _NAType


def is_na(value: Any) -> bool:
    """True for NA and None (a missing value either way)."""
    return value is NA or value is None


# ---- formatting -------------------------------------------------------------------------------------

def _human_bytes(n: float) -> str:
    return units.fmt_bytes(n, style="short")


def _human_rate(n: float) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if abs(n) >= size:
            v = n / size
            return f"{v:.1f} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{n:.0f} B/s"


def fmt(value: Any, unit: str | None = None) -> str:
    """Render one telemetry value for people. NA and None give ``"N/A"``.

    Units: ``"%"`` (percent), ``"B"`` (bytes, shown in KiB/MiB/GiB), ``"B/s"`` (bytes per second),
    ``"W"``, ``"C"`` (degrees Celsius), ``"MHz"``, ``"s"``; any other unit is appended after a space.
    """
    if value is NA or value is None:
        return "N/A"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (tuple, list)):
        return ", ".join(fmt(v) for v in value) if value else "none"
    if not isinstance(value, (int, float)):
        return str(value) + (f" {unit}" if unit else "")
    if isinstance(value, float) and not math.isfinite(value):
        return "N/A"
    if unit == "%":
        return f"{value:.0f}%"
    if unit == "B":
        return _human_bytes(value)
    if unit == "B/s":
        return _human_rate(value)
    if unit == "W":
        return f"{value:.0f} W"
    if unit == "C":
        return f"{value:.0f}°C"
    if unit == "MHz":
        return f"{value:.0f} MHz"
    if unit == "s":
        return f"{value:.2f} s" if value < 10 else f"{value:.0f} s"
    text = f"{value:.1f}" if isinstance(value, float) and not value.is_integer() else f"{value:.0f}"
    return text + (f" {unit}" if unit else "")


# ---- throttle (clock event) reasons -----------------------------------------------------------------

# NVML clock event reason bits (nvmlClocksEventReason*), by the names diag uses.
THROTTLE_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal": 0x20,
    "hw_thermal": 0x40,
    "hw_power_brake": 0x80,
    "display_clocks": 0x100,
}
# Reasons that mean the GPU runs slower than it could because of heat or power (the others are
# benign: idle, a clock setting, sync boost, display).
THERMAL_REASONS = ("sw_thermal", "hw_thermal", "hw_slowdown", "hw_power_brake")
POWER_REASONS = ("sw_power_cap",)
SLOWDOWN_REASONS = THERMAL_REASONS + POWER_REASONS
THROTTLE_DESCRIPTIONS = {
    "gpu_idle": "idle (nothing running)",
    "applications_clocks": "clocks limited by the applications-clocks setting",
    "sw_power_cap": "software power cap: drawing power at the power limit",
    "hw_slowdown": "hardware slowdown (high temperature or power brake)",
    "sync_boost": "sync boost with other GPUs",
    "sw_thermal": "software thermal slowdown: too hot",
    "hw_thermal": "hardware thermal slowdown: too hot",
    "hw_power_brake": "hardware power brake (external power-brake signal)",
    "display_clocks": "display clock setting",
}


def throttle_names(mask: int) -> tuple[str, ...]:
    return tuple(name for name, bit in THROTTLE_BITS.items() if mask & bit)


def throttle_mask(names) -> int:
    m = 0
    for n in names or ():
        m |= THROTTLE_BITS.get(n, 0)
    return m


# ---- the data -----------------------------------------------------------------------------------------

Num = Union[int, float, Any]   # a number or NA


@dataclass(frozen=True)
class MigStatic:
    """A MIG instance of a physical GPU (listed under its parent)."""
    index: int                  # MIG device index within the parent
    uuid: str = ""
    name: str = ""              # profile, e.g. "3g.20gb"
    memory_total: Num = NA      # bytes
    gpu_instance_id: Num = NA
    compute_instance_id: Num = NA


@dataclass(frozen=True)
class DeviceStatic:
    """What does not change while a GPU runs."""
    index: int                          # diag's index (CUDA_VISIBLE_DEVICES order when honoured)
    name: str = ""
    uuid: str = ""
    nvml_index: int | None = None       # the driver's index (None for simulated devices)
    bus_id: str = ""
    memory_total: Num = NA              # bytes
    compute_capability: Any = NA        # (major, minor) or NA
    power_limit_w: Num = NA             # enforced power limit
    default_power_limit_w: Num = NA
    pcie_gen: Num = NA                  # current link generation
    pcie_gen_max: Num = NA
    pcie_width: Num = NA                # current link width (lanes)
    pcie_width_max: Num = NA
    mig_mode: Any = NA                  # True / False / NA (no MIG support)
    mig_devices: tuple[MigStatic, ...] = ()
    simulated: bool = False


@dataclass(frozen=True)
class MigSample:
    index: int
    memory_used: Num = NA
    memory_total: Num = NA


@dataclass(frozen=True)
class DeviceSample:
    """One reading of a GPU's dynamic values. A lost GPU has ``lost=True`` and NA values."""
    index: int
    t: float                            # unix time of the reading
    lost: bool = False
    gpu_util: Num = NA                  # %
    mem_util: Num = NA                  # % of time the memory controller was busy
    memory_used: Num = NA               # bytes
    memory_total: Num = NA              # bytes
    temperature: Num = NA               # °C
    power_w: Num = NA
    power_limit_w: Num = NA
    sm_clock_mhz: Num = NA
    mem_clock_mhz: Num = NA
    pcie_rx_bps: Num = NA               # bytes/s
    pcie_tx_bps: Num = NA
    fan_pct: Num = NA
    throttle: Any = NA                  # tuple of reason names (THROTTLE_BITS) or NA
    mig: tuple[MigSample, ...] = ()
    error: str | None = None            # why the device is lost / what failed

    @property
    def memory_pct(self) -> Num:
        if is_na(self.memory_used) or is_na(self.memory_total) or not self.memory_total:
            return NA
        return 100.0 * self.memory_used / self.memory_total


@dataclass(frozen=True)
class GpuProcess:
    """A process that holds memory on a GPU (or a MIG instance of it)."""
    pid: int
    device: int                         # DeviceStatic.index
    mig: int | None = None              # MigStatic.index when on a MIG instance
    used_memory: Num = NA               # bytes on that device
    type: str = "C"                     # C (compute), G (graphics), C+G
    visible: bool = True                # False: NVML reports it but /proc here cannot see it (container)
    name: str = ""
    command: str = ""
    user: str = ""
    cpu_percent: Num = NA
    host_memory: Num = NA               # resident set size, bytes
    simulated: bool = False


@dataclass(frozen=True)
class HostSample:
    t: float
    cpu_percent: Num = NA               # whole machine, 0-100
    cpu_count: Num = NA
    load1: Num = NA
    mem_total: Num = NA                 # bytes
    mem_used: Num = NA
    mem_available: Num = NA
    mem_percent: Num = NA


# ---- the protocol ---------------------------------------------------------------------------------------

@runtime_checkable
class Provider(Protocol):
    """A source of GPU telemetry. Every method is thread-safe and never raises for a device
    problem (a lost GPU is a sample with ``lost=True``; an unsupported field is NA)."""

    name: str                   # "nvml" | "simulated" | "none"
    simulated: bool
    scenario: str | None        # simulated scenario name

    @property
    def reason(self) -> str | None:
        """Why there are no devices (driver missing, zero GPUs, ...); None when there are some."""

    def devices(self) -> list[DeviceStatic]: ...

    def sample(self) -> list[DeviceSample]: ...

    def processes(self) -> list[GpuProcess]: ...

    def driver(self) -> dict[str, Any]:
        """{"driver_version": str|None, "cuda_driver_version": str|None, "nvml_version": str|None}."""

    def notes(self) -> list[str]:
        """Things the user should know, summarised once (fields unsupported, invisible PIDs)."""

    def close(self) -> None: ...


class NoGpuProvider:
    """Zero devices, with the reason (no driver, no library, simulated node without GPUs)."""

    name = "none"

    def __init__(self, reason: str, simulated: bool = False, scenario: str | None = None,
                 hint: str | None = None):
        self._reason = reason
        self.hint = hint
        self.simulated = simulated
        self.scenario = scenario

    @property
    def reason(self) -> str | None:
        return self._reason

    def devices(self) -> list[DeviceStatic]:
        return []

    def sample(self) -> list[DeviceSample]:
        return []

    def processes(self) -> list[GpuProcess]:
        return []

    def driver(self) -> dict[str, Any]:
        return {"driver_version": None, "cuda_driver_version": None, "nvml_version": None}

    def notes(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


# ---- host -------------------------------------------------------------------------------------------------

class HostMonitor:
    """Host CPU and RAM, thread-safe. The first ``sample()`` primes psutil's CPU counter (its
    cpu_percent is NA then) unless ``prime_s`` > 0, which measures over that many seconds."""

    def __init__(self):
        self._lock = threading.Lock()
        self._primed = False

    def sample(self, prime_s: float = 0.0) -> HostSample:
        try:
            import psutil
        except ImportError:  # pragma: no cover - psutil is a dependency
            return HostSample(t=time.time(), cpu_count=os.cpu_count() or NA)
        with self._lock:
            if not self._primed and prime_s > 0:
                cpu = psutil.cpu_percent(interval=prime_s)
            elif not self._primed:
                psutil.cpu_percent(interval=None)
                cpu = NA
            else:
                cpu = psutil.cpu_percent(interval=None)
            self._primed = True
        try:
            vm = psutil.virtual_memory()
            mem = dict(mem_total=vm.total, mem_used=vm.total - vm.available, mem_available=vm.available,
                       mem_percent=vm.percent)
        except Exception:
            mem = {}
        try:
            load1 = os.getloadavg()[0]
        except (OSError, AttributeError):
            load1 = NA
        return HostSample(t=time.time(), cpu_percent=cpu, cpu_count=psutil.cpu_count() or NA, load1=load1,
                          **mem)


def host_sample(prime_s: float = 0.1) -> HostSample:
    """One host reading (blocks ``prime_s`` seconds to measure CPU use; 0 gives cpu_percent NA)."""
    return HostMonitor().sample(prime_s=prime_s)


# ---- JSON ---------------------------------------------------------------------------------------------------

def to_jsonable(obj: Any) -> Any:
    """Dataclasses, tuples and NA to plain JSON values (NA -> None)."""
    if obj is NA:
        return None
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj
