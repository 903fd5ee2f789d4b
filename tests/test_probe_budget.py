"""The probe keeps its per-step extras within its cost budget (issue 28): an extension that honours
``ctx.sampled`` (``SAMPLED_EXTRAS``) and costs more than 1% of a short step runs on sampled steps only;
the core step accounting still records every step; the evidence says which steps were sampled and
at what rate."""
from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from diag.evidence import events as E  # noqa: E402
from diag.probe.budget import CORE_UNSEEN, FIRST  # noqa: E402
from diag.probe.core import Probe  # noqa: E402


class CostlyExtras:
    """Spends ``cost_s`` of its own at each sampled step's end (what a CUDA-event timeline costs), or
    ``share`` of the step it ends when that is more (a cost relative to the step measured in the same
    run: a loaded machine that stretches the steps stretches the extras with them)."""
    SAMPLED_EXTRAS = True

    def __init__(self, cost_s: float, share: float = 0.0):
        self.cost_s = cost_s
        self.share = share
        self.worked: list[int] = []
        self.told: list[bool] = []

    def install(self, ctx):
        pass

    def on_step_start(self, ctx, index):
        self.told.append(ctx.sampled)

    def on_step_end(self, ctx, step):
        if step.get("sampled", True):
            self.worked.append(step["index"])
            end = time.perf_counter() + max(self.cost_s, self.share * step["total_s"])
            while time.perf_counter() < end:
                pass

    def uninstall(self, ctx):
        pass


class Cheap:
    """An extension that does not honour the budget: no budget runs for it."""

    def install(self, ctx):
        pass

    def on_step_end(self, ctx, step):
        pass

    def uninstall(self, ctx):
        pass


def _run(ext, steps: int, monkeypatch, budget: str | None = None):
    if budget is None:
        monkeypatch.delenv("DIAG_PROBE_BUDGET", raising=False)
    else:
        monkeypatch.setenv("DIAG_PROBE_BUDGET", budget)
    events: list[dict] = []
    probe = Probe(events.append, extensions=[ext])
    model = nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 64)
    probe.install()
    try:
        for _ in range(steps):
            loss = model(x).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            # the step: ~2 ms of the script's own work, so that 1% of it is ~20 µs
            end = time.perf_counter() + 0.002
            while time.perf_counter() < end:
                pass
        probe.finish("completed", 0)
    finally:
        probe.uninstall()
    return events


def test_costly_extras_are_sampled_and_every_step_is_still_recorded(monkeypatch):
    ext = CostlyExtras(cost_s=0.0005, share=0.5)   # half a step: 50 times the 1% budget, loaded or not
    events = _run(ext, 200, monkeypatch)
    steps = [e for e in events if e["kind"] == E.STEP]
    assert [s["index"] for s in steps] == list(range(1, 201))      # the core records every step
    unsampled = [s["index"] for s in steps if s.get("sampled") is False]
    sampled = [s["index"] for s in steps if s.get("sampled", True)]
    assert set(range(1, FIRST + 1)) <= set(sampled)               # the first steps always sampled
    assert len(unsampled) > len(sampled)                          # most steps skip the extras
    assert ext.worked == sampled                                  # the extension worked on those only
    # on_step_start saw the same decision the step event carries
    assert [bool(t) for t in ext.told] == [s.get("sampled", True) for s in steps]
    changes = [e for e in events if e["kind"] == E.PROBE_SAMPLING]
    assert changes and changes[0]["period"] > 1 and changes[0]["budget"] == pytest.approx(0.01)
    assert "step" in changes[0]["reason"]
    # the core priced as the probe prices it: CORE_UNSEEN times what its timers saw (both recorded)
    assert changes[0]["core_s"] == pytest.approx(CORE_UNSEEN * changes[0]["core_timed_s"], rel=1e-3, abs=1e-8)
    # the pattern is evenly spread: a constant period between sampled steps after the first ones
    later = [i for i in sampled if i > changes[-1]["step"]]
    gaps = {b - a for a, b in zip(later, later[1:])}
    assert gaps == {changes[-1]["period"]}, (later, changes)


def test_budget_off_samples_every_step(monkeypatch):
    ext = CostlyExtras(cost_s=0.0005)
    events = _run(ext, 40, monkeypatch, budget="off")
    steps = [e for e in events if e["kind"] == E.STEP]
    assert len(steps) == 40 and all(s.get("sampled", True) for s in steps)
    assert not [e for e in events if e["kind"] == E.PROBE_SAMPLING]
    assert len(ext.worked) == 40


def test_no_budget_without_an_extension_that_honours_it(monkeypatch):
    events = _run(Cheap(), 40, monkeypatch)
    steps = [e for e in events if e["kind"] == E.STEP]
    assert len(steps) == 40 and all("sampled" not in s for s in steps)
    assert not [e for e in events if e["kind"] == E.PROBE_SAMPLING]


def test_a_bad_budget_is_reported_once_and_the_default_used(monkeypatch):
    ext = CostlyExtras(cost_s=0.0005)
    events = _run(ext, 60, monkeypatch, budget="lots")
    errors = [e for e in events if e["kind"] == E.PROBE_ERROR and e["where"] == "budget"]
    assert len(errors) == 1 and "DIAG_PROBE_BUDGET" in errors[0]["error"]
    assert any(s.get("sampled") is False for s in events if s["kind"] == E.STEP)
