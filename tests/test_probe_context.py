"""The probe-extension interface (diag.probe.context) and the hook-removal helpers (diag.probe.hooks)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn.modules import module as nn_module  # noqa: E402

from diag.probe.context import HOOKS, Extension, ProbeContext  # noqa: E402
from diag.probe.core import Probe  # noqa: E402
from diag.probe.hooks import Patches, remove_hooks  # noqa: E402


class Recorder:
    """An extension written against the protocol alone: no base class, no probe internals."""

    def __init__(self):
        self.calls: list[str] = []
        self.models: list[int] = []

    def install(self, ctx: ProbeContext) -> None:
        self.calls.append("install")
        ctx.emit("set", path="extras.recorder", value={"installed": True, "world": ctx.world_size})

    def on_model(self, ctx: ProbeContext, module, info) -> None:
        self.models.append(info["id"])
        assert ctx.model_id(module) == info["id"]

    def on_step_start(self, ctx: ProbeContext, index: int) -> None:
        assert ctx.current_step is not None and ctx.current_step.index == index
        self.calls.append(f"start {index}")

    def on_forward(self, ctx: ProbeContext, module, args, kwargs, output, training) -> None:
        assert ctx.is_live() and training and ctx.last_model() is module
        self.calls.append("forward")

    def on_step_end(self, ctx: ProbeContext, step: dict) -> None:
        step["extra"]["recorder_seen"] = step["index"]
        ctx.emit("append", path="extras.recorder_steps", value=step["index"])
        self.calls.append(f"end {step['index']}")

    def on_exit(self, ctx: ProbeContext, status: str) -> None:
        self.calls.append(f"exit {status} after {ctx.steps_done}")

    def uninstall(self, ctx: ProbeContext) -> None:
        self.calls.append("uninstall")


def _train(probe, steps: int = 2):
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe.install()
    try:
        for _ in range(steps):
            loss = model(torch.randn(3, 4)).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        probe.finish("completed", 0)
    finally:
        probe.uninstall()
    return model


def test_an_extension_written_against_the_protocol_receives_events_and_can_emit():
    events: list[dict] = []
    ext = Recorder()
    assert isinstance(ext, Extension)
    probe = Probe(events.append, extensions=[ext])
    _train(probe)
    assert ext.calls == ["install", "start 1", "forward", "end 1", "start 2", "forward", "end 2",
                         "exit completed after 2", "uninstall"]
    assert ext.models == [1]
    sets = [e for e in events if e["kind"] == "set" and e["path"] == "extras.recorder"]
    assert sets and sets[0]["value"] == {"installed": True, "world": 1} and sets[0]["rank"] == 0
    assert [e["value"] for e in events if e.get("path") == "extras.recorder_steps"] == [1, 2]
    steps = [e for e in events if e["kind"] == "step"]
    assert [s["extra"]["recorder_seen"] for s in steps] == [1, 2]
    assert not [e for e in events if e["kind"] == "probe_error"]


def test_the_probe_offers_every_documented_context_member():
    probe = Probe(lambda e: None)
    for name in ("rank", "local_rank", "world_size", "max_steps", "steps_done", "epoch", "current_step",
                 "forward_start", "step_closed_at", "forward_counts_samples", "manual_mode"):
        assert hasattr(probe, name), name
    for name in ("now", "emit", "report_error", "is_live", "model_id", "models", "last_model",
                 "optimizer_info", "is_top_forward", "phase", "paused", "disable"):
        assert callable(getattr(probe, name)), name
    assert set(HOOKS) >= {"install", "uninstall", "on_forward", "on_step_end"}


def test_an_extension_that_raises_is_reported_once_and_disabled_and_the_run_goes_on():
    events: list[dict] = []

    class Broken:
        def __init__(self):
            self.n = 0

        def on_step_end(self, ctx, step):
            self.n += 1
            raise ValueError("boom")

    ext, ok = Broken(), Recorder()
    probe = Probe(events.append, extensions=[ext, ok])
    _train(probe, steps=3)
    errors = [e for e in events if e["kind"] == "probe_error"]
    assert len(errors) == 1 and errors[0]["where"] == "Broken.on_step_end" and "boom" in errors[0]["error"]
    assert ext.n == 1 and ext not in probe.extensions
    assert [e["index"] for e in events if e["kind"] == "step"] == [1, 2, 3]
    assert ok.calls.count("forward") == 3


def test_report_error_is_once_per_place_and_never_raises():
    events: list[dict] = []
    probe = Probe(events.append)
    probe.report_error("x", RuntimeError("one"))
    probe.report_error("x", RuntimeError("two"))
    probe.report_error("y", RuntimeError("three"))
    assert [(e["where"], e["error"]) for e in events] == [("x", "RuntimeError: one"), ("y", "RuntimeError: three")]

    def bad_sink(event):
        raise OSError("disk full")

    Probe(bad_sink).report_error("z", RuntimeError("lost"))   # swallowed


def test_paused_stops_recording_and_restores():
    events: list[dict] = []
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = Probe(events.append)
    probe.install()
    try:
        with probe.paused() as ctx:
            assert ctx is probe and not probe.is_live()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        assert probe.is_live()
        assert not [e for e in events if e["kind"] in ("model", "step")]
        assert probe.optimizer_info(opt, create=False) is None
        assert probe._opt_start == {}
    finally:
        probe.uninstall()


def test_phase_and_top_forward_are_seen_from_an_extension_hook():
    seen: list[tuple] = []
    probe = Probe(lambda e: None)

    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            seen.append((probe.phase(), probe.is_top_forward(self), probe.is_top_forward(self.lin)))
            return self.lin(x)

    m = Inner()
    probe.install()
    try:
        assert probe.phase() == "other"
        m(torch.randn(2, 4))
    finally:
        probe.uninstall()
    assert seen == [("forward", True, False)]
    assert probe.models() == [m] and probe.model_id(m) == 1 and probe.model_id(m.lin) is None


def test_remove_hooks_removes_every_handle_even_when_one_fails_and_empties_the_list():
    before = len(nn_module._global_forward_pre_hooks)

    class Failing:
        removed = False

        def remove(self):
            Failing.removed = True
            raise RuntimeError("already gone")

    handles = [nn_module.register_module_forward_pre_hook(lambda m, a: None), Failing(),
               nn_module.register_module_forward_pre_hook(lambda m, a: None)]
    assert len(nn_module._global_forward_pre_hooks) == before + 2
    remove_hooks(handles)
    assert Failing.removed and handles == []
    assert len(nn_module._global_forward_pre_hooks) == before
    remove_hooks(handles)   # a second call does nothing


def test_patches_restore_own_inherited_and_instance_attributes_newest_first():
    class Base:
        def f(self):
            return "base"

    class Owner(Base):
        def g(self):
            return "g"

    obj = Owner()
    p = Patches()
    assert p.patch(Owner, "g", lambda self: "patched g")(obj) == "g"
    assert p.patch(Owner, "f", lambda self: "patched f") is None          # inherited: nothing of its own
    p.patch(Owner, "g", lambda self: "patched twice")
    p.patch_instance(obj, "h", lambda: "instance")
    assert (obj.g(), obj.f(), obj.h()) == ("patched twice", "patched f", "instance") and len(p) == 4
    p.undo()
    assert (obj.g(), obj.f()) == ("g", "base") and "f" not in Owner.__dict__ and not hasattr(obj, "h")
    assert not p
    p.undo()   # idempotent


def test_probe_uninstall_restores_torch():
    from torch.utils.data import dataloader as dl

    originals = (dl.DataLoader.__dict__["__iter__"], dl._BaseDataLoaderIter.__dict__["__next__"],
                 torch.optim.Optimizer.__dict__["zero_grad"], len(nn_module._global_forward_hooks))
    probe = Probe(lambda e: None)
    probe.install()
    assert dl.DataLoader.__dict__["__iter__"] is not originals[0]
    probe.uninstall()
    assert (dl.DataLoader.__dict__["__iter__"], dl._BaseDataLoaderIter.__dict__["__next__"],
            torch.optim.Optimizer.__dict__["zero_grad"], len(nn_module._global_forward_hooks)) == originals


def test_the_probe_imports_no_catalogue_thresholds_or_checks():
    import ast
    import pathlib

    import diag.probe

    banned = ("diag.cost.catalog", "diag.thresholds", "diag.checks", "checks", "diag.registry")
    for path in pathlib.Path(diag.probe.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            for n in names:
                assert not any(n == b or n.startswith(b + ".") for b in banned), f"{path.name} imports {n}"


def test_memory_planning_does_not_import_the_probe():
    import ast
    import pathlib

    import diag.memory

    for path in pathlib.Path(diag.memory.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("diag.probe"), path.name
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("diag.probe") for a in node.names), path.name
