"""The sharded memory plan (diag/memory/sharded.py, docs/memory.md "Sharded training"): the ZeRO
paper's figures, each strategy's division, the world size needed, the sharding read from a run's
evidence, and the plan checked against what the ranks of a real 2-rank FSDP2 (fully_shard, gloo)
job hold."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from conftest import SCRIPTS, run_diag

from diag.memory.sharded import (
    STRATEGIES,
    divisors,
    infer_sharding,
    largest_unit,
    make_sharded_plan,
    normalise_strategy,
    rank_figures,
)

TWIN = str(SCRIPTS / "memory_fsdp_twin.py")
GB = 1e9


def _base(psi: float, act_per_sample: float = 0.0, opt_temp: float = 0.0) -> dict:
    """An fp32 model with Adam (4Ψ + 4Ψ + 8Ψ) and a forward whose activations grow with the batch."""
    return {"params": 4 * psi, "grads": 4 * psi, "optimizer_state": 8 * psi, "psi": int(psi),
            "param_elem_bytes": 4.0, "set_to_none": True,
            "phases": {"forward": {"slope": act_per_sample, "intercept": 0.0, "grads_in_state": 0.0, "fit": "t"},
                       "optimizer": {"slope": 0.0, "intercept": opt_temp, "grads_in_state": 1.0, "fit": "t"}}}


@pytest.mark.parametrize("strategy, expected_gb", [("ddp", 120.0), ("zero1", 31.4), ("zero2", 16.6),
                                                    ("zero3", 1.9)])
def test_zero_paper_figure_1(strategy, expected_gb):
    """arXiv:1910.02054 Figure 1: Ψ = 7.5B, N_d = 64, mixed-precision Adam (K = 12)."""
    f = rank_figures(_base(7.5e9), strategy, 64, 1, mixed="bf16")
    assert f["state_total"] / GB == pytest.approx(expected_gb, abs=0.05)


def test_each_strategy_divides_what_it_shards():
    assert divisors("zero1", 8) == {"parameters": 1, "gradients": 1, "optimizer_state": 8}
    assert divisors("zero2", 8) == {"parameters": 1, "gradients": 8, "optimizer_state": 8}
    for s in ("zero3", "fsdp", "shard-grad-op"):
        assert divisors(s, 8) == {"parameters": 8, "gradients": 8, "optimizer_state": 8}
    assert divisors("hybrid", 32, gpus_per_node=8)["parameters"] == 8     # sharded within a node only
    assert divisors("ddp", 8) == {"parameters": 1, "gradients": 1, "optimizer_state": 1}
    assert normalise_strategy("FULL_SHARD") == "fsdp" and normalise_strategy("zero-3") == "zero3"
    with pytest.raises(ValueError):
        normalise_strategy("zero4")
    assert set(STRATEGIES) >= {"zero1", "zero2", "zero3", "fsdp"}


def test_division_rounds_up_and_activations_are_not_sharded():
    b = _base(1001, act_per_sample=1000.0)
    one = rank_figures(b, "fsdp", 1, 8)
    four = rank_figures(b, "fsdp", 4, 8)
    assert four["state"]["parameters"] == 1001     # ceil(4004 / 4)
    assert four["phases"]["forward"]["transient"] == one["phases"]["forward"]["transient"] == 8000


def test_fsdp_buffers_follow_the_unit_and_deepspeed_its_buckets():
    b = _base(1e9)
    f = rank_figures(b, "fsdp", 8, 1, unit_params=50_000_000, mixed="bf16")
    assert f["comm"]["forward"]["all_gather"] == 2 * 50_000_000 * 2        # two bf16 units
    assert f["comm"]["backward"]["reduce_scatter"] == 50_000_000 * 2
    z = rank_figures(b, "zero2", 8, 1, mixed="bf16")
    assert z["comm"]["backward"]["reduce_bucket"] == 500_000_000 * 2       # DeepSpeed's default, 2 bytes
    z3 = rank_figures(b, "zero3", 8, 1, mixed="bf16", buckets={"stage3_prefetch_bucket_size": 1e7})
    assert z3["comm"]["forward"]["prefetch_bucket"] == 10_000_000 * 2
    assert rank_figures(b, "fsdp", 1, 1)["comm"] == {}                     # one rank: nothing gathered


def test_world_size_needed_and_largest_batch_per_rank():
    # 7B parameters, fp32 Adam: 112 GB of state; 80 GB device
    b = _base(7e9, act_per_sample=2 * GB)
    p = make_sharded_plan(b, "fsdp", None, 4, capacity=int(80 * GB), unit_params=200_000_000)
    assert p["fits_one_gpu"] is False
    n = p["world_needed"]
    assert n and n > 1 and p["world"] == n and p["fits"] is True
    below = rank_figures(b, "fsdp", n - 1, 4, unit_params=200_000_000)
    assert below["device"] > p["usable"]                                   # the smallest that fits
    assert p["max_batch"] >= 4
    at_max = rank_figures(b, "fsdp", n, p["max_batch"], unit_params=200_000_000)
    past = rank_figures(b, "fsdp", n, p["max_batch"] + 1, unit_params=200_000_000)
    assert at_max["device"] <= p["usable"] < past["device"]
    # 10B parameters: ZeRO-1 keeps 40 GB of weights and 40 GB of gradients on every rank
    z1 = make_sharded_plan(_base(1e10, act_per_sample=2 * GB), "zero1", 8, 4, capacity=int(80 * GB))
    assert z1["world_needed"] is None and "ZeRO-1 keeps the parameters and gradients" in z1["world_needed_reason"]


def test_largest_unit_from_the_repeated_blocks():
    model = {"cls": "GPT", "module_types": {"GPT": 1, "Block": 12, "Linear": 49, "LayerNorm": 25},
             "layer_shapes": [{"type": "Embedding", "in": 50304, "out": 768}]}
    unit, how = largest_unit(model, 124_000_000)
    assert unit == 50304 * 768 and "12 Block blocks" in how     # the embedding is larger than a block
    model["layer_shapes"] = []
    assert largest_unit(model, 124_000_000)[0] == 124_000_000 // 12
    assert largest_unit(None, 10)[0] == 10


def _ev(models=(), distributed=None, world=2):
    m = [SimpleNamespace(wrappers=list(w), cls=c, module_types=dict(t)) for w, c, t in models]
    return SimpleNamespace(ranks=[SimpleNamespace(distributed=distributed or {}, models=m, world_size=world)])


def test_sharding_read_from_the_evidence():
    assert infer_sharding(_ev([([], "Net", {"Net": 1, "Linear": 2})])) is None
    got = infer_sharding(_ev([([], "FSDPNet", {"FSDPNet": 1, "FSDPBlock": 4})]))
    assert got["strategy"] == "fsdp" and got["world"] == 2
    assert infer_sharding(_ev([(["FullyShardedDataParallel"], "Net", {})]))["strategy"] == "fsdp"
    rec = infer_sharding(_ev(distributed={"sharding": {"strategy": "SHARD_GRAD_OP"}}, world=4))
    assert rec["strategy"] == "shard-grad-op" and rec["world"] == 4 and rec["source"] == "distributed.sharding"
    assert infer_sharding(_ev(distributed={"sharding": {"zero_stage": 2}}))["strategy"] == "zero2"


def test_usage_errors(tmp_path):
    res = run_diag("memory", "--script", TWIN, "--world", "4", cwd=tmp_path)
    assert res.code == 2 and "give --shard STRATEGY too" in res.stderr
    res = run_diag("memory", "--script", TWIN, "--shard", "fsdp", cwd=tmp_path)
    assert res.code == 2 and "--shard needs --world N" in res.stderr
    res = run_diag("memory", "--script", TWIN, "--shard", "zero4", cwd=tmp_path)
    assert res.code == 2 and "unknown sharding strategy" in res.stderr
    res = run_diag("memory", "--script", TWIN, "--shard", "fsdp", "--world", "2", "--unit-params", "lots",
                   cwd=tmp_path)
    assert res.code == 2 and "85M" in res.stderr


# ---- against a real FSDP2 job ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fsdp_job(tmp_path_factory):
    """The twin under torchrun, 2 ranks of fully_shard on gloo: the bytes each rank really holds; and
    the same script, one unsharded process, planned by diag memory --shard fsdp --world 2."""
    d = tmp_path_factory.mktemp("fsdp")
    env = dict(os.environ)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", TWIN,
                    "--out", str(d / "held")], cwd=d, env=env, check=True, timeout=240,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    held = [json.loads((d / f"held.rank{r}.json").read_text()) for r in range(2)]
    res = run_diag("memory", "--script", TWIN, "--shard", "fsdp", "--world", "2", "--memory", "80GB",
                   "--format", "json", cwd=d, timeout=240)
    assert res.code == 0, res.stderr[-3000:]
    return held, res.json()["plan"], d


def test_plan_matches_what_each_fsdp2_rank_holds(fsdp_job):
    """docs/memory.md's tolerance: the planned state per rank within 0.1% of the local shards (the
    optimizer's 0-dim step counters are replicated, not sharded: 4 bytes per parameter tensor)."""
    held, plan, _ = fsdp_job
    sh = plan["sharded"]
    assert sh["status"] == "ok" and sh["world"] == 2 and sh["strategy"] == "fsdp"
    state = sh["rank"]["state"]
    for r in held:
        assert r["world"] == 2
        for key in ("parameters", "gradients", "optimizer_state"):
            assert state[key] == pytest.approx(r[key], rel=1e-3), (key, state[key], r[key])
        assert sum(state.values()) == pytest.approx(r["parameters"] + r["gradients"] + r["optimizer_state"],
                                                    rel=1e-3)
    # and the unsharded figures are what one process holds (the replay saw the same model)
    assert sh["unsharded"]["params"] == 2 * held[0]["parameters"]
    assert sh["psi"] == held[0]["param_elements"]
    assert sh["fits"] is True and sh["max_batch"] > sh["batch_per_rank"]


