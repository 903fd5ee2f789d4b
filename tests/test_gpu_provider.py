"""NA and fmt, the simulated provider's scenarios (deterministic for a seed and clock), the
sampler (ring buffers, bounded evidence series, listeners, interval limits, the run's process tree)."""
from __future__ import annotations

import copy
import json
import os
import pickle
import subprocess
import sys
import threading
import time

import pytest

from diag.errors import DiagError
from diag.gpu import (
    NA, SCENARIOS, DeviceStatic, Provider, Sampler, SimulatedProvider, check_interval, fmt, get_provider,
    host_sample, is_na, to_jsonable,
)
from diag.gpu.sampler import BoundedSeries, parse_visible_devices


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


# ---- NA and fmt -----------------------------------------------------------------------------------------

def test_na_sentinel():
    assert NA is type(NA)() and not NA and str(NA) == "N/A" and f"{NA:>5}" == "N/A"
    assert NA != 0 and NA is not None and is_na(NA) and is_na(None) and not is_na(0)
    assert copy.deepcopy(NA) is NA and pickle.loads(pickle.dumps(NA)) is NA
    assert to_jsonable({"a": NA, "b": (1, NA)}) == {"a": None, "b": [1, None]}


@pytest.mark.parametrize("value, unit, text", [
    (NA, "%", "N/A"), (None, "W", "N/A"), (0, "%", "0%"), (97.4, "%", "97%"), (81559 << 20, "B", "79.6 GiB"),
    (512 << 20, "B", "512 MiB"), (1.4e9, "B/s", "1.4 GB/s"), (312.0, "W", "312 W"), (61, "C", "61°C"),
    (1410, "MHz", "1410 MHz"), (float("nan"), "W", "N/A"), (("sw_thermal",), None, "sw_thermal"),
])
def test_fmt(value, unit, text):
    assert fmt(value, unit) == text


# ---- simulated provider -----------------------------------------------------------------------------------

def test_scenarios_exist():
    for name in ("healthy-8", "imbalance", "lost", "none", "mig", "throttling"):
        assert name in SCENARIOS


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_scenario_is_labelled_and_serialisable(name):
    p = get_provider(name, clock=Clock())
    assert isinstance(p, Provider) and p.simulated and p.scenario == name
    assert all(d.simulated for d in p.devices())
    assert all(q.simulated for q in p.processes())
    assert any("simulated" in n for n in p.notes())
    assert "simulated" in p.driver()["driver_version"]
    json.dumps(to_jsonable([p.devices(), p.sample(), p.processes(), p.host()]))


def test_deterministic_for_seed_and_clock():
    c1, c2 = Clock(), Clock()
    a = SimulatedProvider("healthy-8", seed=3, clock=c1, epoch=1.7e9)
    b = SimulatedProvider("healthy-8", seed=3, clock=c2, epoch=1.7e9)
    for t in (0.5, 7.25, 60.0):
        c1.t = c2.t = 1000.0 + t
        assert a.sample() == b.sample() and a.processes() == b.processes() and a.host() == b.host()
    c = SimulatedProvider("healthy-8", seed=4, clock=Clock(1060.0), epoch=1.7e9)
    assert c.sample() != a.sample()
    assert a.devices()[0].uuid == b.devices()[0].uuid != c.devices()[0].uuid


def test_values_vary_plausibly_over_time():
    clock = Clock()
    p = SimulatedProvider("healthy-8", clock=clock)
    utils, temps = [], []
    for i in range(120):
        clock.t = 1000.0 + 10 + i * 0.5
        s = p.sample()[0]
        utils.append(s.gpu_util)
        temps.append(s.temperature)
        assert 0 <= s.gpu_util <= 100 and 0 < s.memory_used < s.memory_total
        assert s.power_w <= s.power_limit_w and s.fan_pct is NA   # H100 SXM: no fan, NA not 0
    assert len(set(utils)) > 3 and min(utils) >= 85          # busy, not constant
    assert max(temps) - min(temps) < 15


