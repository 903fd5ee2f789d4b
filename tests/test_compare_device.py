"""diag compare on the device clock: evidence in the shape a CUDA run writes (the probe's step events
and the device timeline's events through diag's fold, tests/timeline_support.py). Device-clock phase
metrics appear only when both sides have a timeline, and a planted exposed data wait is attributed to
GPU idle for data."""
from __future__ import annotations

import copy
import json

import numpy as np

from diag.compare import extract
import functools

from diag.compare import core

# these tests judge the statistics on one run per side: gated as on a machine whose run-to-run noise is
# known (--min-runs 1); the default refusal to gate one run per side is tested in test_compare_core.py
compare = functools.partial(core.compare, min_runs=1)
from diag.evidence import TimelineSection
from diag.report import compare as rc

from timeline_support import run_loop

FWD, BWD, OPT = 0.030, 0.030, 0.005      # GPU seconds per phase


def _run(data_s: float, seed: int, n: int = 40):
    """A loop that syncs every step (``.item()``), so the next batch's wait leaves the GPU idle."""
    rng = np.random.default_rng(seed)

    def body(sim, i):
        sim.data(data_s * (1 + rng.normal(0, 0.03)))
        sim.forward(FWD * (1 + rng.normal(0, 0.02)))
        sim.backward(BWD * (1 + rng.normal(0, 0.02)))
        sim.optimizer(OPT)
        sim.item()

    return run_loop(n, body).evidence(num_workers=0, sync_per_step=1)


def _sample(ev, source):
    # through JSON, as a saved report's compare block is read back
    return extract.from_export(json.loads(json.dumps(extract.export(ev))), source, [])


def _host_only(ev):
    ev = copy.deepcopy(ev)
    for r in ev.ranks:
        r.timeline = TimelineSection()
    return ev


def test_export_carries_per_step_device_records_only_with_a_timeline():
    ev = _run(0.002, seed=1)
    block = extract.export(ev)
    dev = block["device"]
    assert dev["clock"] == "device"
    assert len(dev["steps"]["index"]) == 40
    assert set(extract.DEVICE_FIELDS) <= set(dev["steps"])
    # the loop syncs every step: idle between steps is counted as sync, never as host
    assert sum(dev["steps"]["idle_sync_s"]) >= 0 and not any(dev["steps"]["idle_host_s"])
    assert "device" not in extract.export(_host_only(ev))
    s = _sample(ev, "a")
    steady = s.steps["total_s"].size
    assert s.steps["device.total_s"].size == steady          # the same steady-state steps on both clocks
    assert s.steps["device.idle_data_s"].min() > 0.0015      # the exposed 2 ms wait, measured on the GPU


def test_planted_data_wait_is_attributed_to_device_clock_data_idle():
    base = _sample(_run(0.002, seed=1), "base")
    new = _sample(_run(0.010, seed=2), "new")
    c = compare([base], [new])
    idle = c.metric("device.idle_data")
    assert idle is not None and idle.clock == "device" and not idle.gated
    assert idle.verdict == "worse"
    assert 0.006 < idle.delta < 0.010                          # about +8 ms of GPU idle per step
    assert idle.delta_low > 0.005
    busy = c.metric("device.busy")
    assert busy.verdict == "unchanged"                         # the kernels did not change
    assert c.metric("step_time").verdict in ("regression", "worse")
    dev = [a for a in c.attribution if a.get("clock") == "device"]
    assert dev and dev[0]["phase"] == "GPU idle for data"
    assert "GPU idle for data +" in c.headline and "(device clock)" in c.headline
    assert [a["phase"] for a in c.attribution if not a.get("clock")][0] == "data"   # host clock agrees
    d = c.to_dict()
    m = next(x for x in d["metrics"] if x["key"] == "device.idle_data")
    assert m["clock"] == "device"
    assert all("clock" not in x for x in d["metrics"] if not x["key"].startswith("device."))
    rows = {r["key"]: r for r in rc.rows(c)}
    assert rows["device.idle_data"]["metric"] == "· GPU idle for data (device clock)"
    assert rows["device.idle_data"]["change"].endswith(" ms")
    assert "device.idle_data" not in d["regressions"] + d["improvements"]


def test_equal_sides_are_not_significant_on_the_device_clock():
    base = _sample(_run(0.004, seed=1), "base")
    new = _sample(_run(0.004, seed=2), "new")
    c = compare([base], [new])
    dev = [m for m in c.metrics if m.clock == "device"]
    assert {m.key for m in dev} >= {"device.total", "device.busy", "device.idle", "device.idle_data"}
    assert all(m.verdict in ("unchanged", "unknown") for m in dev), [(m.key, m.verdict) for m in dev]
    assert not [a for a in c.attribution if a.get("clock")]
    assert c.exit_code == 0


def test_one_side_without_a_timeline_compares_the_host_clock_only():
    a = _run(0.002, seed=1)
    b = _run(0.010, seed=2)
    with_tl = compare([_sample(a, "a")], [_sample(_host_only(b), "b")])
    plain = compare([_sample(_host_only(a), "a")], [_sample(_host_only(b), "b")])
    assert not [m for m in with_tl.metrics if m.key.startswith("device.")]
    assert json.dumps(with_tl.to_dict()) == json.dumps(plain.to_dict())


def test_every_format_names_the_device_clock():
    from diag.report.compare_html import render_html

    c = compare([_sample(_run(0.002, seed=1), "base")], [_sample(_run(0.010, seed=2), "new")])
    md = rc.render_markdown(c)
    assert "GPU idle for data (device clock)" in md
    html = render_html(c)
    assert "GPU idle for data (device clock)" in html           # the metrics table and the attribution
    assert html.count("GPU idle for data (device clock)") >= 2
    junit = rc.render_junit(c)
    assert 'name="device.idle_data"' in junit
    assert json.loads(rc.render_json(c))["attribution"][-1]["clock"] == "device"