def test_saved_run_is_replanned_for_other_strategies(fsdp_job):
    _, plan, d = fsdp_job
    runs = sorted((d / ".diag" / "runs").iterdir())
    res = run_diag("memory", "--from", str(runs[-1]), "--shard", "zero1", "--world", "2", "--format", "json", cwd=d)
    assert res.code == 0, res.stderr
    z1 = res.json()["plan"]["sharded"]
    assert z1["rank"]["state"]["parameters"] == z1["unsharded"]["params"]      # ZeRO-1 keeps them whole
    assert z1["rank"]["state"]["optimizer_state"] == plan["sharded"]["rank"]["state"]["optimizer_state"]
    text = run_diag("memory", "--from", str(runs[-1]), "--shard", "fsdp", "--world", "2", cwd=d)
    assert text.code == 0
    flat = " ".join(text.stdout.split())
    assert "Sharded: one rank of 2 under FSDP FULL_SHARD" in flat
    assert "largest batch per rank that fits" in flat


def test_sharding_read_from_the_fsdp_record():
    fsdp2 = {"api": "fsdp2", "shard_world": 4, "params": 1000, "param_bytes": 4000,
             "unit_list": [{"module": "(root)", "numel": 100, "root": True, "reshard_after_forward": False},
                           {"module": "blocks.0", "numel": 450, "root": False, "reshard_after_forward": True}],
             "mixed_precision": {"param_dtype": "bfloat16"}}
    got = infer_sharding(_ev(distributed={"fsdp": fsdp2}, world=4))
    assert (got["strategy"], got["world"], got["unit_params"], got["mixed"]) == ("fsdp", 4, 450, "bf16")
    fsdp2["unit_list"][1]["reshard_after_forward"] = False
    assert infer_sharding(_ev(distributed={"fsdp": fsdp2}))["strategy"] == "shard-grad-op"
    fsdp1 = {"api": "fsdp1", "sharding_strategy": "HYBRID_SHARD", "shard_world": 8, "unit_list": []}
    assert infer_sharding(_ev(distributed={"fsdp": fsdp1}))["strategy"] == "hybrid"
    ds = {"api": "deepspeed", "zero_stage": 2, "reduce_bucket_size": 2e8, "mixed_precision": {"bf16": True}}
    got = infer_sharding(_ev(distributed={"fsdp": ds}))
    assert got["strategy"] == "zero2" and got["buckets"] == {"reduce_bucket_size": 200_000_000} and got["mixed"] == "bf16"


