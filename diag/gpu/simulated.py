"""Simulated GPUs: named scenarios whose values vary plausibly over time.

Selected by ``--simulate-gpus SCENARIO`` or ``DIAG_SIMULATE_GPUS``. Every value is a pure function of
(scenario, seed, elapsed time): with an injected clock the same calls give the same numbers, so tests
and snapshot tests are stable. Everything a simulated provider returns carries ``simulated=True``
and every output that shows it says "simulated".

Scenarios (``SCENARIOS``):

=============  ==================================================================================
healthy-8      8 x H100 80GB under DDP training: 93-99% busy, ~78% memory, no throttling
imbalance      4 x A100 80GB, the DataParallel pattern: GPU 0 busy with 2.5x the memory of the
               others, GPUs 1-2 half busy, GPU 3 idle
lost           4 x A100 40GB training; GPU 2 is lost (NVML "GPU is lost") 4 s after the start
none           a node without GPUs (zero devices, with the reason)
mig            2 x A100 40GB: GPU 0 in MIG mode (3g.20gb, 2g.10gb, 1g.5gb instances), GPU 1 plain
throttling     4 x RTX A6000: GPU 1 thermal slowdown (87-91 °C, SM clock cut to ~60%),
               GPU 2 at its power cap, GPUs 0 and 3 fine
starved        2 x L4 waiting for data: 20-45% busy with deep dips
container      1 x H100 whose processes live in another PID namespace (not visible in /proc)
=============  ==================================================================================
"""
from __future__ import annotations

import math
import threading
import time
import uuid as _uuid
from dataclasses import dataclass
from typing import Any, Callable

from diag.errors import DiagError
from diag.gpu.provider import (
    NA, DeviceSample, DeviceStatic, GpuProcess, HostSample, MigSample, MigStatic,
)

MiB = 1 << 20
GiB = 1 << 30

WARMUP_S = 3.0          # memory climbs and utilisation starts over the first seconds
STEP_PERIOD_S = 0.9     # the rhythm of a simulated training step
LOST_AFTER_S = 4.0      # the "lost" scenario loses its GPU this long after the start


@dataclass(frozen=True)
class GpuModel:
    name: str
    memory_mib: int
    cc: tuple[int, int]
    power_limit_w: float
    idle_power_w: float
    pcie_gen: int
    sm_clock_max: int
    mem_clock: int
    has_fan: bool = False
    temp_idle: float = 32.0
    temp_load: float = 64.0


H100 = GpuModel("NVIDIA H100 80GB HBM3", 81559, (9, 0), 700.0, 72.0, 5, 1980, 2619)
A100_80 = GpuModel("NVIDIA A100-SXM4-80GB", 81920, (8, 0), 400.0, 58.0, 4, 1410, 1593)
A100_40 = GpuModel("NVIDIA A100-SXM4-40GB", 40960, (8, 0), 400.0, 55.0, 4, 1410, 1215)
A6000 = GpuModel("NVIDIA RTX A6000", 49140, (8, 6), 300.0, 24.0, 4, 1800, 8001, has_fan=True,
                 temp_idle=36.0, temp_load=72.0)
L4 = GpuModel("NVIDIA L4", 23034, (8, 9), 72.0, 16.0, 4, 2040, 6251, temp_idle=34.0, temp_load=58.0)


@dataclass(frozen=True)
class SimProc:
    name: str = "python"
    command: str = "python train.py"
    user: str = "alice"
    share: float = 0.97         # of the device's (or MIG instance's) used memory
    run: bool = True            # belongs to the run diag is watching (bound to its pid when known)
    visible: bool = True


@dataclass(frozen=True)
class SimMig:
    profile: str
    memory_mib: int
    load: float
    mem_frac: float


@dataclass(frozen=True)
class SimDevice:
    load: float = 0.96              # mean utilisation, 0-1
    mem_frac: float = 0.78          # memory used at steady state, share of the total
    pattern: str = "train"          # train | starved | idle
    throttle: str | None = None     # thermal | power
    lost_after: float | None = None
    mig: tuple[SimMig, ...] = ()
    procs: tuple[SimProc, ...] = (SimProc(),)


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    model: GpuModel | None
    devices: tuple[SimDevice, ...] = ()
    reason: str | None = None       # for a node without GPUs
    driver_version: str = "550.54.15"
    cuda_driver_version: str = "12.4"


