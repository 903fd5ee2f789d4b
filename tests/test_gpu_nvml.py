"""The NVML provider against a scripted stand-in for pynvml (tests/fake_pynvml.py), scenarios named
after real failures; assertions on the provider's values, on `diag gpus` rendered text and on its
parsed JSON."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fake_pynvml as F  # noqa: E402

from diag.cli import main  # noqa: E402
from diag.errors import DiagError  # noqa: E402
from diag.gpu import NA, get_provider  # noqa: E402
from diag.gpu.nvml import NvmlProvider  # noqa: E402

MiB = 1 << 20


def provider(fake: F.FakeNvml, **kw) -> NvmlProvider:
    return NvmlProvider(module=fake.module(), **kw)


@pytest.fixture
def use_fake(monkeypatch):
    """Install a fake as the `pynvml` module for code that imports it (the CLI)."""
    monkeypatch.delenv("DIAG_SIMULATE_GPUS", raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def _use(fake: F.FakeNvml):
        monkeypatch.setitem(sys.modules, "pynvml", fake.module())
        return fake

    return _use


def run_cli(capsys, *args, columns: int = 200):
    os.environ["COLUMNS"] = str(columns)
    try:
        code = main(list(args))
    finally:
        os.environ.pop("COLUMNS", None)
    out, err = capsys.readouterr()
    return code, out, err


# ---- init failures: one sentence and a hint ------------------------------------------------------------

@pytest.mark.parametrize("scenario, words", [
    ("library_missing", "libnvidia-ml.so.1) was not found"),
    ("driver_not_loaded", "driver is installed but not loaded"),
    ("rm_version_mismatch", "different versions"),
])
def test_init_failure_is_one_sentence_with_hint(scenario, words):
    p = provider(F.SCENARIOS[scenario]())
    with pytest.raises(DiagError) as ei:
        p.ensure()
    assert words in ei.value.message
    assert "\n" not in ei.value.message and ei.value.hint
    # without strict: zero devices and the reason, never an exception
    assert p.devices() == [] and p.sample() == [] and p.processes() == []
    assert words in p.reason


def test_library_missing_cli_exit_2_no_traceback(use_fake, capsys):
    use_fake(F.library_missing())
    code, out, err = run_cli(capsys, "gpus")
    # no GPU, said once and plainly, and still the host's CPU and RAM the help promises; exit 2 (NVML
    # unusable, docs/gpus.md); the hint on stderr
    assert code == 2
    assert "No GPUs: NVML (libnvidia-ml.so.1) was not found" in " ".join(out.split())
    assert "host: CPU" in out and "RAM" in out
    assert err.startswith("hint: install the NVIDIA driver") and "--simulate-gpus" in err
    assert "Traceback" not in err
    code, out, err = run_cli(capsys, "gpus", "--json")
    doc = json.loads(out)
    assert code == 2 and doc["devices"] == [] and "was not found" in doc["reason"]
    assert doc["host"]["cpu_count"] >= 1 and doc["host"]["mem_total"] > 0


def test_module_missing(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pynvml", None)      # import pynvml -> ImportError
    monkeypatch.delenv("DIAG_SIMULATE_GPUS", raising=False)
    with pytest.raises(DiagError, match="nvidia-ml-py package"):
        get_provider()
    p = get_provider(strict=False)
    assert p.devices() == [] and "not installed" in p.reason
    code, out, err = run_cli(capsys, "gpus", "--json")
    assert code == 2 and "pip install nvidia-ml-py" in err


def test_init_is_lazy_and_once():
    fake = F.healthy()
    p = provider(fake)
    assert fake.inits == 0            # constructing does not touch NVML
    p.devices()
    p.sample()
    p2 = NvmlProvider(module=p._lib._module)
    p2.devices()
    assert fake.inits == 1            # one init per process and module, shared by providers


# ---- values -------------------------------------------------------------------------------------------------

def test_healthy_values_and_units():
    p = provider(F.healthy())
    d = p.devices()[0]
    assert d.name == "NVIDIA A100-SXM4-80GB" and d.compute_capability == (8, 0)
    assert d.memory_total == 81920 * MiB and d.power_limit_w == 400.0
    assert (d.pcie_gen, d.pcie_width) == (4, 16)
    s = p.sample()[0]
    assert s.gpu_util == 87 and s.mem_util == 41 and s.memory_used == 40000 * MiB
    assert s.power_w == 312.0 and s.sm_clock_mhz == 1410 and s.throttle == ()
    assert s.pcie_rx_bps == 1_200_000 * 1024       # NVML gives KB/s
    assert p.driver()["cuda_driver_version"] == "12.4"


def test_not_supported_fields_are_na_and_asked_once():
    fake = F.not_supported()
    p = provider(fake)
    s = p.sample()[0]
    assert s.fan_pct is NA and s.pcie_rx_bps is NA and s.power_w is NA
    assert s.gpu_util == 87                      # the rest still works
    calls = fake.calls.get("nvmlDeviceGetFanSpeed")
    p.sample()
    p.sample()
    assert fake.calls.get("nvmlDeviceGetFanSpeed") == calls   # not asked again
    procs = p.processes()
    assert procs and procs[0].used_memory is NA             # usedGpuMemory None -> NA, never 0
    notes = " ".join(p.notes())
    assert "not supported" in notes and "fan" in notes


def test_not_supported_renders_na_not_zero(use_fake, capsys):
    use_fake(F.not_supported())
    code, out, err = run_cli(capsys, "gpus", "--json")
    doc = json.loads(out)
    dev = doc["devices"][0]
    assert dev["fan_pct"] is None and dev["power_w"] is None and dev["pcie_rx_bps"] is None
    assert dev["gpu_util"] == 87
    code, out, err = run_cli(capsys, "gpus")
    assert code == 0
    line = next(ln for ln in out.splitlines() if "H100" in ln)
    assert "N/A" in line and " 0 W" not in line


def test_function_not_found_driver_binding_mismatch(use_fake, capsys):
    fake = use_fake(F.function_not_found())
    code, out, err = run_cli(capsys, "gpus", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["devices"][0]["throttle"] is None                      # NA, not "no reasons"
    assert doc["driver"]["cuda_driver_version"] == "12.4"              # fell back to the older call
    assert any("driver older than nvidia-ml-py" in n for n in doc["notes"])
    assert fake.calls["nvmlSystemGetCudaDriverVersion"] >= 1


def test_gpu_lost_mid_run_others_keep_updating():
    fake = F.gpu_lost()
    p = provider(fake)
    assert all(not s.lost for s in p.sample())
    fake.lose(2)
    fake.gpus[0].util = 12
    s = {x.index: x for x in p.sample()}
    assert s[2].lost and "GPU is lost" in s[2].error and s[2].gpu_util is NA
    assert not s[0].lost and s[0].gpu_util == 12 and not s[3].lost
    calls = dict(fake.calls)
    s = {x.index: x for x in p.sample()}
    assert s[2].lost
    # a lost GPU is not queried again (each query of a lost GPU can take seconds)
    assert fake.calls["nvmlDeviceGetMemoryInfo"] - calls["nvmlDeviceGetMemoryInfo"] == 3
    assert {q.device for q in p.processes()} == {0, 1, 3}
    assert any("GPU 2 is lost" in n for n in p.notes())


def test_gpu_lost_renders(use_fake, capsys):
    fake = use_fake(F.gpu_lost_at_init())
    code, out, err = run_cli(capsys, "gpus")
    assert code == 0
    assert "LOST" in out and "GPU is lost" in out
    code, out, err = run_cli(capsys, "gpus", "--json")
    devs = json.loads(out)["devices"]
    assert [d["lost"] for d in devs] == [False, True, False]
    assert devs[0]["gpu_util"] == 87


def test_pid_not_in_proc_container(use_fake, capsys):
    fake = use_fake(F.pid_not_in_proc())
    code, out, err = run_cli(capsys, "gpus", "--json")
    procs = json.loads(out)["devices"][0]["processes"]
    by_pid = {p["pid"]: p for p in procs}
    me = by_pid[os.getpid()]
    assert me["visible"] and me["name"] and me["user"] and me["used_memory"] == 1000 * MiB
    other = next(p for p in procs if p["pid"] != os.getpid())
    assert other["visible"] is False and other["used_memory"] == 20000 * MiB and other["name"] == ""
    assert any("--pid=host" in n for n in json.loads(out)["notes"])
    code, out, err = run_cli(capsys, "gpus")
    assert "(in another PID namespace)" in out and "--pid=host" in out


def test_mig_devices_listed_under_parent(use_fake, capsys):
    use_fake(F.mig())
    p = get_provider()
    d0, d1 = p.devices()
    assert d0.mig_mode is True and [m.name for m in d0.mig_devices] == ["3g.20gb", "1g.5gb"]
    assert d1.mig_mode is False and d1.mig_devices == ()
    s0 = p.sample()[0]
    assert s0.gpu_util is NA                      # NVML: no utilisation in MIG mode
    assert [m.memory_used for m in s0.mig] == [12000 * MiB, 100 * MiB]
    procs = p.processes()
    assert [(q.device, q.mig) for q in procs] == [(0, 0)]
    code, out, err = run_cli(capsys, "gpus", "--json")
    doc = json.loads(out)
    mig0 = doc["devices"][0]["mig_devices"][0]
    assert mig0["name"] == "3g.20gb" and mig0["processes"][0]["pid"] == os.getpid()
    assert doc["devices"][0]["gpu_util"] is None
    code, out, err = run_cli(capsys, "gpus")
    assert "└ MIG 0 3g.20gb" in out and "0/MIG 0" in out


def test_zero_devices(use_fake, capsys):
    use_fake(F.zero_devices())
    code, out, err = run_cli(capsys, "gpus")
    assert code == 0 and "No GPUs: NVML reports no GPU" in out
    code, out, err = run_cli(capsys, "gpus", "--json")
    doc = json.loads(out)
    assert doc["devices"] == [] and doc["provider"] == "none" and "no GPU" in doc["reason"]


# ---- CUDA_VISIBLE_DEVICES -----------------------------------------------------------------------------------

@pytest.mark.parametrize("cvd, expect", [
    ("2,0", [2, 0]),                 # CUDA order, renumbered 0, 1
    ("GPU-00000003", [3]),           # a UUID prefix
    ("1,7,2", [1]),                  # CUDA stops at the first invalid entry
    ("", []),
])
def test_cuda_visible_devices(cvd, expect):
    p = provider(F.gpu_lost(), visible_only=True, cuda_visible_devices=cvd)
    devs = p.devices()
    assert [d.nvml_index for d in devs] == expect
    assert [d.index for d in devs] == list(range(len(expect)))
    if not expect:
        assert "CUDA_VISIBLE_DEVICES" in p.reason
    else:
        assert [s.index for s in p.sample()] == list(range(len(expect)))


def test_cuda_visible_devices_ignored_unless_asked():
    p = provider(F.gpu_lost(), cuda_visible_devices="1")
    assert len(p.devices()) == 4


def test_visible_only_cli(use_fake, capsys, monkeypatch):
    use_fake(F.gpu_lost())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    code, out, err = run_cli(capsys, "gpus", "--json", "--visible-only")
    devs = json.loads(out)["devices"]
    assert [(d["index"], d["nvml_index"]) for d in devs] == [(0, 3)]


# ---- thread safety ------------------------------------------------------------------------------------------

def test_concurrent_calls_are_safe():
    import threading

    fake = F.gpu_lost()
    p = provider(fake)
    errors = []

    def worker():
        try:
            for _ in range(50):
                p.sample()
                p.processes()
        except Exception as e:   # pragma: no cover - the assertion below reports it
            errors.append(e)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    fake.lose(1)
    for t in threads:
        t.join()
    assert not errors
    assert p.sample()[1].lost