@pytest.mark.slow
def test_a_sharded_run_is_planned_as_it_ran(tmp_path):
    """diag check runs the twin as a 2-rank FSDP2 job; diag memory --from that run plans it without a
    replay (the run's own unit sizes, state only) and the state per rank matches the local shards."""
    res = run_diag("check", "--nproc-per-node", "2", "--script", TWIN, "--run-dir", "run", "--format", "json",
                   "--", "--out", str(tmp_path / "held"), cwd=tmp_path, timeout=240)
    assert res.code in (0, 1), res.stderr[-3000:]
    held = [json.loads((tmp_path / f"held.rank{r}.json").read_text()) for r in range(2)]
    got = run_diag("memory", "--from", "run", "--format", "json", cwd=tmp_path)
    sh = got.json()["plan"]["sharded"]
    assert sh["status"] == "ok", sh
    assert (sh["strategy"], sh["world"], sh["unit_params"]) == ("fsdp", 2, 262912)
    assert sh["inferred"]["source"].startswith("distributed.fsdp")
    assert sh["rank"]["activations_included"] is False
    for key in ("parameters", "gradients", "optimizer_state"):
        assert sh["rank"]["state"][key] == pytest.approx(held[0][key], rel=1e-3), key
    text = " ".join(run_diag("memory", "--from", "run", cwd=tmp_path).stdout.split())
    assert "as the run ran: distributed.fsdp (FSDP2 fully_shard)" in text and "not replayed" in text
