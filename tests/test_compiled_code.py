"""The probe and code that torch.compile traces (diag.probe.hooks.compiling_check).

A model called inside a compiled function has its hooks traced by dynamo. Traced as they were, the
probe's hooks were graph breaks at every line dynamo cannot trace (``time.perf_counter``, the probe's
objects) and printed dynamo's warnings into the user's output: a compiled train step went from 3 graphs
to 23 under the probe. Now the hooks trace to nothing, and the ones that mark a step run eagerly behind
``torch._dynamo.disable``: one graph break at each, the step still seen."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import SCRIPTS

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

SCRIPT = SCRIPTS / "compiled_train_step.py"
DIAG_FUNCTIONS = ("HandOver._local_pre", "HandOver._local_post", "Probe._opt_pre", "Probe._opt_post",
                  "function backward", "function grad")


def _dynamo(path: Path) -> dict:
    return json.loads(path.read_text())


def test_a_compiled_train_step_keeps_its_graphs_and_its_steps_are_seen(diag_cli, tmp_path):
    bare_out, probe_out = tmp_path / "bare.json", tmp_path / "probe.json"
    bare = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DIAG_TEST_DYNAMO_OUT": str(bare_out)})
    assert bare.returncode == 0, bare.stderr
    r = diag_cli("check", "--script", str(SCRIPT), "--format", "json", timeout=300,
                 env={"DIAG_TEST_DYNAMO_OUT": str(probe_out)})
    assert r.code == 0 and r.stdout.strip(), r.stderr
    rep = r.json()

    b, p = _dynamo(bare_out), _dynamo(probe_out)
    # the graphs: the bare script's 3, and at most one more per place a model or an optimizer step is
    # called in compiled code (the forward's end splits the model's graph from the loss)
    assert b["unique_graphs"] <= p["unique_graphs"] <= b["unique_graphs"] + 4, (b, p)
    # every graph break the probe adds is a call of one of its own hooks, behind torch._dynamo.disable
    added = {k for k in p["graph_breaks"] if k not in b["graph_breaks"]}
    for reason in added:
        assert "torch.compiler.disable()" in reason and any(f in reason for f in DIAG_FUNCTIONS), reason
    # dynamo never traced into diag (it warned about time.perf_counter, sys._getframe, ...)
    assert "Dynamo does not know how to trace" not in r.stderr
    assert "diag/probe" not in r.stderr, r.stderr[-3000:]

    # the probe still sees the steps: 2 epochs of 16 batches, each forward and backward timed
    assert rep["summary"]["steps"] == 32
    assert rep["summary"]["kind"] == "training+evaluation"
    run_dir = next((tmp_path / ".diag" / "runs").iterdir())
    ev = json.loads((run_dir / "evidence.json").read_text())
    steps = ev["ranks"][0]["steps"]
    assert all(s["n_forward"] == 1 and s["n_backward"] == 1 and s["samples"] == 32 for s in steps)
    assert all(s["forward_s"] > 0 and s["optimizer_s"] > 0 for s in steps)
    sites = ev["ranks"][0]["forwards"]
    lines = SCRIPT.read_text().splitlines()
    by_function = {s["location"]["function"]: s for s in sites}
    assert by_function["forward_backward"]["training"] is True and by_function["forward_backward"]["count"] == 32
    assert "model(x)" in lines[by_function["forward_backward"]["location"]["line"] - 1]
    assert by_function["predict"]["grad_enabled"] is False


class _Net(torch.nn.Module):
    # a module of the user's own (dynamo does not compile a frame of torch's: an nn.Sequential's
    # forward compiled in place is left to run as it is)
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _train_compiled_in_place(steps: int = 6) -> None:
    model = _Net()
    model.compile(backend="eager")          # Module.compile: torch.compile of the module's _call_impl
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()


def _graphs(fn) -> tuple[int, int]:
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    fn()
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def test_a_module_compiled_in_place_is_split_only_at_its_own_edges(monkeypatch):
    from diag.probe.core import Probe

    bare_graphs, bare_breaks = _graphs(_train_compiled_in_place)
    compile_before = torch.compile
    events: list = []
    probe = Probe(events.append, extensions=[])
    probe.install()
    try:
        graphs, breaks = _graphs(_train_compiled_in_place)
        probe.finish("completed", 0)
    finally:
        probe.uninstall()
    # the hooks run eagerly at the compiled _call_impl's start and end: one more graph at most
    # (before: 16 graphs and 31 graph breaks inside diag's hook code for this loop's one graph)
    assert (bare_graphs, bare_breaks) == (1, 0)
    assert graphs <= bare_graphs + 1 and breaks <= 2, (graphs, breaks)
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) >= 5 and all(s["n_forward"] == 1 and s["forward_s"] > 0 for s in steps)
    assert torch.compile is compile_before       # the probe's wrapper is undone


def test_a_pass_whose_forwards_went_unseen_is_not_the_next_steps_data():
    """Forwards inside compiled code that no hook of its own marks are not seen (a discovery window's
    global hooks are blind there): Lightning + torch.compile's sanity check then looked like 2 batches
    fetched before the first training step, so the validation loader was taken for a training loader
    (and its passes counted as epochs). A pass that ends (StopIteration) or is left for another
    loader's pass, with no step open, is an evaluation pass of its own."""
    from torch.utils.data import DataLoader, TensorDataset

    from diag.probe.core import Probe

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    train = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=16)
    val = DataLoader(TensorDataset(torch.randn(64, 8)), batch_size=16)
    events: list = []
    probe = Probe(events.append, extensions=[])
    probe.install()
    try:
        it = iter(val)
        next(it), next(it)                    # a sanity check of 2 batches, the iterator left behind
        for epoch in range(2):
            for (x,) in train:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
            for (x,) in val:                  # an evaluation whose forwards ran unseen
                x.sum()
        probe.finish("completed", 0)
    finally:
        probe.uninstall()
    loaders = {e["id"]: e for e in events if e["kind"] == "dataloader"}   # the last event of each
    assert {i: d["role"] for i, d in loaders.items()} == {1: "eval", 2: "train"}
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 8 and {s["epoch"] for s in steps} == {1, 2}
    assert all(s["data_s"] < 0.5 and s["n_forward"] == 1 for s in steps)
    passes = [e for e in events if e["kind"] == "evaluation"]
    assert [p["batches"] for p in passes] == [2, 4, 4] and all(p["loaders"] == [1] for p in passes)