def test_imbalance_scenario_shape():
    p = SimulatedProvider("imbalance", clock=Clock(1000.0), start=60)
    s = p.sample()
    assert s[0].gpu_util > 85 and s[3].gpu_util < 5
    assert s[0].memory_used > 2 * s[1].memory_used


def test_lost_scenario_loses_gpu_2_mid_run():
    clock = Clock()
    p = SimulatedProvider("lost", clock=clock)
    assert not any(s.lost for s in p.sample())
    clock.t += 10
    s = p.sample()
    assert [x.lost for x in s] == [False, False, True, False]
    assert s[2].gpu_util is NA and "lost" in s[2].error
    assert 2 not in {q.device for q in p.processes()}


def test_none_mig_throttling_container():
    assert get_provider("none").devices() == [] and "no GPUs" in get_provider("none").reason
    mig = SimulatedProvider("mig", clock=Clock(), start=60)
    d0 = mig.devices()[0]
    assert d0.mig_mode is True and len(d0.mig_devices) == 3 and mig.sample()[0].gpu_util is NA
    assert {q.mig for q in mig.processes() if q.device == 0} == {0, 1}
    thr = SimulatedProvider("throttling", clock=Clock(), start=60)
    reasons = set()
    for k in range(40):
        thr._clock = Clock(1000.0 + k * 0.5)
        reasons |= set(thr.sample()[1].throttle)
    assert {"sw_thermal"} <= reasons
    cont = SimulatedProvider("container", clock=Clock(), start=60)
    assert all(not q.visible for q in cont.processes())
    assert any("--pid=host" in n for n in cont.notes())


def test_unknown_scenario_and_env(monkeypatch):
    with pytest.raises(DiagError, match="unknown GPU simulation scenario 'nope'; choose one of: healthy-8"):
        get_provider("nope")
    monkeypatch.setenv("DIAG_SIMULATE_GPUS", "mig")
    assert get_provider().scenario == "mig"
    monkeypatch.setenv("DIAG_SIMULATE_GPUS", "")
    assert get_provider(strict=False).name == "nvml"


def test_host_sample():
    h = host_sample(prime_s=0.05)
    assert h.mem_total > 0 and 0 <= h.cpu_percent <= 100 and h.cpu_count >= 1


# ---- sampler ------------------------------------------------------------------------------------------------

def test_interval_limits():
    assert check_interval(0.1) == 0.1
    for bad in (0.05, 0, -1, float("nan")):
        with pytest.raises(DiagError, match="at least 0.1 s"):
            check_interval(bad)
    with pytest.raises(DiagError):
        Sampler(get_provider("healthy-8"), interval=0.01)


def test_ring_buffers_are_bounded():
    clock = Clock()
    s = Sampler(SimulatedProvider("healthy-8", clock=clock), interval=1, history=10, host=False)
    for i in range(50):
        clock.t += 1
        s.sample_once()
    assert len(s.history(0)) == 10 and len(s.history(7)) == 10 and s.history(99) == []
    assert s.history(0)[-1] == s.latest().devices[0]


def test_evidence_series_bounded_and_whole_run():
    clock = Clock()
    s = Sampler(SimulatedProvider("imbalance", clock=clock), interval=1, evidence_points=32, host=False)
    for i in range(1000):
        clock.t += 1
        s.sample_once()
    ev = s.to_evidence()
    d0 = ev["devices"][0]
    assert len(d0["series"]["t"]) <= 33 and d0["stride"] >= 32
    assert all(len(v) == len(d0["series"]["t"]) for v in d0["series"].values())
    assert d0["stats"]["samples"] == 1000                       # aggregates over every sample
    assert abs(d0["stats"]["util_mean"] - sum(x for x in d0["series"]["util"]) / len(d0["series"]["util"])) < 3
    # memory is merged by max: the series peak is the true peak
    assert max(d0["series"]["mem_used"]) == d0["stats"]["mem_used_max"]
    assert len(json.dumps(ev)) < 60_000


