"""The probe's per-step fast paths (issue 28): the step event goes straight onto the file sink's writer
queue (``FileSink.step_path``/``TaggedSink.step_path``) and the hooks' common cases are inlined. What
the evidence records must not change: the same step events, with the same keys and values, as through
the sinks' calls; and the fast path stops where the call would have stopped (closed, a disk error)."""
from __future__ import annotations

import json
import os

import pytest

from diag.probe.sink import FileSink
from diag.probe.watchdog import TaggedSink

torch = pytest.importorskip("torch")


def _train(probe, steps: int = 12, batch: int = 4) -> None:
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3))
    ds = TensorDataset(torch.randn(steps * batch, 8), torch.randint(0, 3, (steps * batch,)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe.install()
    try:
        for x, y in DataLoader(ds, batch_size=batch):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        probe.finish("completed", 0)
    finally:
        probe.uninstall()


def _steps(events):
    return [e for e in events if e.get("kind") == "step"]


def test_step_events_through_the_fast_path_match_the_sinks_calls(tmp_path, monkeypatch):
    from diag.probe.core import Probe

    monkeypatch.setenv("DIAG_RUN_ID", "r1")
    path = str(tmp_path / "ev.jsonl")
    sink = TaggedSink(FileSink(path), path)
    fast = Probe(sink, script=__file__)
    _train(fast)
    sink.close()
    with open(path) as f:
        got = _steps(json.loads(line) for line in f)
    assert fast._step_sink is not None and fast._step_sink[1] is not None   # the fast path was taken

    seen: list = []
    slow = Probe(lambda ev: seen.append(dict(ev, run="r1")), script=__file__)   # a callback: no fast path
    _train(slow)
    want = _steps(seen)
    assert slow._step_sink[1] is None
    assert [s["index"] for s in got] == [s["index"] for s in want] == list(range(1, 13))
    for a, b in zip(got, want):
        assert list(a) == list(b)                    # the same keys, in the same order
        assert a["run"] == "r1" and a["rank"] == 0 and a["kind"] == "step"
        assert a["samples"] == b["samples"] == 4
        for k in ("data_s", "forward_s", "backward_s", "optimizer_s", "total_s", "t", "probe_s"):
            assert isinstance(a[k], float) and a[k] >= 0.0, k
        assert a["forward_counts"] == b["forward_counts"]
        assert a["total_s"] >= a["forward_s"] + a["backward_s"] + a["optimizer_s"]
    assert [s["t"] for s in got] == sorted(s["t"] for s in got)


def test_the_fast_path_is_off_before_the_writer_runs_after_close_and_after_a_disk_error(tmp_path):
    path = str(tmp_path / "ev.jsonl")
    fs = FileSink(path)
    tagged = TaggedSink(fs, path)
    tagged.run_id = "r2"
    got = tagged.step_path()
    assert got == (fs, {"run": "r2"})
    assert fs.ready is False                        # no writer thread yet: the first call starts it
    tagged({"kind": "step", "index": 1})
    assert fs.ready is True
    fs.defer({"kind": "step", "index": 2, "run": "r2"})
    tagged.close()
    assert fs.ready is False
    with open(path) as f:
        assert [json.loads(line)["index"] for line in f] == [1, 2]

    # a full disk: the wrapper stops everything, its file sink's fast path too
    fs2 = FileSink(str(tmp_path / "ev2.jsonl"))
    t2 = TaggedSink(fs2)
    t2({"kind": "step", "index": 1})
    assert fs2.ready

    def full(*a):
        raise OSError(28, "No space left on device")

    fs2._write = full
    t2({"kind": "set", "path": "x", "value": 1})   # written in place: the error reaches the wrapper
    assert t2.disk_error and fs2.ready is False
    assert t2.step_path() is None
    fs2._closed = True
    os.close(fs2._fd)


def test_a_file_sink_that_writes_in_place_has_no_fast_path(tmp_path):
    fs = FileSink(str(tmp_path / "ev.jsonl"), defer_steps=False)
    try:
        assert fs.step_path() is None and TaggedSink(fs).step_path() is None
    finally:
        fs.close()