COMPILED_FIRST = """
import sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
compiled = torch.compile(model, backend=sys.argv[2])
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(160, 8, generator=g), torch.randint(0, 3, (160,), generator=g)),
                    batch_size=4)
for i, (x, y) in enumerate(loader):
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(compiled(x), y)
    loss.backward()
    opt.step()
    if i % 10 == 0:
        print(i, round(loss.item(), 6))
torch.save(model.state_dict(), sys.argv[1])
"""


@pytest.mark.parametrize("backend", ["aot_eager"])
def test_a_model_compiled_before_the_first_step_trains_as_it_does_bare(diag_cli, write_script, tmp_path, backend):
    """torch.compile with an AOTAutograd backend (aot_eager here; inductor, the default, the same way)
    traces with torch.fx between dynamo's tracing of the frame and the guards it builds, and the probe
    lifts its hooks out of the way of torch.fx. The discovery window's global hooks were removed and
    registered again under new ids, and the guards dynamo had built on them by id failed: the script
    died at its first step (InternalTorchDynamoError: KeyError: 127). They are put back under their ids
    now (marks.lift_global_hooks). The same run ends with the bare run's weights and output, and
    torch.compile's own work (its autograd.grad, its detect_anomaly) is not the script's."""
    script = write_script("compiled_first.py", COMPILED_FIRST)
    bare = subprocess.run([sys.executable, str(script), str(tmp_path / "bare.pt"), backend], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert bare.returncode == 0, bare.stderr[-3000:]
    r = diag_cli("check", "--script", str(script), "--format", "json", "--", str(tmp_path / "probe.pt"), backend,
                 timeout=300)
    assert r.code == 0, r.stderr[-3000:]
    assert "InternalTorchDynamoError" not in r.stderr and "Error while creating guard" not in r.stderr
    assert r.json()["summary"]["steps"] == 40
    run_dir = next((tmp_path / ".diag" / "runs").iterdir())
    # AOTAutograd's own torch.autograd.grad, tracing the backward graph while it compiles, is not a
    # backward of the script's (it was counted: steps 1 and 2 had two backwards, the first 5x longer)
    rank = json.loads((run_dir / "evidence.json").read_text())["ranks"][0]
    assert [s["n_backward"] for s in rank["steps"]] == [1] * 40
    # AOTAutograd traces under detect_anomaly(check_nan=False): not the script's anomaly detection (it was
    # located at the compiled model's call, and the debug watch it set kept the probe's lane off all run)
    debug = rank["extras"]["debug"]
    assert debug["anomaly_location"] is None and debug["profiler_created"] == 0, debug
    assert (run_dir / "log.txt").read_text().splitlines()[-4:] == bare.stdout.splitlines()[-4:]
    a, b = torch.load(tmp_path / "bare.pt"), torch.load(tmp_path / "probe.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


COMPILED_OPTIMIZER_STEP = """
import sys
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


@torch.compile(backend="eager")
def opt_step():
    opt.step()


g = torch.Generator().manual_seed(0)
loader = DataLoader(TensorDataset(torch.randn(160, 8, generator=g), torch.randint(0, 3, (160,), generator=g)),
                    batch_size=8)
for i, (x, y) in enumerate(loader):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt_step()
    if i % 5 == 0:
        print(i, round(loss.item(), 6))
torch.save(model.state_dict(), sys.argv[1])
"""


def test_a_compiled_optimizer_step_trains_as_it_does_bare(diag_cli, write_script, tmp_path):
    """Only the optimizer step compiled (PyTorch's "compiling the optimizer" recipe), the model plain: the
    FLOP counter took the model for an eager one and counted step 3 with FlopCounterMode on, over the
    compiled step; the mode's exit left the Python dispatch key on and the script's next DataLoader
    fetch raised (RuntimeError: INTERNAL ASSERT FAILED ... PythonFallbackKernel). A process that calls
    torch.compile at all is not counted now (the FLOPs are estimated, as for a compiled model)."""
    script = write_script("compiled_step.py", COMPILED_OPTIMIZER_STEP)
    bare = subprocess.run([sys.executable, str(script), str(tmp_path / "bare.pt")], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert bare.returncode == 0, bare.stderr[-3000:]
    r = diag_cli("check", "--script", str(script), "--format", "json", "--", str(tmp_path / "probe.pt"), timeout=300)
    assert r.code == 0, r.stderr[-3000:]
    assert r.json()["summary"]["steps"] == 20
    run_dir = next((tmp_path / ".diag" / "runs").iterdir())
    assert (run_dir / "log.txt").read_text().splitlines()[-4:] == bare.stdout.splitlines()[-4:]
    a, b = torch.load(tmp_path / "bare.pt"), torch.load(tmp_path / "probe.pt")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    flops = json.loads((run_dir / "evidence.json").read_text())["ranks"][0]["flops"]
    assert flops["measured"]["method"] == "analytic", flops
