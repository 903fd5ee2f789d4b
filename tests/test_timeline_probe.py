"""The timeline extension inside the real probe, on a CPU: the probe's hooks (the new ``on_data``
included) drive it in a real DataLoader loop; a host-backed clock stands in for CUDA events."""
from __future__ import annotations

import time

import pytest

from diag.evidence import Evidence
from diag.fold import fold
from diag.probe.core import Probe
from diag.probe.extensions import DEFAULT_EXTENSIONS, load_extensions
from diag.probe.timeline import TimelineProbe

torch = pytest.importorskip("torch")


class HostClock:
    """Events that complete at once, stamped with the host clock (a CPU stand-in for CUDA events)."""

    def __init__(self):
        self.labels = []

    def now(self):
        return time.perf_counter()

    def record(self):
        return time.perf_counter()

    def query(self, h):
        return True

    def elapsed_ms(self, a, b):
        return (b - a) * 1e3


class Recording(TimelineProbe):
    """Remembers the marks' labels in order (to check where the probe's hooks put them)."""

    def install(self, ctx):
        super().install(ctx)
        self._on = True     # as if a CUDA model had been seen
        rec = self.rec
        orig = rec.mark

        def mark(label):
            self._clock.labels.append(label)
            orig(label)

        rec.mark = mark


def test_marks_follow_a_real_dataloader_loop():
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    events = []
    clock = HostClock()
    ext = Recording(clock=clock)
    probe = Probe(events.append, extensions=[ext]).install()
    try:
        model = nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=8)
        for x, y in data:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        probe.finish("completed")
    finally:
        probe.uninstall()
    # one step: its data fetch, the step opening, the forward, the optimizer, the end
    assert clock.labels[:6] == ["data_start", "data_end", "step_start", "forward_end", "optimizer_start", "step_end"]
    assert clock.labels.count("step_end") == 8
    ev = Evidence()
    for e in events:
        fold(ev, e)
    tl = ev.primary.timeline
    assert len(tl.steps) == 8 and tl.resolved == 8 and tl.dropped == 0
    st = tl.steps[-1]
    assert set(st["phases"]) >= {"data", "forward", "backward", "optimizer", "between"}
    assert st["busy_s"] + st["idle_s"] == pytest.approx(st["device_s"], abs=1e-6)
    # uninstalled: the optimizer pre-hook is gone
    n = len(clock.labels)
    opt.step()
    assert len(clock.labels) == n


def test_default_extensions_include_the_timeline_and_it_leaves_cpu_runs_alone():
    assert "diag.probe.timeline:TimelineProbe" in DEFAULT_EXTENSIONS
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    events = []
    exts = load_extensions()
    probe = Probe(events.append, extensions=exts).install()
    try:
        assert not any(isinstance(e, TimelineProbe) for e in probe.extensions)   # removed at install
    finally:
        probe.uninstall()
