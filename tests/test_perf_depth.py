"""Issue 20: the depth benchmark runs (smoke) and the hook hand-over prototype keeps the probe's view
of outermost forwards while inner modules stay on torch's hook-free fast path."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

torch = pytest.importorskip("torch")

import bench_depth  # noqa: E402
import proto_handover as proto  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.modules import module as nn_module  # noqa: E402


def test_depth_bench_quick_mode_measures_both_sides_and_the_probe_really_ran():
    raw = bench_depth.measure("10,100", "bare,probe,proto", rounds=2, steps=4, warmup=2, timeout=600)
    res = bench_depth.summarise(raw)
    assert set(res) == {"10", "100"}
    assert res["10"]["module_calls"] == 11 and res["100"]["module_calls"] == 101
    for row in res.values():
        assert row["bare_step_median_ms"] > 0
        for side in ("probe", "proto"):
            r = row[side]
            assert r["step_median_ms"] > 0 and r["pairs"] == 2
            lo, hi = r["overhead_iqr_pct"]
            assert lo <= hi
            assert "us_per_module_call" in r and "wall" in r
        # 2 blocks of 6 steps under the probe: its own step events prove it was installed
        assert row["probe"]["steps_recorded"] >= 8


@pytest.mark.parametrize("name", ["train_then_eval", "model_built_mid_run", "two_models",
                                  "eval_only_model_built_early", "eval_only_model_built_late",
                                  "loss_module_and_wrapper", "direct_forward", "closure", "frozen_backbone",
                                  "ema_deepcopy", "forward_raises", "submodule_called_directly",
                                  "loader_eval", "train_called_every_step", "ddp"])
def test_handover_sees_the_same_outermost_forwards_as_global_hooks(name):
    fn = proto.SCENARIOS[name]
    ref, _, _ = proto.run_scenario(fn, "global")
    got, h, _ = proto.run_scenario(fn, "handover")
    assert ref, "the reference saw no outermost forward"
    assert got == ref
    assert h.handovers >= 1
    assert not nn_module._has_any_global_hook()


def test_handover_removes_the_compile_warning_and_keeps_the_compiled_forwards():
    ref, _, ref_warn = proto.run_scenario(proto.SCENARIOS["compile"], "global")
    got, _, warn = proto.run_scenario(proto.SCENARIOS["compile"], "handover")
    assert got == ref
    assert ref_warn and not warn


def test_after_the_handover_only_the_outermost_module_calls_a_hook():
    model = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(50)])
    calls = []
    c = proto.Outermost()
    orig_pre = c.pre

    def counting_pre(module, args):
        calls.append(module)
        return orig_pre(module, args)
    c.pre = counting_pre
    h = proto.HandOver(c).install(scan=True)
    try:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
        assert not h.discovering and not nn_module._has_any_global_hook()
        calls.clear()
        model(torch.randn(2, 4))
        assert calls == [model]          # 151 module calls, one hook call
        assert c.depth == 0
    finally:
        h.uninstall()
    assert not model._forward_pre_hooks and not model._forward_hooks
