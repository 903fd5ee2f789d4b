"""A scripted stand-in for the ``pynvml`` module (nvidia-ml-py), for testing diag's NVML provider on
machines without a GPU. It mimics pynvml's surface: ``NVMLError`` with ``.value`` and one subclass per
code (``NVMLError_NotSupported``, ``NVMLError_GpuIsLost``, ...), the NVML_* constants, and the
functions diag calls, each answering from a scripted list of fake GPUs.

Scenarios are named after real failures (as gpustat's tests are):

- ``library_missing``       nvmlInit: NVML Shared Library Not Found (no driver installed)
- ``driver_not_loaded``     nvmlInit: Driver Not Loaded
- ``rm_version_mismatch``   nvmlInit: NVML/RM version mismatch (driver upgraded, no reboot)
- ``function_not_found``    a driver older than the binding: newer functions answer Function Not Found
- ``not_supported``         a datacenter board: no fan, no PCIe counters, no process memory (None)
- ``gpu_lost``              4 GPUs; ``lose(2)`` makes GPU 2 answer "GPU is lost" from then on
- ``gpu_lost_at_init``      GPU 1 is lost before diag starts (handle lookup fails)
- ``pid_not_in_proc``       a process NVML reports but /proc cannot see (container), plus our own pid
- ``mig``                   GPU 0 in MIG mode (2 instances, one empty slot), GPU 1 plain
- ``zero_devices``          the driver works but reports no GPU
- ``healthy``               2 plain GPUs under load
"""
from __future__ import annotations

import os
import types
from dataclasses import dataclass, field

NVML_SUCCESS = 0
CODES = {
    "Uninitialized": 1, "InvalidArgument": 2, "NotSupported": 3, "NoPermission": 4, "AlreadyInitialized": 5,
    "NotFound": 6, "InsufficientSize": 7, "InsufficientPower": 8, "DriverNotLoaded": 9, "Timeout": 10,
    "IrqIssue": 11, "LibraryNotFound": 12, "FunctionNotFound": 13, "CorruptedInforom": 14, "GpuIsLost": 15,
    "ResetRequired": 16, "OperatingSystem": 17, "LibRmVersionMismatch": 18, "InUse": 19, "Memory": 20,
    "NoData": 21, "Unknown": 999,
}
STRINGS = {
    3: "Not Supported", 6: "Not Found", 9: "Driver Not Loaded", 12: "NVML Shared Library Not Found",
    13: "Function Not Found", 15: "GPU is lost", 18: "RM has detected an NVML/RM version mismatch.",
    999: "Unknown Error",
}

MiB = 1 << 20


@dataclass
class FakeMig:
    name: str = "NVIDIA A100-SXM4-40GB MIG 3g.20gb"
    uuid: str = "MIG-11111111-2222-3333-4444-555555555555"
    total: int = 19968 * MiB
    used: int = 12000 * MiB
    gi: int = 1
    ci: int = 0
    processes: list = field(default_factory=list)      # [(pid, used bytes or None)]


@dataclass
class FakeGpu:
    name: str = "NVIDIA A100-SXM4-80GB"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: str = "00000000:07:00.0"
    total: int = 81920 * MiB
    used: int = 40000 * MiB
    util: int = 87
    mem_util: int = 41
    temp: int = 61
    power_mw: int = 312_000
    limit_mw: int = 400_000
    default_limit_mw: int = 400_000
    sm: int = 1410
    mem_clock: int = 1593
    pcie: tuple = (4, 4, 16, 16)          # gen, gen max, width, width max
    rx_kb: int = 1_200_000
    tx_kb: int = 90_000
    fan: int = 45
    reasons: int = 0
    cc: tuple = (8, 0)
    mig: list | None = None               # FakeMig list (None: MIG not supported, []: disabled)
    mig_slots: int = 7
    processes: list = field(default_factory=list)      # [(pid, used bytes or None)]
    graphics: list = field(default_factory=list)
    unsupported: set = field(default_factory=set)      # function names answering NotSupported
    lost: bool = False
    lost_at_init: bool = False


