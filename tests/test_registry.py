"""diag.registry: discovery through entry points, selection, crash isolation."""
from __future__ import annotations

import pytest

from diag.errors import DiagError
from diag.evidence import Evidence
from diag.findings import Severity
from diag.registry import CheckSpec, Registry, check, run_one


def test_registry_discovers_builtins_through_entry_points():
    reg = Registry.discover()
    ids = {s.id for s in reg.specs}
    assert {"eval.no-grad", "dataloader.workers", "memory.oom", "run.failed", "run.no-steps"} <= ids
    assert all(s.source == "builtin" for s in reg.specs if s.id.startswith(("eval.", "run.")))
    assert reg.problems == []


def test_select_and_ignore_by_prefix():
    reg = Registry.discover()
    assert {s.id for s in reg.select(["run"]).specs} == {"run.failed", "run.hung", "run.no-steps"}
    assert "run.failed" not in {s.id for s in reg.select(ignore=["run.failed"]).specs}
    with pytest.raises(DiagError, match="no check matches 'nosuch'"):
        reg.select(["nosuch"])


def test_a_check_that_raises_is_crashed_not_fatal():
    @check(id="t.boom", title="boom")
    def boom(ev):
        raise ZeroDivisionError("oops")
        yield

    out = run_one(boom.__diag_check__, Evidence())
    assert len(out) == 1 and out[0].severity is Severity.CRASHED
    assert "ZeroDivisionError: oops" in out[0].message
    assert Severity.CRASHED.rank > Severity.ERROR.rank


def test_a_check_returning_garbage_is_crashed():
    spec = CheckSpec(id="t.bad", title="bad", func=lambda ev: ["not a finding"])
    out = run_one(spec, Evidence())
    assert out[0].severity is Severity.CRASHED and "not Finding" in out[0].message


def test_a_broken_builtin_module_is_a_crashed_result_not_a_traceback(monkeypatch):
    import importlib

    from diag import registry as registry_mod
    from diag.testing import EvidenceBuilder

    real = importlib.import_module

    def fake(name, *a, **k):
        if name == "diag.checks.eval":
            raise ImportError("cannot import name 'gone' from 'diag.checks._util'")
        return real(name, *a, **k)

    monkeypatch.setattr(registry_mod.importlib, "import_module", fake)
    monkeypatch.setattr(registry_mod, "_is_builtin", lambda ep: False)   # only the tree scan finds built-ins
    reg = Registry.discover(load_plugins=False)
    crashed = [f for f in reg.run(EvidenceBuilder().build()) if f.severity is Severity.CRASHED]
    assert any("diag.checks.eval" in f.message and "gone" in f.message for f in crashed)
    assert "dataloader.workers" in {s.id for s in reg.specs}      # the other modules still load