def test_bounded_series_reducers():
    b = BoundedSeries({"t": "mean", "m": "max", "r": "or"}, max_points=4)
    for i in range(8):
        b.add({"t": float(i), "m": i * 10, "r": 1 << (i % 3)})
    out = b.export()
    assert out["t"] == [0.5, 2.5, 4.5, 6.5] and out["m"] == [10, 30, 50, 70] and out["r"] == [3, 5, 6, 3]
    assert b.stride == 2
    for i in range(8, 100):
        b.add({"t": float(i), "m": i * 10, "r": 0})
    out = b.export()
    assert len(out["t"]) <= 5 and out["m"][-1] == 990 and abs(out["t"][0] - (b.stride - 1) / 2) < 1e-9
    b2 = BoundedSeries({"t": "mean", "u": "mean"}, max_points=4)
    b2.add({"t": 0.0, "u": None})
    b2.add({"t": 1.0, "u": 50})
    assert b2.export()["u"] == [None, 50]


def test_listeners_and_thread():
    got = []
    s = Sampler(get_provider("healthy-8"), interval=0.1, host=False)

    def bad(snap):
        raise RuntimeError("listener bug")

    s.add_listener(got.append)
    s.add_listener(bad)
    s.start()
    assert s.running
    deadline = time.monotonic() + 5
    while len(got) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    s.stop()
    assert not s.running and len(got) >= 3
    assert s.listener_errors >= 3 and s.errors == 0
    assert len(got[0].devices) == 8 and got[0].processes is not None
    n = len(got)
    time.sleep(0.25)
    assert len(got) == n                   # stopped means stopped
    s.remove_listener(got.append)


def test_lost_gpu_in_evidence():
    clock = Clock()
    s = Sampler(SimulatedProvider("lost", clock=clock), interval=0.5, host=False)
    for i in range(20):
        clock.t += 0.5
        s.sample_once()
    d2 = s.to_evidence()["devices"][2]
    assert d2["lost"] and 3.0 <= d2["lost_at"] <= 4.5 and "lost" in d2["error"]
    assert d2["series"]["util"][-1] is None           # NA recorded as null, not 0


def test_tracks_run_process_tree():
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(50 << 20); time.sleep(3)"])
    try:
        clock = Clock()
        prov = SimulatedProvider("healthy-8", clock=clock)
        s = Sampler(prov, interval=0.5, host=False).track(child.pid)
        for i in range(4):
            clock.t += 0.5
            s.sample_once()
            time.sleep(0.05)
        ev = s.to_evidence()
        procs = ev["processes"]
        assert procs["tracked"] and procs["root_pid"] == child.pid and procs["max_rss"] > 40 << 20
        # the simulated run processes are bound to the real pid: "used by the run" is known
        assert all(d["used_by_run"] is True for d in ev["devices"])
        assert {p["device"] for p in procs["gpu"]} == set(range(8))
        assert max(x for x in procs["series"]["gpu_mem"] if x is not None) > 0
        assert ev["devices"][0]["stats"]["run_mem_max"] > 0
    finally:
        child.kill()
        child.wait()


def test_used_by_run_unknown_when_pids_invisible():
    clock = Clock()
    s = Sampler(SimulatedProvider("container", clock=clock), interval=1, host=False).track(os.getpid())
    clock.t += 1
    s.sample_once()
    assert s.to_evidence()["devices"][0]["used_by_run"] is None


def test_parse_visible_devices():
    statics = [DeviceStatic(index=i, uuid=f"GPU-{i}abc", nvml_index=i) for i in range(4)]
    assert parse_visible_devices(None, statics) is None
    assert parse_visible_devices("3,1", statics) == [3, 1]
    assert parse_visible_devices("GPU-2", statics) == [2]
    assert parse_visible_devices("0,9,1", statics) == [0]
    assert parse_visible_devices("", statics) == []
    assert parse_visible_devices("-1", statics) == []


def test_thread_safe_reads_while_sampling():
    s = Sampler(get_provider("healthy-8"), interval=0.1, history=5, host=False).start()
    errors = []

    def reader():
        try:
            for _ in range(200):
                s.latest()
                s.history(3)
                s.to_evidence()
        except Exception as e:  # pragma: no cover
            errors.append(e)

    ts = [threading.Thread(target=reader) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    s.stop()
    assert not errors and s.samples >= 1
