"""The lane's call (issue 28, diag.probe.handover.HandOver.take_call): while the probe's lane is on, the
lane's model is called through torch's own instance door (``_compiled_call_impl``) with the probe's two
hooks taken out of it, so that its forward runs on torch's fast path. Nothing of it may reach the user:
what pickles, copies, saves, traces or compiles the model in the middle of the run sees the model as it
is bare, the run computes what it computes bare, and nothing is left on the model at the end."""
from __future__ import annotations

import copy
import gc
import io
import pickle

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402


class Stateful(nn.Module):
    """A model whose class hands its whole ``__dict__`` to pickle (no ``_compiled_call_impl`` left out:
    torch's ``Module.__getstate__`` is not called)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)

    def __getstate__(self):
        return dict(self.__dict__)


def _loop(at, steps: int = 120, model_cls=Stateful):
    """A plain loop; ``at(i, model, x)`` runs before step ``i``'s forward. Returns the model."""
    torch.manual_seed(0)
    model = model_cls()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(steps * 4, 8, generator=g), torch.randint(0, 3, (steps * 4,), generator=g))
    for i, (x, y) in enumerate(DataLoader(data, batch_size=4)):
        at(i, model, x)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model


def _under_probe(fn, monkeypatch):
    from diag.probe.core import Probe

    monkeypatch.setenv("DIAG_PROBE_LANE", "1")
    monkeypatch.setenv("DIAG_PROBE_LANE_CALL", "1")
    monkeypatch.setenv("DIAG_PROBE_BUDGET", "0.0001%")     # every step but 1 in 64 unsampled: the lane's
    gc.collect()
    events: list = []
    probe = Probe(events.append, script=__file__)
    probe.install()
    try:
        out = fn()
    finally:
        probe.finish("completed", 0)
        probe.uninstall()
    return out, probe, events


def _calls_itself(model) -> bool:
    f = model.__dict__.get("_compiled_call_impl")
    return f is not None and getattr(f, "__name__", "") == "diag_lane_call"


def test_a_model_pickled_copied_saved_and_traced_mid_run_is_the_bare_ones(monkeypatch):
    seen: dict = {}

    def at(i, model, x):
        if i in (50, 90):
            seen.setdefault("on", []).append(_calls_itself(model))
            blob = pickle.dumps(model)
            seen.setdefault("pickled", []).append(blob)
            back = pickle.loads(blob)
            twin = copy.deepcopy(model)
            buf = io.BytesIO()
            torch.save(model, buf)
            buf.seek(0)
            loaded = torch.load(buf, weights_only=False)
            for what, m in (("pickled", back), ("deep copy", twin), ("saved", loaded), ("copy", copy.copy(model))):
                # (the probe hooks a copy made in its process as it hooks any new model: HandOver.restored)
                assert "_compiled_call_impl" not in m.__dict__, (what, i)
            with torch.no_grad():
                traced = torch.jit.trace(model, x)
                seen.setdefault("outs", []).append((back(x), twin(x), loaded(x), traced(x)))

    bare = _loop(at)
    bare_seen, seen = seen, {}
    model, probe, events = _under_probe(lambda: _loop(at), monkeypatch)
    # the lane's call was on at both points (the test saw the case it is about) and gone at the end
    assert seen["on"] == [True, True], seen["on"]
    assert not bare_seen["on"][0]
    assert "_compiled_call_impl" not in model.__dict__
    assert not model._forward_pre_hooks and not model._forward_hooks
    for blob in seen["pickled"]:
        assert b"diag" not in blob
    for a, b in zip(bare_seen["outs"], seen["outs"]):
        for x, y in zip(a, b):
            assert torch.equal(x, y)
    for k, v in bare.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    assert probe._lane.steps > 60 and not [e for e in events if e["kind"] == "probe_error"]


def test_a_model_compiled_in_place_mid_run_keeps_its_compiled_call(monkeypatch):
    """``model.compile()`` in the middle of the run (torch.compile through the probe's wrapper): the
    lane's call is given back first, torch's compiled call is the model's from then on, and the run's
    weights are the bare run's."""
    pytest.importorskip("torch._dynamo")
    seen: dict = {}

    def at(i, model, x):
        if i == 50:
            seen["on"] = _calls_itself(model)
            model.compile(backend="eager")

    def run():
        model = _loop(at, steps=80)
        return model, model.__dict__.get("_compiled_call_impl")

    torch._dynamo.reset()
    bare, _ = _loop(at, steps=80), None
    torch._dynamo.reset()
    (model, call), probe, _events = _under_probe(run, monkeypatch)
    torch._dynamo.reset()
    assert seen["on"] is True
    assert call is not None and getattr(call, "__name__", "") != "diag_lane_call"
    for k, v in bare.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    assert probe._handover.calls_taken >= 1


