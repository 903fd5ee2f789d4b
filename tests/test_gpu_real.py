"""The NVML provider against a real NVIDIA GPU and driver. Marked `gpu`: skipped cleanly without one
(no driver, no device, or a CPU-only torch where the conftest skips every `gpu` test)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import REPO

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nvml():
    from diag.gpu.nvml import NvmlProvider

    p = NvmlProvider()
    if not p.available or not p.devices():
        pytest.skip(f"no NVIDIA GPU reachable through NVML: {p.reason}")
    return p


def test_static_info_is_real(nvml):
    from diag.gpu import NA

    for d in nvml.devices():
        assert d.name and d.uuid.startswith(("GPU-", "MIG-")) and d.nvml_index is not None
        assert d.memory_total is NA or d.memory_total > 1 << 30
        assert d.compute_capability is NA or d.compute_capability[0] >= 3
    drv = nvml.driver()
    assert drv["driver_version"]


def test_samples_are_plausible(nvml):
    from diag.gpu import is_na

    s = nvml.sample()
    assert len(s) == len(nvml.devices())
    for x in s:
        assert not x.lost
        assert is_na(x.gpu_util) or 0 <= x.gpu_util <= 100
        assert is_na(x.memory_used) or 0 <= x.memory_used <= x.memory_total
        assert is_na(x.temperature) or 10 <= x.temperature <= 110
        assert is_na(x.power_w) or 0 < x.power_w < 2000
        assert is_na(x.throttle) or isinstance(x.throttle, tuple)


def test_sampler_on_real_gpu(nvml):
    from diag.gpu import Sampler

    s = Sampler(nvml, interval=0.1, host=False).start()
    time.sleep(0.6)
    s.stop()
    ev = s.to_evidence()
    assert ev["provider"] == "nvml" and not ev["simulated"] and ev["samples"] >= 3
    assert ev["sample_ms_mean"] is not None and ev["sampler_errors"] == 0


def test_own_cuda_process_is_seen(nvml):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA")
    x = torch.ones(64 << 20, device="cuda")   # 256 MiB held by this process
    torch.cuda.synchronize()
    time.sleep(0.2)
    mine = [p for p in nvml.processes() if p.pid == os.getpid()]
    del x
    if not mine:
        pytest.skip("NVML lists no processes here (PID namespace of a container without --pid=host)")
    assert mine[0].visible and mine[0].name


def test_diag_gpus_json_on_real_gpu(nvml):
    p = subprocess.run([sys.executable, "-m", "diag", "gpus", "--json"], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["provider"] == "nvml" and not doc["simulated"] and len(doc["devices"]) == len(nvml.devices())
