"""The probe counts live optimizers as they are made (diag.probe.hooks.OptimizerCensus), not with a scan
of the garbage collector inside a step: the count it gives is the scan's, it leaves nothing on torch
or on the optimizers, and a short run's second step no longer carries 60-90 ms of the probe's scan
(which read as the script's own work before the forward: a false dataloader.main-thread-data error)."""
from __future__ import annotations

import copy
import gc
import json
import pickle

import pytest
import torch
from conftest import run_diag

from diag.probe.hooks import OptimizerCensus, Patches, live_optimizers


class Wrapped(torch.optim.Optimizer):
    """An optimizer wrapper that never calls Optimizer.__init__ (accelerate's AcceleratedOptimizer)."""

    def __init__(self, inner):
        self.inner = inner


@pytest.fixture
def census():
    gc.collect()
    patches = Patches()
    c = OptimizerCensus()
    c.install(patches, scan=True)
    yield c
    patches.undo()


def params():
    return [torch.nn.Parameter(torch.zeros(3))]


def test_the_census_counts_what_the_scan_counts(census):
    base = census.count()
    assert base == live_optimizers()
    a = torch.optim.SGD(params(), lr=0.1)
    b = torch.optim.AdamW(params())
    c = copy.deepcopy(b)
    d = pickle.loads(pickle.dumps(torch.optim.SGD(params(), lr=0.2)))
    assert census.count() == base + 4 == live_optimizers()
    w = Wrapped(a)      # not counted: it fires no optimizer hook of its own (the scan counts it)
    assert census.count() == base + 4 == live_optimizers() - 1
    assert census.any()
    del a, w, c, d
    gc.collect()
    assert census.count() == base + 1 == live_optimizers()
    assert isinstance(b, torch.optim.AdamW) and b.defaults["lr"] == pytest.approx(1e-3)


def test_the_census_finds_the_optimizers_made_before_it(census):
    keep = torch.optim.SGD(params(), lr=0.1)
    later = OptimizerCensus()
    patches = Patches()
    later.install(patches, scan=True)
    try:
        assert later.count() == census.count() >= 1
    finally:
        patches.undo()
    del keep


def test_undone_the_census_leaves_torch_as_it_was():
    before = dict(vars(torch.optim.Optimizer))
    patches = Patches()
    OptimizerCensus().install(patches)
    assert torch.optim.Optimizer.__init__ is not before["__init__"]
    patches.undo()
    assert dict(vars(torch.optim.Optimizer)) == before
    opt = torch.optim.SGD(params(), lr=0.1)
    assert not any("diag" in repr(v) for v in vars(opt).values())
    assert pickle.loads(pickle.dumps(opt)).defaults == opt.defaults


SHORT = """
import gc, os, sys, time, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
scans = [0]
_get = gc.get_objects
def counted(*a, **k):
    scans[0] += 1
    return _get(*a, **k)
gc.get_objects = counted
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
dl = DataLoader(TensorDataset(torch.randn(256, 64), torch.randint(0, 10, (256,))), batch_size=64)
for i, (x, y) in enumerate(dl):
    if i == 0:
        time.sleep(0.05)        # a one-off before the first forward (a cold read, a lazy import)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
print("scans", scans[0])
"""


@pytest.mark.slow
def test_a_short_run_has_no_scan_in_its_steps_and_no_false_alarm(tmp_path):
    (tmp_path / "short.py").write_text(SHORT)
    r = run_diag("check", "--script", "short.py", "--format", "json", "--fail-on", "never", cwd=tmp_path,
                 timeout=180)
    assert r.code == 0, r.stderr[-3000:]
    # the script's own print: on stderr beside the JSON report, and in the run's log
    assert "scans 0" in r.stderr and "scans 0" in _script_output(tmp_path)
    rep = r.json()
    loud = [(f["id"], f["severity"]) for f in rep["findings"] if f["severity"] in ("warning", "error")]
    assert loud == [], loud
    steps = _steps(tmp_path)
    assert len(steps) == 4
    # the second step is as short as the last (it carried the scan: 60-90 ms, the whole step, on the probe's
    # own account); on a loaded machine a step can stall for as long (75 ms of a 1 ms step, once, in a
    # clean-clone suite at load): then the probe's own time in it says whose time it was
    s2 = steps[1]
    assert s2["total_s"] < 0.5 * steps[0]["total_s"] or s2["probe_s"] < 0.2 * s2["total_s"], s2


def _events(tmp_path):
    (path,) = (tmp_path / ".diag" / "runs").glob("*/events.rank0.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def _steps(tmp_path):
    return [e for e in _events(tmp_path) if e["kind"] == "step"]


def _script_output(tmp_path):
    return "".join(p.read_text() for p in (tmp_path / ".diag" / "runs").glob("*/log.txt"))