class FakeNvml:
    """Holds the script; ``module()`` returns the pynvml-like module; ``calls`` counts calls."""

    def __init__(self, gpus: list[FakeGpu], init_error: str | None = None, missing: set | None = None,
                 driver: str = "550.54.15", cuda: int = 12040):
        self.gpus = gpus
        self.init_error = init_error
        self.missing = set(missing or ())         # functions the "driver" lacks: Function Not Found
        self.driver = driver
        self.cuda = cuda
        self.calls: dict[str, int] = {}
        self.inits = 0
        self.shutdowns = 0

    def lose(self, index: int) -> None:
        self.gpus[index].lost = True

    # ---- the module ----
    def module(self) -> types.ModuleType:
        m = types.ModuleType("pynvml")
        fake = self

        class NVMLError(Exception):
            _map: dict = {}

            def __new__(cls, value):
                if cls is NVMLError:
                    cls = NVMLError._map.get(value, cls)
                obj = Exception.__new__(cls)
                obj.value = value
                return obj

            def __init__(self, value):
                super().__init__(value)
                self.value = value

            def __str__(self):
                return STRINGS.get(self.value, f"NVML Error with code {self.value}")

        m.NVMLError = NVMLError
        for name, code in CODES.items():
            sub = type(f"NVMLError_{name}", (NVMLError,), {})
            NVMLError._map[code] = sub
            setattr(m, f"NVMLError_{name}", sub)
            setattr(m, "NVML_ERROR_" + "".join("_" + c if c.isupper() else c for c in name).upper().lstrip("_"), code)
        m.NVML_SUCCESS = NVML_SUCCESS
        m.NVML_TEMPERATURE_GPU = 0
        m.NVML_CLOCK_SM = 1
        m.NVML_CLOCK_MEM = 2
        m.NVML_PCIE_UTIL_TX_BYTES = 0
        m.NVML_PCIE_UTIL_RX_BYTES = 1

        def err(code):
            return NVMLError(code)

        def fn(name):
            def deco(f):
                def wrapper(*args):
                    fake.calls[name] = fake.calls.get(name, 0) + 1
                    if name in fake.missing:
                        raise err(CODES["FunctionNotFound"])
                    if args and isinstance(args[0], _Handle):
                        h = args[0]
                        gpu = h.gpu
                        if gpu.lost:
                            raise err(CODES["GpuIsLost"])
                        if name in gpu.unsupported:
                            raise err(CODES["NotSupported"])
                    return f(*args)
                wrapper.__name__ = name
                setattr(m, name, wrapper)
                return wrapper
            return deco

        @fn("nvmlInit")
        def _init():
            fake.inits += 1
            if fake.init_error:
                raise err(CODES[fake.init_error])

        @fn("nvmlShutdown")
        def _shutdown():
            fake.shutdowns += 1

        @fn("nvmlSystemGetDriverVersion")
        def _drv():
            return fake.driver

        @fn("nvmlSystemGetCudaDriverVersion")
        def _cuda():
            return fake.cuda

        @fn("nvmlSystemGetCudaDriverVersion_v2")
        def _cuda2():
            return fake.cuda

        @fn("nvmlSystemGetNVMLVersion")
        def _nvmlv():
            return "12.550.54.15"

        @fn("nvmlDeviceGetCount")
        def _count():
            return len(fake.gpus)

        @fn("nvmlDeviceGetHandleByIndex")
        def _handle(i):
            if i >= len(fake.gpus):
                raise err(CODES["InvalidArgument"])
            g = fake.gpus[i]
            if g.lost_at_init or g.lost:
                raise err(CODES["GpuIsLost"])
            return _Handle(g, None)

        def attr(name, getter):
            fn(name)(getter)

        attr("nvmlDeviceGetName", lambda h: h.mig.name if h.mig else h.gpu.name)
        attr("nvmlDeviceGetUUID", lambda h: h.mig.uuid if h.mig else h.gpu.uuid)
        attr("nvmlDeviceGetPciInfo", lambda h: types.SimpleNamespace(busId=h.gpu.bus_id))
        attr("nvmlDeviceGetMemoryInfo",
             lambda h: types.SimpleNamespace(total=(h.mig or h.gpu).total, used=(h.mig or h.gpu).used,
                                             free=(h.mig or h.gpu).total - (h.mig or h.gpu).used))
        attr("nvmlDeviceGetCudaComputeCapability", lambda h: h.gpu.cc)
        attr("nvmlDeviceGetEnforcedPowerLimit", lambda h: h.gpu.limit_mw)
        attr("nvmlDeviceGetPowerManagementLimit", lambda h: h.gpu.limit_mw)
        attr("nvmlDeviceGetPowerManagementDefaultLimit", lambda h: h.gpu.default_limit_mw)
        attr("nvmlDeviceGetCurrPcieLinkGeneration", lambda h: h.gpu.pcie[0])
        attr("nvmlDeviceGetMaxPcieLinkGeneration", lambda h: h.gpu.pcie[1])
        attr("nvmlDeviceGetCurrPcieLinkWidth", lambda h: h.gpu.pcie[2])
        attr("nvmlDeviceGetMaxPcieLinkWidth", lambda h: h.gpu.pcie[3])

        def _mig_mode(h):
            if h.gpu.mig is None:
                raise err(CODES["NotSupported"])
            on = 1 if h.gpu.mig else 0
            return [on, on]

        attr("nvmlDeviceGetMigMode", _mig_mode)
        attr("nvmlDeviceGetMaxMigDeviceCount", lambda h: h.gpu.mig_slots)

        def _mig_handle(h, j):
            migs = h.gpu.mig or []
            if j >= len(migs) or migs[j] is None:
                raise err(CODES["NotFound"])
            return _Handle(h.gpu, migs[j])

        attr("nvmlDeviceGetMigDeviceHandleByIndex", _mig_handle)
        attr("nvmlDeviceGetGpuInstanceId", lambda h: h.mig.gi)
        attr("nvmlDeviceGetComputeInstanceId", lambda h: h.mig.ci)

        def _util(h):
            if h.gpu.mig:
                raise err(CODES["NotSupported"])      # NVML gives no utilisation in MIG mode
            return types.SimpleNamespace(gpu=h.gpu.util, memory=h.gpu.mem_util)

        attr("nvmlDeviceGetUtilizationRates", _util)
        attr("nvmlDeviceGetTemperature", lambda h, sensor: h.gpu.temp)
        attr("nvmlDeviceGetPowerUsage", lambda h: h.gpu.power_mw)
        attr("nvmlDeviceGetClockInfo", lambda h, kind: h.gpu.sm if kind == 1 else h.gpu.mem_clock)
        attr("nvmlDeviceGetPcieThroughput", lambda h, counter: h.gpu.rx_kb if counter == 1 else h.gpu.tx_kb)
        attr("nvmlDeviceGetFanSpeed", lambda h: h.gpu.fan)
        attr("nvmlDeviceGetCurrentClocksEventReasons", lambda h: h.gpu.reasons)
        attr("nvmlDeviceGetCurrentClocksThrottleReasons", lambda h: h.gpu.reasons)

        def _procs(plist):
            return [types.SimpleNamespace(pid=pid, usedGpuMemory=mem, gpuInstanceId=0xFFFFFFFF,
                                          computeInstanceId=0xFFFFFFFF) for pid, mem in plist]

        attr("nvmlDeviceGetComputeRunningProcesses",
             lambda h: _procs(h.mig.processes if h.mig else h.gpu.processes))
        attr("nvmlDeviceGetGraphicsRunningProcesses", lambda h: _procs([] if h.mig else h.gpu.graphics))
        return m


