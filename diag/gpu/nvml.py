"""The NVML provider, over nvidia-ml-py (the ``pynvml`` module).

- Lazy, locked init: ``pynvml`` is imported and ``nvmlInit()`` called once per process, on the first
  call that needs it, under a lock; ``nvmlShutdown()`` runs at exit.
- A missing package, library or driver is one :class:`~diag.errors.DiagError` sentence with a hint
  (``ensure()``), or, for callers that asked not to fail, zero devices and ``reason``.
- Every field the driver cannot give is ``NA``. A field that answers NotSupported (or whose function
  the driver lacks: a driver older than the binding) is not asked again for that device, and is
  summarised once in ``notes()`` instead of per call.
- A GPU that answers "GPU is lost" is marked lost (``DeviceSample.lost``) and not queried again; the
  others keep updating.
- MIG instances are listed under their parent (``DeviceStatic.mig_devices``); their memory is sampled
  and their processes are attributed to them.
- ``visible_only=True`` honours ``CUDA_VISIBLE_DEVICES`` (indices, GPU-/MIG- UUIDs or prefixes).
- Processes NVML reports but ``/proc`` cannot see (another PID namespace: a container) are returned
  with ``visible=False``, and ``notes()`` suggests sharing the PID namespace.
"""
from __future__ import annotations

import atexit
import importlib
import os
import threading
from typing import Any

from diag.errors import DiagError
from diag.gpu.provider import (
    NA, DeviceSample, DeviceStatic, GpuProcess, MigSample, MigStatic, is_na, throttle_names,
)

# NVML return codes (the same numbers in every nvidia-ml-py release)
ERR_NOT_SUPPORTED = 3
ERR_NO_PERMISSION = 4
ERR_NOT_FOUND = 6
ERR_DRIVER_NOT_LOADED = 9
ERR_TIMEOUT = 10
ERR_LIBRARY_NOT_FOUND = 12
ERR_FUNCTION_NOT_FOUND = 13
ERR_GPU_IS_LOST = 15
ERR_RESET_REQUIRED = 16
ERR_LIB_RM_VERSION_MISMATCH = 18
ERR_NO_DATA = 21
ERR_GPU_NOT_FOUND = 28
ERR_UNKNOWN = 999

LOST_CODES = (ERR_GPU_IS_LOST, ERR_RESET_REQUIRED, ERR_GPU_NOT_FOUND)
UNSUPPORTED_CODES = (ERR_NOT_SUPPORTED, ERR_FUNCTION_NOT_FOUND, ERR_NO_DATA, ERR_NOT_FOUND)

SIM_HINT = "to try diag without a GPU: --simulate-gpus healthy-8 (or DIAG_SIMULATE_GPUS=healthy-8)"

NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1


def _code(e: BaseException) -> int | None:
    v = getattr(e, "value", None)
    return v if isinstance(v, int) else None


def _text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    return str(v)


def init_error(e: BaseException) -> DiagError:
    """One sentence and a hint for each way NVML can fail to start."""
    code = _code(e)
    if isinstance(e, ImportError):
        return DiagError("the nvidia-ml-py package (module pynvml) is not installed, so diag cannot read "
                         "GPU telemetry", hint=f"pip install nvidia-ml-py; {SIM_HINT}")
    if code == ERR_LIBRARY_NOT_FOUND:
        return DiagError("NVML (libnvidia-ml.so.1) was not found: no NVIDIA driver is installed or visible to "
                         "this process",
                         hint="install the NVIDIA driver (in a container: start it with --gpus all and the NVIDIA "
                              f"container toolkit); {SIM_HINT}")
    if code == ERR_DRIVER_NOT_LOADED:
        return DiagError("the NVIDIA driver is installed but not loaded (NVML: Driver Not Loaded)",
                         hint=f"load it (sudo modprobe nvidia) or reboot; nvidia-smi shows the same error; {SIM_HINT}")
    if code == ERR_NO_PERMISSION:
        return DiagError("this user may not talk to the NVIDIA driver (NVML: Insufficient Permissions)",
                         hint="check the permissions of /dev/nvidia* (or run where nvidia-smi works)")
    if code == ERR_LIB_RM_VERSION_MISMATCH:
        return DiagError("the NVML library and the loaded NVIDIA kernel driver have different versions "
                         "(a driver upgrade without a reboot?)",
                         hint="reboot, or reload the nvidia kernel module, so that both versions match")
    if code == ERR_FUNCTION_NOT_FOUND:
        return DiagError("the NVIDIA driver is too old for this nvidia-ml-py (NVML: Function Not Found at init)",
                         hint="upgrade the NVIDIA driver, or install an older nvidia-ml-py")
    return DiagError(f"NVML could not be initialised ({type(e).__name__}: {e})",
                     hint=f"run nvidia-smi to see whether the driver works; {SIM_HINT}")


