"""The backward is timed by wrapping torch.autograd.backward / grad (issue 20): one Python call per
backward, no hook registered per forward, no callback from the autograd engine. These tests run the
real probe on tiny CPU models."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import handover_scenarios as proto  # noqa: E402  (tests/handover_scenarios.py: _mlp, _train)
from torch import nn  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

from diag.probe.core import Probe  # noqa: E402


def _probe(monkeypatch):
    monkeypatch.setenv("DIAG_PROBE_HANDOVER", "1")
    events: list[dict] = []
    probe = Probe(events.append)
    probe.install()
    return probe, events


def _steps(events):
    return [e for e in events if e["kind"] == "step"]


def _train(monkeypatch, n: int):
    """The real probe over ``n`` steps of handover_scenarios' MLP: (probe, events), uninstalled."""
    probe, events = _probe(monkeypatch)
    try:
        proto._train(proto._mlp(), n)
        probe.finish("completed", 0)
    finally:
        probe.uninstall()
    return probe, events


def test_the_wrapper_replaces_and_restores_torch_autograd_backward(monkeypatch):
    orig_backward, orig_grad = torch.autograd.backward, torch.autograd.grad
    probe, _ = _probe(monkeypatch)
    try:
        assert probe._bwd_wrapped
        assert torch.autograd.backward is not orig_backward and torch.autograd.backward.__wrapped__ is orig_backward
        assert torch.autograd.grad.__wrapped__ is orig_grad
        assert torch.autograd.backward.__name__ == "backward" and torch.autograd.grad.__doc__ == orig_grad.__doc__
    finally:
        probe.uninstall()
    assert torch.autograd.backward is orig_backward and torch.autograd.grad is orig_grad


def test_each_step_has_one_timed_backward_and_no_hook_on_the_output(monkeypatch):
    import diag.probe.core as core

    hooked = []
    monkeypatch.setattr(core, "on_backward", lambda t, fn: hooked.append(t))
    probe, events = _train(monkeypatch, 6)
    steps = _steps(events)
    assert len(steps) == 6
    assert all(s["n_backward"] == 1 and s["backward_s"] > 0 for s in steps)
    assert hooked == [] and probe._bwd_calls == 0     # nothing on the output; the engine never called the probe


def test_autograd_grad_counts_as_a_backward_and_a_reentrant_checkpoint_is_not_counted_twice(monkeypatch):
    """torch.autograd.grad (a training loop that sets .grad itself) is a backward, as it was when the
    probe hooked the output; the reentrant checkpoint's own torch.autograd.backward inside the outer
    backward is part of it, and its recomputed forward is not a forward of the step."""
    probe, events = _probe(monkeypatch)
    block = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    head = nn.Linear(8, 4)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block, self.head = block, head

        def forward(self, x):
            return self.head(checkpoint(self.block, x, use_reentrant=True))

    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        for _ in range(3):                           # .backward() through a reentrant checkpoint
            opt.zero_grad()
            x = torch.randn(4, 8, requires_grad=True)
            model(x).sum().backward()
            opt.step()
        plain = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
        opt = torch.optim.SGD(plain.parameters(), lr=0.01)
        for _ in range(3):                           # torch.autograd.grad, gradients set by hand (a
            opt.zero_grad()                          # reentrant checkpoint does not support it)
            params = list(plain.parameters())
            grads = torch.autograd.grad(plain(torch.randn(4, 8)).sum(), params)
            for p, g in zip(params, grads):
                p.grad = g
            opt.step()
        probe.finish("completed", 0)
    finally:
        probe.uninstall()
    steps = _steps(events)
    assert len(steps) == 6
    assert [s["n_backward"] for s in steps] == [1] * 6
    assert [s["n_forward"] for s in steps] == [1] * 6     # the recomputation is not a second forward
    assert all(s["backward_s"] > 0 for s in steps)


def test_a_backward_that_raises_leaves_the_probe_out_of_backward(monkeypatch):
    probe, events = _probe(monkeypatch)
    model = nn.Linear(4, 2)
    try:
        out = model(torch.randn(3, 4)).sum()
        out.backward()
        with pytest.raises(RuntimeError):
            out.backward()                 # the graph was freed: torch raises
        assert probe.in_backward is False
        model(torch.randn(3, 4))           # a forward after it is seen (not taken for a recomputation)
        assert probe.depth == 0
    finally:
        probe.uninstall()


def test_without_the_wrapper_the_output_hooks_time_the_backward(monkeypatch):
    """If torch.autograd cannot be wrapped, the probe falls back to a pre-hook on each training
    forward's output node and says why (a probe_error event): the steps are the same."""
    def broken(self, torch):
        raise RuntimeError("no wrapping here")

    monkeypatch.setattr(Probe, "_wrap_backward", broken)
    probe, events = _train(monkeypatch, 4)
    assert not probe._bwd_wrapped
    assert any(e["kind"] == "probe_error" and "autograd.backward" in e.get("where", "") for e in events)
    steps = _steps(events)
    assert len(steps) == 4 and all(s["n_backward"] == 1 and s["backward_s"] > 0 for s in steps)
    assert probe._bwd_calls >= 4     # the engine called the probe's hook once per backward