def _ranks(n: int, **kw) -> tuple[SimDevice, ...]:
    return tuple(SimDevice(procs=(SimProc(command=f"python train.py  # rank {i}"),), **kw) for i in range(n))


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("healthy-8", "a healthy 8-GPU node under DDP training", H100, _ranks(8)),
    Scenario("imbalance", "DataParallel on 4 GPUs: GPU 0 overloaded, GPU 3 idle", A100_80, (
        SimDevice(load=0.97, mem_frac=0.88, procs=(SimProc(command="python train.py --data-parallel"),)),
        SimDevice(load=0.46, mem_frac=0.34, procs=(SimProc(command="python train.py --data-parallel"),)),
        SimDevice(load=0.41, mem_frac=0.34, procs=(SimProc(command="python train.py --data-parallel"),)),
        SimDevice(load=0.0, mem_frac=0.006, pattern="idle",
                  procs=(SimProc(command="python train.py --data-parallel"),)),
    )),
    Scenario("lost", "4 GPUs training; GPU 2 falls off the bus mid-run", A100_40, (
        SimDevice(), SimDevice(), SimDevice(lost_after=LOST_AFTER_S), SimDevice(),
    )),
    Scenario("none", "a node without GPUs", None, (),
             reason="this simulated node has no GPUs (scenario 'none')"),
    Scenario("mig", "A100 split into MIG instances next to a plain A100", A100_40, (
        SimDevice(mem_frac=0.0, mig=(SimMig("3g.20gb", 19968, 0.92, 0.81), SimMig("2g.10gb", 9856, 0.55, 0.62),
                                     SimMig("1g.5gb", 4864, 0.0, 0.0)),
                  procs=(SimProc(command="python train.py --mig 0", user="alice"),
                         SimProc(command="python serve.py", user="bob", run=False))),
        SimDevice(load=0.94, mem_frac=0.71),
    )),
    Scenario("throttling", "4 workstation GPUs: one too hot, one at its power cap", A6000, (
        SimDevice(load=0.95, mem_frac=0.74),
        SimDevice(load=0.95, mem_frac=0.74, throttle="thermal"),
        SimDevice(load=0.97, mem_frac=0.74, throttle="power"),
        SimDevice(load=0.95, mem_frac=0.74),
    )),
    Scenario("starved", "2 GPUs starved by a slow input pipeline", L4, (
        SimDevice(load=0.32, mem_frac=0.55, pattern="starved"),
        SimDevice(load=0.30, mem_frac=0.55, pattern="starved"),
    )),
    Scenario("container", "a GPU whose processes live in another PID namespace", H100, (
        SimDevice(procs=(SimProc(visible=False), SimProc(command="python eval.py", share=0.0, visible=False,
                                                           run=False))),
    )),
)}


def scenario_names() -> list[str]:
    return list(SCENARIOS)


def get_scenario(name: str) -> Scenario:
    key = (name or "").strip().lower()
    if key not in SCENARIOS:
        raise DiagError(f"unknown GPU simulation scenario {name!r}; choose one of: {', '.join(SCENARIOS)}")
    return SCENARIOS[key]


# ---- deterministic noise --------------------------------------------------------------------------

_M64 = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64 finaliser: a fast, well-spread integer hash."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def _rand(seed: int, dev: int, fld: int, k: int) -> float:
    """Uniform in [-1, 1], a pure function of its arguments."""
    h = _mix((seed * 0x100000001B3) ^ (dev << 40) ^ (fld << 32) ^ (k & 0xFFFFFFFF))
    return (h >> 11) * (2.0 / (1 << 53)) - 1.0


def noise(seed: int, dev: int, fld: int, x: float) -> float:
    """Smooth value noise in [-1, 1]: random knots at integer x, smoothstep in between."""
    k = math.floor(x)
    f = x - k
    f = f * f * (3 - 2 * f)
    a = _rand(seed, dev, fld, k)
    b = _rand(seed, dev, fld, k + 1)
    return a + (b - a) * f