class _Lib:
    """One NVML binding module, initialised lazily and once, under a lock."""

    def __init__(self, module=None, module_name: str = "pynvml"):
        self._module = module
        self._module_name = module_name
        self._lock = threading.Lock()
        self._ready = False
        self._error: DiagError | None = None

    def get(self):
        """The initialised module, or raise the (cached) DiagError."""
        if self._ready:
            return self._module
        with self._lock:
            if self._ready:
                return self._module
            if self._error is not None:
                raise self._error
            try:
                mod = self._module if self._module is not None else importlib.import_module(self._module_name)
                mod.nvmlInit()
            except ImportError as e:
                self._error = init_error(e)
                raise self._error from None
            except Exception as e:   # NVMLError subclasses and whatever a broken binding raises
                self._error = init_error(e)
                raise self._error from None
            self._module = mod
            self._ready = True
            atexit.register(self._shutdown)
            return mod

    def _shutdown(self) -> None:
        with self._lock:
            if self._ready:
                try:
                    self._module.nvmlShutdown()
                except Exception:
                    pass
                self._ready = False


_LIBS: dict[int, _Lib] = {}
_LIBS_LOCK = threading.Lock()


def _lib_for(module) -> _Lib:
    """The shared _Lib of a module object (``pynvml``, imported now, unless one is given). A failed
    import is not cached: installing nvidia-ml-py later in the same process works."""
    if module is None:
        try:
            module = importlib.import_module("pynvml")
        except ImportError as e:
            lib = _Lib(None)
            lib._error = init_error(e)
            return lib
    with _LIBS_LOCK:
        lib = _LIBS.get(id(module))
        if lib is None or lib._module is not module:
            lib = _LIBS[id(module)] = _Lib(module)
        return lib