def test_no_call_where_the_model_has_hooks_of_its_own(monkeypatch):
    """A model with a forward hook of the script's (a framework's) keeps the probe's hooks: its call
    takes torch's hooked path anyway, and the hooks run in their order."""
    calls = []

    def at(i, model, x):
        if i == 0:
            model.register_forward_hook(lambda m, a, out: calls.append(1))

    _model, probe, _events = _under_probe(lambda: _loop(at, steps=100), monkeypatch)
    assert probe._lane.steps > 40 and probe._handover.calls_taken == 0
    assert len(calls) == 100


def test_the_call_needs_torchs_door():
    """The lane's call is bound only where ``Module.__call__`` is torch's ``_wrapped_call_impl`` and
    ``Module.__getstate__`` leaves ``_compiled_call_impl`` out (torch >= 2.1): this torch has both."""
    from diag.probe import handover

    handover._bind_call()
    assert handover._CALL is not None and handover._CALL[0] is nn.Module.__call__


class CopiesItsDict(Stateful):
    """The classic ``__copy__`` recipe: a new object with this one's ``__dict__`` as it is."""

    def __copy__(self):
        new = type(self).__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new


def test_no_call_on_a_model_whose_class_copies_itself(monkeypatch):
    """A class with its own ``__copy__``/``__deepcopy__`` may copy its ``__dict__`` as it is, the lane's
    call included (whose calls would run this model): such a model keeps the probe's hooks."""
    seen = []

    def at(i, model, x):
        if i == 60:
            twin = copy.copy(model)
            twin.net = nn.Sequential(nn.Linear(8, 3))
            seen.append((twin(x).shape, model(x).shape))

    _model, probe, _events = _under_probe(lambda: _loop(at, steps=100, model_cls=CopiesItsDict), monkeypatch)
    assert probe._lane.steps > 20 and probe._handover.calls_taken == 0
    assert seen == [(torch.Size([4, 3]), torch.Size([4, 3]))]


@pytest.mark.parametrize("lane", ["1", "0"])
def test_the_probe_keeps_no_model_or_optimizer_alive(lane, monkeypatch):
    """A script that drops its model and optimizer (a sweep in one process, a model freed before the
    next one is built) frees them under the probe as it does bare: the probe, still installed, holds
    neither (the outermost forward's module was kept until the next forward, and with it the model's
    memory: on a GPU, memory the script freed bare and not under diag)."""
    import weakref

    from diag.probe.core import Probe

    monkeypatch.setenv("DIAG_PROBE_LANE", lane)
    monkeypatch.setenv("DIAG_PROBE_BUDGET", "0.0001%")
    gc.collect()
    probe = Probe(lambda e: None, script=__file__)
    probe.install()
    try:
        refs = []
        for _run in range(2):
            model = _loop(lambda i, m, x: None, steps=60)
            refs.append(weakref.ref(model))
            del model
            gc.collect()
        assert probe._lane.steps > 20 or lane == "0"
        assert [r() for r in refs] == [None, None]
        assert not [o for o in gc.get_objects() if isinstance(o, torch.optim.Optimizer)]
    finally:
        probe.finish("completed", 0)
        probe.uninstall()


@pytest.mark.parametrize("wrap", ["DataParallel", "Sequential"])
def test_a_model_wrapped_mid_run_gets_its_hooks_back_first(wrap, monkeypatch):
    """The lane's model made another module's child in the middle of the run (DataParallel, whose
    replicas copy the module's ``__dict__`` as it is; any wrapper): the lane's call is given back when
    the child is registered, before the parent's first forward; the run computes what it does bare."""
    seen: dict = {}

    class Loop:
        def __init__(self):
            self.wrapped = None

        def __call__(self, i, model, x):
            if i == 50:
                seen["before"] = _calls_itself(model)
                self.wrapped = nn.DataParallel(model) if wrap == "DataParallel" else nn.Sequential(model)
                seen["after"] = "_compiled_call_impl" in model.__dict__
            if self.wrapped is not None:
                with torch.no_grad():
                    seen.setdefault("outs", []).append(self.wrapped(x))

    bare = _loop(Loop())
    bare_outs, seen = seen.pop("outs"), {}
    model, probe, events = _under_probe(lambda: _loop(Loop()), monkeypatch)
    assert seen["before"] is True and seen["after"] is False
    for a, b in zip(bare_outs, seen["outs"]):
        assert torch.equal(a, b)
    for k, v in bare.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k
    assert not [e for e in events if e["kind"] == "probe_error"]