def _clamp(v: float, lo: float, hi: float) -> float:
    return lo if v < lo else hi if v > hi else v


# ---- the provider -----------------------------------------------------------------------------------

class SimulatedProvider:
    """Simulated telemetry for one scenario. Thread-safe.

    ``clock`` (seconds, monotonic) and ``epoch`` (the unix time at elapsed 0) can be injected for
    reproducible output; ``start`` shifts the timeline (``diag gpus`` uses 120 s to show the steady
    state). ``bind_run(pid)`` gives the run's simulated processes a real pid (the sampler does this
    during ``diag check`` so that "devices used by the run" can be told apart).
    """

    name = "simulated"
    simulated = True

    def __init__(self, scenario: str, seed: int = 0, clock: Callable[[], float] | None = None,
                 start: float = 0.0, epoch: float | None = None):
        self.spec = get_scenario(scenario)
        self.scenario = self.spec.name
        self.seed = int(seed)
        self._clock = clock or time.monotonic
        self._t0 = self._clock() - float(start)
        self._epoch = time.time() - float(start) if epoch is None else float(epoch)
        self._lock = threading.Lock()
        self._run_pid: int | None = None
        self._statics = self._build_statics()

    # ---- protocol ----
    @property
    def reason(self) -> str | None:
        return self.spec.reason if not self.spec.devices else None

    def elapsed(self) -> float:
        return self._clock() - self._t0

    def bind_run(self, pid: int | None) -> None:
        with self._lock:
            self._run_pid = pid

    def devices(self) -> list[DeviceStatic]:
        return list(self._statics)

    def driver(self) -> dict[str, Any]:
        return {"driver_version": f"{self.spec.driver_version} (simulated)",
                "cuda_driver_version": self.spec.cuda_driver_version, "nvml_version": None}

    def notes(self) -> list[str]:
        out = [f"GPU values are simulated (scenario '{self.scenario}': {self.spec.description})"]
        hidden = sum(1 for d in self.spec.devices for p in d.procs if not p.visible)
        if hidden:
            out.append(f"{hidden} process{'es' if hidden > 1 else ''} on the GPUs {'are' if hidden > 1 else 'is'} not "
                       "visible from this PID namespace (inside a container?): start the container with --pid=host "
                       "(docker) or shareProcessNamespace/hostPID (Kubernetes) to see names and users")
        return out

    def close(self) -> None:
        pass

    def sample(self) -> list[DeviceSample]:
        e = self.elapsed()
        t = self._epoch + e
        return [self._sample_device(i, d, e, t) for i, d in enumerate(self.spec.devices)]

    def processes(self) -> list[GpuProcess]:
        e = self.elapsed()
        t = self._epoch + e
        out: list[GpuProcess] = []
        with self._lock:
            run_pid = self._run_pid
        for i, d in enumerate(self.spec.devices):
            s = self._sample_device(i, d, e, t)
            if s.lost:
                continue
            slots: list[tuple[int | None, float]] = []
            if d.mig:
                slots = [(m.index, _num(m.memory_used)) for m in s.mig if _num(m.memory_used) > 64 * MiB]
            else:
                slots = [(None, _num(s.memory_used))]
            for j, p in enumerate(d.procs):
                mig_index, used = slots[j % len(slots)] if slots else (None, 0.0)
                if d.mig and j >= len(slots):
                    continue
                # a pid from another namespace (container) can never match the run's own pids
                pid = run_pid if (p.run and run_pid and p.visible) else 4100 + 37 * i + j
                mem = int(used * p.share) // MiB * MiB if p.share else 300 * MiB
                out.append(GpuProcess(
                    pid=pid, device=i, mig=mig_index, used_memory=mem, type="C", visible=p.visible,
                    name=p.name if p.visible else "", command=p.command if p.visible else "",
                    user=p.user if p.visible else "",
                    cpu_percent=round(_clamp(98 + 6 * noise(self.seed, i, 90 + j, e / 2), 0, 400), 1)
                    if p.visible else NA,
                    host_memory=int((5.5 + 0.3 * noise(self.seed, i, 95 + j, e / 5)) * GiB) if p.visible else NA,
                    simulated=True,
                ))
        return out

    def host(self) -> HostSample:
        """A deterministic host reading to go with the scenario (for snapshot tests; the sampler uses
        the real host by default)."""
        e = self.elapsed()
        n = max(len(self.spec.devices), 1)
        busy = sum(d.load for d in self.spec.devices) / n if self.spec.devices else 0.02
        cpus = 16 * n if self.spec.devices else 8
        total = 128 * GiB * n if self.spec.devices else 32 * GiB
        used = total * (0.18 + 0.25 * busy + 0.01 * noise(self.seed, 99, 1, e / 4))
        return HostSample(t=self._epoch + e, cpu_percent=round(_clamp(100 * (0.1 + 0.45 * busy)
                                                                        + 4 * noise(self.seed, 99, 0, e), 0, 100), 1),
                          cpu_count=cpus, load1=round(cpus * (0.1 + 0.45 * busy), 2), mem_total=total,
                          mem_used=int(used), mem_available=int(total - used),
                          mem_percent=round(100 * used / total, 1))

    # ---- internals ----
    def _build_statics(self) -> list[DeviceStatic]:
        m = self.spec.model
        out = []
        for i, d in enumerate(self.spec.devices):
            assert m is not None
            migs = tuple(
                MigStatic(index=j, uuid=self._uuid("MIG", i, j), name=mg.profile, memory_total=mg.memory_mib * MiB,
                          gpu_instance_id=j + 1, compute_instance_id=0)
                for j, mg in enumerate(d.mig))
            out.append(DeviceStatic(
                index=i, name=m.name, uuid=self._uuid("GPU", i), nvml_index=None,
                bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
                memory_total=m.memory_mib * MiB, compute_capability=m.cc, power_limit_w=m.power_limit_w,
                default_power_limit_w=m.power_limit_w, pcie_gen=m.pcie_gen, pcie_gen_max=m.pcie_gen,
                pcie_width=16, pcie_width_max=16, mig_mode=bool(d.mig), mig_devices=migs, simulated=True,
            ))
        return out

    def _uuid(self, kind: str, i: int, j: int = 0) -> str:
        code = {"GPU": 1, "MIG": 2}.get(kind, 3)
        key = sum(ord(c) for c in self.scenario) * 131 + len(self.scenario)
        hi = _mix((self.seed << 20) ^ (code << 16) ^ (i << 8) ^ j)
        lo = _mix(key ^ (i << 24) ^ (j << 12) ^ code)
        return f"{kind}-{_uuid.UUID(int=((hi << 64) | lo) & ((1 << 128) - 1))}"

    def _sample_device(self, i: int, d: SimDevice, e: float, t: float) -> DeviceSample:
        m = self.spec.model
        assert m is not None
        st = self._statics[i]
        total = m.memory_mib * MiB
        if d.lost_after is not None and e >= d.lost_after:
            return DeviceSample(index=i, t=t, lost=True, memory_total=total,
                                error="GPU is lost (simulated NVML_ERROR_GPU_IS_LOST); "
                                      "the driver needs a reset or a reboot")
        seed = self.seed
        warm = _clamp(e / WARMUP_S, 0.0, 1.0)
        active = e > 0.8   # the script imports and builds before the GPU gets work
        # utilisation
        if d.pattern == "idle" or not active:
            util = _clamp(0.6 + 0.8 * noise(seed, i, 1, e * 1.5), 0, 100)
        elif d.pattern == "starved":
            wave = 0.5 + 0.5 * math.sin(2 * math.pi * e / (STEP_PERIOD_S * 3) + i)
            util = _clamp(100 * d.load + 14 * (wave - 0.5) * 2 + 6 * noise(seed, i, 1, e * 2), 0, 100)
        else:
            util = _clamp(100 * d.load * min(1.0, 0.4 + warm) + 2.5 * math.sin(2 * math.pi * e / STEP_PERIOD_S + i)
                          + 2.0 * noise(seed, i, 1, e * 2), 0, 100)
        util = round(util)
        # memory
        ctx = 512 * MiB
        if d.mig:
            mig_samples = []
            used = 0
            for j, mg in enumerate(d.mig):
                mt = mg.memory_mib * MiB
                mu = 0 if mg.mem_frac <= 0 else ctx + (mg.mem_frac * mt - ctx) * warm \
                    + 0.004 * mt * noise(seed, i, 20 + j, e / 2)
                mu = int(_clamp(mu, 0, mt)) // MiB * MiB
                used += mu
                mig_samples.append(MigSample(index=j, memory_used=mu, memory_total=mt))
            mig = tuple(mig_samples)
            load = sum(mg.load for mg in d.mig) / len(d.mig)
            util_v: Any = NA          # NVML cannot give utilisation for a GPU in MIG mode
            mem_util_v: Any = NA
        else:
            mig = ()
            target = max(d.mem_frac * total, 4 * MiB)
            if d.pattern == "idle" and d.mem_frac < 0.02:
                used = target
            else:
                used = ctx + (target - ctx) * (warm if active else 0.0) + 0.004 * total * noise(seed, i, 2, e / 2)
            used = int(_clamp(used, 0, total)) // MiB * MiB
            load = util / 100
            util_v = util
            mem_util_v = round(_clamp(util * (0.45 + 0.1 * noise(seed, i, 3, e)), 0, 100))
        # power, temperature, clocks
        busy = load if d.mig else util / 100
        power = m.idle_power_w + (m.power_limit_w - m.idle_power_w) * (0.85 * busy) \
            + 0.02 * m.power_limit_w * noise(seed, i, 4, e * 1.3)
        temp = m.temp_idle + (m.temp_load - m.temp_idle) * busy * _clamp(e / 8.0, 0.3, 1.0) \
            + 1.2 * noise(seed, i, 5, e / 3)
        sm = m.sm_clock_max * (0.97 + 0.02 * noise(seed, i, 6, e)) if busy > 0.05 else 345.0
        reasons: tuple[str, ...] = () if busy > 0.05 else ("gpu_idle",)
        if d.throttle == "thermal" and active:
            hot = 83.0 + 6.0 * warm + 3.0 * math.sin(2 * math.pi * e / 10.0 + i) + 0.8 * noise(seed, i, 5, e)
            temp = temp + (hot - temp) * _clamp((e - 0.8) / 2.0, 0.0, 1.0)    # heats up over 2 s
            if temp >= 84.0:
                reasons = ("sw_thermal",) + (("hw_thermal",) if temp >= 89.0 else ())
                sm = m.sm_clock_max * (0.6 + 0.04 * noise(seed, i, 6, e))
        elif d.throttle == "power" and active:
            power = m.power_limit_w * (0.985 + 0.012 * noise(seed, i, 4, e * 1.3))
            if power >= 0.975 * m.power_limit_w:
                reasons = ("sw_power_cap",)
                sm = m.sm_clock_max * (0.86 + 0.03 * noise(seed, i, 6, e))
        power = _clamp(power, m.idle_power_w * 0.8, m.power_limit_w)
        fan: Any = NA
        if m.has_fan:
            fan = round(_clamp(30 + 1.1 * (temp - m.temp_idle), 30, 100))
        rx = (1.4e9 + 0.6e9 * noise(seed, i, 7, e * 2)) * busy + 2e5
        tx = (1.5e8 + 0.5e8 * noise(seed, i, 8, e * 2)) * busy + 1e5
        return DeviceSample(
            index=i, t=t, lost=False, gpu_util=util_v, mem_util=mem_util_v, memory_used=used, memory_total=total,
            temperature=round(temp), power_w=round(power, 1), power_limit_w=st.power_limit_w,
            sm_clock_mhz=round(sm), mem_clock_mhz=m.mem_clock if busy > 0.05 else 405,
            pcie_rx_bps=round(rx), pcie_tx_bps=round(tx), fan_pct=fan, throttle=reasons, mig=mig,
        )


def _num(v: Any) -> float:
    return 0.0 if v is NA or v is None else float(v)
