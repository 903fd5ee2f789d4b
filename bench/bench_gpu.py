"""GPU sampler cost: time per device per sample (simulated, NVML over the scripted stand-in and,
when a GPU is present, real NVML), the sampler thread's CPU share at 1 s and 0.25 s with 8 simulated
devices (processes, host and a tracked process tree included, as during `diag check`), and the size
and build time of Evidence.gpu for a one-hour run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))


def _per_call(fn, n: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _thread_cpu(tid: int) -> float:
    import psutil

    for t in psutil.Process().threads():
        if t.id == tid:
            return t.user_time + t.system_time
    return 0.0


def _cpu_share(interval: float, seconds: float) -> dict:
    from diag.gpu import Sampler, SimulatedProvider

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        s = Sampler(SimulatedProvider("healthy-8"), interval=interval).track(child.pid)
        s.start()
        time.sleep(0.05)
        tid = s._thread.native_id
        c0, t0 = _thread_cpu(tid), time.perf_counter()
        time.sleep(seconds)
        c1, t1 = _thread_cpu(tid), time.perf_counter()
        s.stop()
        return {"cpu_share_pct": round(100 * (c1 - c0) / (t1 - t0), 3), "samples": s.samples,
                "round_ms_mean": round(s.mean_sample_ms, 3)}
    finally:
        child.kill()
        child.wait()


def run(results: dict) -> None:
    from diag.gpu import Sampler, SimulatedProvider
    from diag.gpu.nvml import NvmlProvider

    # per device per sample
    sim = SimulatedProvider("healthy-8")
    per = _per_call(sim.sample, 300) / 8
    results["simulated_sample_us_per_device"] = round(per * 1e6, 2)
    results["simulated_processes_us_per_device"] = round(_per_call(sim.processes, 100) / 8 * 1e6, 2)
    print(f"   simulated: {per * 1e6:.1f} µs per device per sample", flush=True)

    import fake_pynvml as F

    fake = F.FakeNvml([F._gpu(i, processes=[(os.getpid(), 1 << 30)]) for i in range(8)])
    nv = NvmlProvider(module=fake.module())
    nv.devices()
    per = _per_call(nv.sample, 300) / 8
    results["nvml_overhead_us_per_device"] = round(per * 1e6, 2)
    results["nvml_overhead_processes_us_per_device"] = round(_per_call(nv.processes, 100) / 8 * 1e6, 2)
    print(f"   NVML provider over a stand-in binding (diag's own overhead): {per * 1e6:.1f} µs per device per sample",
          flush=True)

    real = NvmlProvider()
    if real.available and real.devices():
        n = len(real.devices())
        per = _per_call(real.sample, 20) / n
        results["nvml_real_sample_ms_per_device"] = round(per * 1e3, 3)
        results["nvml_real_processes_ms_per_device"] = round(_per_call(real.processes, 10) / n * 1e3, 3)
        nofast = NvmlProvider(pcie_throughput=False)
        results["nvml_real_sample_no_pcie_ms_per_device"] = round(_per_call(nofast.sample, 20) / n * 1e3, 3)
        results["nvml_real_devices"] = n
        results["nvml_real_name"] = real.devices()[0].name
        print(f"   real NVML ({n} x {real.devices()[0].name}): {per * 1e3:.2f} ms per device per sample", flush=True)
    else:
        results["nvml_real"] = f"not measured: {real.reason}"
        print(f"   real NVML: not measured ({real.reason})", flush=True)

    # the sampler thread's CPU share, 8 simulated devices, processes + host + a tracked process tree
    for interval, seconds in ((1.0, 10.0), (0.25, 6.0)):
        r = _cpu_share(interval, seconds)
        key = f"sampler_8dev_{str(interval).replace('.', '_')}s"
        results[key + "_cpu_pct"] = r["cpu_share_pct"]
        results[key + "_round_ms"] = r["round_ms_mean"]
        print(f"   sampler, 8 simulated GPUs every {interval:g} s: {r['cpu_share_pct']:.2f}% of one core "
              f"({r['round_ms_mean']:.2f} ms per round, {r['samples']} rounds)", flush=True)

    # Evidence.gpu for a one-hour run at 1 s
    class Clock:
        t = 0.0

        def __call__(self):
            return self.t

    clock = Clock()
    s = Sampler(SimulatedProvider("healthy-8", clock=clock), interval=1.0, host=False)
    for _ in range(3600):
        clock.t += 1.0
        s.sample_once()
    t0 = time.perf_counter()
    ev = s.to_evidence()
    build = time.perf_counter() - t0
    size = len(json.dumps(ev))
    size_indented = len(json.dumps(ev, indent=1))
    results["evidence_gpu_1h_8dev_kib"] = round(size / 1024, 1)
    results["evidence_gpu_1h_8dev_indent1_kib"] = round(size_indented / 1024, 1)
    results["evidence_gpu_build_ms"] = round(build * 1000, 2)
    print(f"   Evidence.gpu after 1 h at 1 s, 8 GPUs: {size / 1024:.0f} KiB compact, {size_indented / 1024:.0f} KiB "
          f"as saved (indent=1); built in {build * 1000:.1f} ms", flush=True)


if __name__ == "__main__":
    out: dict = {}
    run(out)
    print(json.dumps(out, indent=2))
