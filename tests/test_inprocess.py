"""diag.watch(): the same probe, in this process; hooks removed on exit, even on error."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.modules import module as nn_module
from torch.optim import optimizer as optim_mod
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data import dataloader as dl

import diag
from diag.errors import DiagError


def _global_state():
    return (len(nn_module._global_forward_pre_hooks), len(nn_module._global_forward_hooks),
            len(optim_mod._global_optimizer_pre_hooks), len(optim_mod._global_optimizer_post_hooks),
            dl.DataLoader.__dict__.get("__iter__"), dl._BaseDataLoaderIter.__dict__.get("__next__"),
            torch.optim.Optimizer.__dict__.get("zero_grad"))


def _train(n_batches=6, eval_without_no_grad=False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = TensorDataset(torch.randn(16 * n_batches, 16), torch.randint(0, 2, (16 * n_batches,)))
    for x, y in DataLoader(data, batch_size=16):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    if eval_without_no_grad:
        model.eval()
        model(torch.randn(4, 16))
    return model


def test_watch_records_and_cleans_up():
    before = _global_state()
    with diag.watch() as run:
        _train(eval_without_no_grad=True)
        assert _global_state() != before
    assert _global_state() == before
    r = run.evidence.primary
    assert r.step_stats.count == 6
    assert r.dataloaders[0].batches == 6
    assert run.evidence.run.status == "completed" and run.evidence.run.launcher == "in-process"
    ids = {f.id: f.severity.value for f in run.findings()}
    assert ids["eval.no-grad"] == "warning"
    text = run.report()
    assert "eval.no-grad" in text
    assert '"findings"' in run.report("json")


def test_watch_removes_hooks_on_error_and_records_it():
    before = _global_state()
    with pytest.raises(RuntimeError, match="boom"):
        with diag.watch() as run:
            _train(2)
            raise RuntimeError("boom")
    assert _global_state() == before
    assert run.evidence.run.status == "failed"
    assert run.evidence.primary.exceptions[0].type == "RuntimeError"


def test_watch_max_steps_stops_quietly():
    with diag.watch(max_steps=3) as run:
        _train(10)
        pytest.fail("the loop should have been stopped")      # pragma: no cover
    assert run.evidence.primary.step_stats.count == 3
    assert run.evidence.run.status == "stopped"


def test_watch_is_not_reentrant_and_validates():
    with diag.watch():
        with pytest.raises(DiagError, match="already active"):
            with diag.watch():
                pass
    with pytest.raises(DiagError, match="positive"):
        diag.watch(max_steps=0)