class _Handle:
    def __init__(self, gpu: FakeGpu, mig: FakeMig | None):
        self.gpu = gpu
        self.mig = mig


# ---- scenarios named after real failures ------------------------------------------------------------

def _gpu(i: int, **kw) -> FakeGpu:
    kw.setdefault("uuid", f"GPU-{i:08d}-aaaa-bbbb-cccc-{i:012d}")
    kw.setdefault("bus_id", f"00000000:{0x07 + i:02X}:00.0")
    return FakeGpu(**kw)


def healthy() -> FakeNvml:
    return FakeNvml([_gpu(0, processes=[(os.getpid(), 39000 * MiB)]), _gpu(1, util=91, used=41000 * MiB)])


def library_missing() -> FakeNvml:
    return FakeNvml([], init_error="LibraryNotFound")


def driver_not_loaded() -> FakeNvml:
    return FakeNvml([], init_error="DriverNotLoaded")


def rm_version_mismatch() -> FakeNvml:
    return FakeNvml([], init_error="LibRmVersionMismatch")


def function_not_found() -> FakeNvml:
    """An old driver under a new binding: the clock-event and newer CUDA-version calls are missing."""
    return FakeNvml([_gpu(0)], missing={"nvmlDeviceGetCurrentClocksEventReasons",
                                        "nvmlDeviceGetCurrentClocksThrottleReasons",
                                        "nvmlSystemGetCudaDriverVersion_v2",
                                        "nvmlDeviceGetPowerManagementDefaultLimit"})


def not_supported() -> FakeNvml:
    """A datacenter board: no fan, no PCIe counters; process memory unavailable (None)."""
    return FakeNvml([_gpu(0, name="NVIDIA H100 80GB HBM3", unsupported={"nvmlDeviceGetFanSpeed",
                                                                       "nvmlDeviceGetPcieThroughput",
                                                                       "nvmlDeviceGetPowerUsage"},
                          processes=[(os.getpid(), None)])])


def gpu_lost() -> FakeNvml:
    return FakeNvml([_gpu(i, processes=[(os.getpid(), 30000 * MiB)]) for i in range(4)])


def gpu_lost_at_init() -> FakeNvml:
    return FakeNvml([_gpu(0), _gpu(1, lost_at_init=True), _gpu(2)])


def nonexistent_pid() -> int:
    """A pid no process here has (as a pid from another PID namespace looks from inside a container)."""
    import psutil

    pid = 4_194_000
    while psutil.pid_exists(pid):
        pid -= 1
    return pid


def pid_not_in_proc() -> FakeNvml:
    return FakeNvml([_gpu(0, processes=[(os.getpid(), 1000 * MiB), (nonexistent_pid(), 20000 * MiB)])])


def mig() -> FakeNvml:
    migs = [FakeMig(processes=[(os.getpid(), 11000 * MiB)]),
            FakeMig(name="NVIDIA A100-SXM4-40GB MIG 1g.5gb", uuid="MIG-99999999-8888-7777-6666-555555555555",
                    total=4864 * MiB, used=100 * MiB, gi=9), None]
    return FakeNvml([_gpu(0, name="NVIDIA A100-SXM4-40GB", total=40960 * MiB, used=12100 * MiB, mig=migs),
                     _gpu(1, name="NVIDIA A100-SXM4-40GB", total=40960 * MiB, mig=[])])


def zero_devices() -> FakeNvml:
    return FakeNvml([])


SCENARIOS = {f.__name__: f for f in (healthy, library_missing, driver_not_loaded, rm_version_mismatch,
                                     function_not_found, not_supported, gpu_lost, gpu_lost_at_init,
                                     pid_not_in_proc, mig, zero_devices)}