class _Lost(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class _Dev:
    """Internal state of one physical device."""

    def __init__(self, static: DeviceStatic, handle, mig_handles: list):
        self.static = static
        self.handle = handle
        self.mig_handles = mig_handles
        self.lost: str | None = None


class NvmlProvider:
    """GPU telemetry from NVML. Thread-safe; see the module docstring."""

    name = "nvml"
    simulated = False
    scenario = None

    def __init__(self, module=None, visible_only: bool = False, pcie_throughput: bool = True,
                 cuda_visible_devices: str | None = None):
        self._lib = _lib_for(module)
        self._lock = threading.RLock()
        self.visible_only = visible_only
        self.pcie_throughput = pcie_throughput
        self._cvd = cuda_visible_devices if cuda_visible_devices is not None else os.environ.get("CUDA_VISIBLE_DEVICES")
        self._devs: list[_Dev] | None = None
        self._error: DiagError | None = None
        self._reason_extra: str | None = None
        self._unsupported: dict[tuple[int, str], str] = {}     # (nvml index, field) -> "unsupported"/"missing"
        self._errors: dict[str, str] = {}                       # field -> last unexpected error
        self._invisible: set[int] = set()
        self._psutil_cache: dict[int, Any] = {}
        self._driver: dict[str, Any] | None = None

    # ---- availability ----
    def ensure(self) -> "NvmlProvider":
        """Initialise now; raise DiagError (one sentence and a hint) when NVML cannot be used."""
        self._init()
        if self._error is not None:
            raise self._error
        return self

    @property
    def available(self) -> bool:
        self._init()
        return self._error is None

    @property
    def reason(self) -> str | None:
        self._init()
        if self._error is not None:
            return self._error.message
        if not self._devs:
            return self._reason_extra or "NVML reports no GPU on this machine"
        return None

    @property
    def hint(self) -> str | None:
        self._init()
        return self._error.hint if self._error is not None else None

    def _init(self) -> None:
        with self._lock:
            if self._devs is not None or self._error is not None:
                return
            try:
                nv = self._lib.get()
            except DiagError as e:
                self._error = e
                self._devs = []
                return
            try:
                self._devs = self._enumerate(nv)
            except Exception as e:
                self._error = init_error(e) if _code(e) in (ERR_LIBRARY_NOT_FOUND, ERR_DRIVER_NOT_LOADED,
                                                            ERR_LIB_RM_VERSION_MISMATCH, ERR_NO_PERMISSION) \
                    else DiagError(f"NVML could not list the GPUs ({type(e).__name__}: {e})",
                                   hint="run nvidia-smi to see whether the driver works")
                self._devs = []

    # ---- field access ----
    def _call(self, dev_key: int, field: str, fn_names: str | tuple[str, ...], *args, nv=None):
        """Call the first NVML function of ``fn_names`` that exists; NA when unsupported.
        Raises _Lost when the GPU is lost."""
        key = (dev_key, field)
        if key in self._unsupported:
            return NA
        nv = nv or self._lib.get()
        names = (fn_names,) if isinstance(fn_names, str) else fn_names
        fns = [f for f in (getattr(nv, n, None) for n in names) if f is not None]
        if not fns:
            self._unsupported[key] = "missing"
            return NA
        for k, fn in enumerate(fns):
            try:
                return fn(*args)
            except Exception as e:
                code = _code(e)
                if code in LOST_CODES:
                    raise _Lost(f"{_text(e) or 'GPU is lost'} (NVML error {code})") from None
                if code == ERR_FUNCTION_NOT_FOUND and k + 1 < len(fns):
                    continue          # an older driver: try the older name of the same call
                if code in UNSUPPORTED_CODES:
                    self._unsupported[key] = "missing" if code == ERR_FUNCTION_NOT_FOUND else "unsupported"
                    return NA
                self._errors[field] = f"{type(e).__name__}: {e}"
                return NA
        return NA

    # ---- enumeration ----
    def _enumerate(self, nv) -> list[_Dev]:
        count = nv.nvmlDeviceGetCount()
        devs: list[_Dev] = []
        for i in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(i)
            except Exception as e:
                code = _code(e)
                why = _text(e) or type(e).__name__
                st = DeviceStatic(index=i, name="(unavailable)", nvml_index=i)
                d = _Dev(st, None, [])
                d.lost = (f"GPU {i} is lost: {why} (NVML error {code}); the driver needs a reset or a reboot"
                          if code in LOST_CODES else f"GPU {i} cannot be opened: {why}")
                devs.append(d)
                continue
            try:
                st, migs = self._static(nv, i, handle)
                devs.append(_Dev(st, handle, migs))
            except _Lost as e:
                d = _Dev(DeviceStatic(index=i, name="(lost)", nvml_index=i), None, [])
                d.lost = e.message
                devs.append(d)
        if self.visible_only and self._cvd is not None:
            from diag.gpu.sampler import parse_visible_devices

            order = parse_visible_devices(self._cvd, [d.static for d in devs])
            chosen = []
            for new_index, old in enumerate(order or []):
                d = devs[old]
                d.static = _replace(d.static, index=new_index)
                chosen.append(d)
            if not chosen:
                self._reason_extra = (f"CUDA_VISIBLE_DEVICES={self._cvd!r} makes no GPU visible "
                                      f"(NVML sees {len(devs)})")
            devs = chosen
        return devs

    def _static(self, nv, i: int, h) -> tuple[DeviceStatic, list]:
        c = lambda field, fn, *a: self._call(i, field, fn, *a, nv=nv)  # noqa: E731
        name = c("name", "nvmlDeviceGetName", h)
        uuid = c("uuid", "nvmlDeviceGetUUID", h)
        pci = c("pci", "nvmlDeviceGetPciInfo", h)
        bus = NA if is_na(pci) else _text(getattr(pci, "busId", "") or getattr(pci, "busIdLegacy", ""))
        mem = c("memory", "nvmlDeviceGetMemoryInfo", h)
        cc = c("compute_capability", "nvmlDeviceGetCudaComputeCapability", h)
        plim = c("power_limit", ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"), h)
        pdef = c("default_power_limit", "nvmlDeviceGetPowerManagementDefaultLimit", h)
        mig_mode = c("mig_mode", "nvmlDeviceGetMigMode", h)
        current_mig = NA
        if not is_na(mig_mode):
            try:
                current_mig = bool(mig_mode[0])
            except (TypeError, IndexError):
                current_mig = bool(mig_mode)
        migs: list = []
        mig_statics: list[MigStatic] = []
        if current_mig is True:
            n = c("mig_count", "nvmlDeviceGetMaxMigDeviceCount", h)
            for j in range(0 if is_na(n) else int(n)):
                try:
                    mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
                except Exception as e:
                    if _code(e) in LOST_CODES:
                        raise _Lost(_text(e)) from None
                    continue     # an empty MIG slot answers NotFound
                k = 10_000 + 100 * i + j
                m_name = c_mig(self, k, "name", "nvmlDeviceGetName", mh, nv)
                m_uuid = c_mig(self, k, "uuid", "nvmlDeviceGetUUID", mh, nv)
                m_mem = c_mig(self, k, "memory", "nvmlDeviceGetMemoryInfo", mh, nv)
                gi = c_mig(self, k, "gi", "nvmlDeviceGetGpuInstanceId", mh, nv)
                ci = c_mig(self, k, "ci", "nvmlDeviceGetComputeInstanceId", mh, nv)
                profile = _text(m_name) if not is_na(m_name) else f"MIG {j}"
                if " MIG " in profile:
                    profile = profile.split(" MIG ", 1)[1]
                mig_statics.append(MigStatic(index=len(migs), uuid="" if is_na(m_uuid) else _text(m_uuid),
                                             name=profile, memory_total=NA if is_na(m_mem) else int(m_mem.total),
                                             gpu_instance_id=gi, compute_instance_id=ci))
                migs.append(mh)
        st = DeviceStatic(
            index=i, name="" if is_na(name) else _text(name), uuid="" if is_na(uuid) else _text(uuid), nvml_index=i,
            bus_id="" if is_na(bus) else bus,
            memory_total=NA if is_na(mem) else int(mem.total),
            compute_capability=NA if is_na(cc) else (int(cc[0]), int(cc[1])),
            power_limit_w=NA if is_na(plim) else plim / 1000.0,
            default_power_limit_w=NA if is_na(pdef) else pdef / 1000.0,
            pcie_gen=c("pcie_gen", "nvmlDeviceGetCurrPcieLinkGeneration", h),
            pcie_gen_max=c("pcie_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", h),
            pcie_width=c("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", h),
            pcie_width_max=c("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", h),
            mig_mode=current_mig, mig_devices=tuple(mig_statics), simulated=False,
        )
        return st, migs

    # ---- protocol ----
    def devices(self) -> list[DeviceStatic]:
        self._init()
        with self._lock:
            return [d.static for d in self._devs or []]

    def driver(self) -> dict[str, Any]:
        self._init()
        with self._lock:
            if self._driver is not None:
                return dict(self._driver)
            out: dict[str, Any] = {"driver_version": None, "cuda_driver_version": None, "nvml_version": None}
            if self._error is None:
                nv = self._lib.get()
                v = self._call(-1, "driver_version", "nvmlSystemGetDriverVersion", nv=nv)
                out["driver_version"] = None if is_na(v) else _text(v)
                v = self._call(-1, "cuda_version", ("nvmlSystemGetCudaDriverVersion_v2",
                                                    "nvmlSystemGetCudaDriverVersion"), nv=nv)
                if not is_na(v):
                    try:
                        v = int(v)
                        out["cuda_driver_version"] = f"{v // 1000}.{(v % 1000) // 10}"
                    except (TypeError, ValueError):
                        out["cuda_driver_version"] = _text(v)
                v = self._call(-1, "nvml_version", "nvmlSystemGetNVMLVersion", nv=nv)
                out["nvml_version"] = None if is_na(v) else _text(v)
            self._driver = out
            return dict(out)

    def sample(self) -> list[DeviceSample]:
        import time

        self._init()
        with self._lock:
            if self._error is not None or not self._devs:
                return []
            nv = self._lib.get()
            out = []
            for d in self._devs:
                t = time.time()
                if d.lost is None:
                    try:
                        out.append(self._sample(nv, d, t))
                        continue
                    except _Lost as e:
                        d.lost = (f"GPU {d.static.nvml_index} is lost: {e.message}; "
                                  "the driver needs a reset or a reboot")
                out.append(DeviceSample(index=d.static.index, t=t, lost=True, memory_total=d.static.memory_total,
                                        error=d.lost))
            return out

    def _sample(self, nv, d: _Dev, t: float) -> DeviceSample:
        i = d.static.nvml_index if d.static.nvml_index is not None else d.static.index
        h = d.handle
        c = lambda field, fn, *a: self._call(i, field, fn, *a, nv=nv)  # noqa: E731
        mem = c("memory", "nvmlDeviceGetMemoryInfo", h)
        util = c("utilization", "nvmlDeviceGetUtilizationRates", h)
        temp = c("temperature", "nvmlDeviceGetTemperature", h, getattr(nv, "NVML_TEMPERATURE_GPU", NVML_TEMPERATURE_GPU))
        power = c("power", "nvmlDeviceGetPowerUsage", h)
        sm = c("sm_clock", "nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_SM", NVML_CLOCK_SM))
        mclk = c("mem_clock", "nvmlDeviceGetClockInfo", h, getattr(nv, "NVML_CLOCK_MEM", NVML_CLOCK_MEM))
        rx = tx = NA
        if self.pcie_throughput:
            rx = c("pcie_rx", "nvmlDeviceGetPcieThroughput", h,
                   getattr(nv, "NVML_PCIE_UTIL_RX_BYTES", NVML_PCIE_UTIL_RX_BYTES))
            tx = c("pcie_tx", "nvmlDeviceGetPcieThroughput", h,
                   getattr(nv, "NVML_PCIE_UTIL_TX_BYTES", NVML_PCIE_UTIL_TX_BYTES))
        fan = c("fan", "nvmlDeviceGetFanSpeed", h)
        reasons = c("throttle", ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"), h)
        migs = []
        for j, mh in enumerate(d.mig_handles):
            k = 10_000 + 100 * i + j
            mm = c_mig(self, k, "memory", "nvmlDeviceGetMemoryInfo", mh, nv)
            migs.append(MigSample(index=j, memory_used=NA if is_na(mm) else int(mm.used),
                                  memory_total=NA if is_na(mm) else int(mm.total)))
        return DeviceSample(
            index=d.static.index, t=t, lost=False,
            gpu_util=NA if is_na(util) else _opt_int(getattr(util, "gpu", None)),
            mem_util=NA if is_na(util) else _opt_int(getattr(util, "memory", None)),
            memory_used=NA if is_na(mem) else int(mem.used),
            memory_total=NA if is_na(mem) else int(mem.total),
            temperature=temp, power_w=NA if is_na(power) else power / 1000.0,
            power_limit_w=d.static.power_limit_w, sm_clock_mhz=sm, mem_clock_mhz=mclk,
            pcie_rx_bps=NA if is_na(rx) else rx * 1024, pcie_tx_bps=NA if is_na(tx) else tx * 1024,
            fan_pct=fan, throttle=NA if is_na(reasons) else throttle_names(int(reasons)), mig=tuple(migs),
        )

    def processes(self) -> list[GpuProcess]:
        self._init()
        with self._lock:
            if self._error is not None or not self._devs:
                return []
            nv = self._lib.get()
            found: dict[tuple[int, int, int | None], dict] = {}
            for d in self._devs:
                if d.lost is not None:
                    continue
                i = d.static.nvml_index if d.static.nvml_index is not None else d.static.index
                targets = [(None, d.handle, i)] if not d.mig_handles else \
                    [(j, mh, 10_000 + 100 * i + j) for j, mh in enumerate(d.mig_handles)]
                for mig_index, h, key in targets:
                    for kind, fns in (("C", ("nvmlDeviceGetComputeRunningProcesses",)),
                                      ("G", ("nvmlDeviceGetGraphicsRunningProcesses",))):
                        try:
                            plist = self._call(key, f"processes_{kind}", fns, h, nv=nv)
                        except _Lost as e:
                            d.lost = f"GPU {i} is lost: {e.message}; the driver needs a reset or a reboot"
                            break
                        if is_na(plist) or not plist:
                            continue
                        for p in plist:
                            pid = int(getattr(p, "pid", 0))
                            mem = getattr(p, "usedGpuMemory", None)
                            k = (pid, d.static.index, mig_index)
                            rec = found.get(k)
                            if rec is None:
                                found[k] = {"pid": pid, "device": d.static.index, "mig": mig_index,
                                            "used_memory": NA if mem is None else int(mem), "type": kind}
                            else:
                                if kind not in rec["type"]:
                                    rec["type"] = "C+G"
                                if mem is not None and (is_na(rec["used_memory"]) or mem > rec["used_memory"]):
                                    rec["used_memory"] = int(mem)
            return [self._describe(rec) for rec in found.values()]

    def _describe(self, rec: dict) -> GpuProcess:
        """Add name, command, user, CPU and host memory from /proc (psutil)."""
        pid = rec["pid"]
        try:
            import psutil
        except ImportError:  # pragma: no cover
            return GpuProcess(**rec)
        proc = self._psutil_cache.get(pid)
        first = proc is None
        try:
            if proc is None:
                proc = psutil.Process(pid)
            with proc.oneshot():
                name = proc.name()
                try:
                    cmd = " ".join(proc.cmdline())
                except psutil.AccessDenied:
                    cmd = name
                try:
                    user = proc.username()
                except (psutil.AccessDenied, KeyError):
                    user = "?"
                try:
                    cpu = proc.cpu_percent(None)
                    cpu = NA if first else cpu
                except psutil.AccessDenied:
                    cpu = NA
                try:
                    rss = proc.memory_info().rss
                except psutil.AccessDenied:
                    rss = NA
            self._psutil_cache[pid] = proc
            return GpuProcess(**rec, visible=True, name=name, command=cmd, user=user, cpu_percent=cpu,
                              host_memory=rss)
        except psutil.NoSuchProcess:
            self._psutil_cache.pop(pid, None)
            self._invisible.add(pid)
            return GpuProcess(**rec, visible=False)
        except psutil.AccessDenied:
            return GpuProcess(**rec, visible=True, name="?", user="?")

    def notes(self) -> list[str]:
        with self._lock:
            out = []
            by_field: dict[tuple[str, str], set[int]] = {}
            for (dev, field), kind in self._unsupported.items():
                if dev < 0 or field.startswith("processes_G") or field in ("mig_mode", "mig_count"):
                    continue
                by_field.setdefault((field, kind), set()).add(dev % 10_000 if dev >= 10_000 else dev)
            unsupported = sorted(f for (f, k) in by_field if k == "unsupported")
            missing = sorted(f for (f, k) in by_field if k == "missing")
            if unsupported:
                out.append("not supported by this GPU/driver, shown as N/A: " + ", ".join(unsupported))
            if missing:
                out.append("the driver lacks these NVML functions (driver older than nvidia-ml-py), shown as N/A: "
                           + ", ".join(missing))
            for field, err in sorted(self._errors.items()):
                out.append(f"reading {field} failed ({err}); shown as N/A")
            if self._invisible:
                n = len(self._invisible)
                out.append(f"{n} process{'es' if n > 1 else ''} on the GPUs {'are' if n > 1 else 'is'} not visible "
                           "from this PID namespace (inside a container?): start the container with --pid=host "
                           "(docker) or shareProcessNamespace/hostPID (Kubernetes) to see names and users")
            for d in self._devs or []:
                if d.lost:
                    out.append(d.lost)
            return out

    def close(self) -> None:
        with self._lock:
            self._psutil_cache.clear()


def c_mig(provider: NvmlProvider, key: int, field: str, fn: str, handle, nv):
    try:
        return provider._call(key, field, fn, handle, nv=nv)
    except _Lost:
        return NA


def _opt_int(v):
    return NA if v is None else int(v)


def _replace(st: DeviceStatic, **kw) -> DeviceStatic:
    import dataclasses

    return dataclasses.replace(st, **kw)
