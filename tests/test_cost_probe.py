"""The measured part: FLOPs of one real training step counted in the probe (FlopCounterMode).

In-process runs (diag.watch) of tiny real models; one end-to-end `diag check` + `diag cost --from`.
"""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import diag


@pytest.fixture(autouse=True)
def _no_optimizer_left_over():
    """An earlier test's optimizer still in a reference cycle (a Lightning Trainer's: tests/test_probe_lane.py)
    is alive until the collector runs, and the probe's census counts it: with two optimizers alive a step's
    group ends at the next DataLoader fetch, which these loops never make, so the counted step held the
    next step's forward (run after those tests, one of these failed; before the probe let go of the last
    model it had forwarded, six did)."""
    import gc

    gc.collect()
    yield


def _dispatch_mode():
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode()


def _mlp_run(d_in=1024, hidden=4096, d_out=1024, batch=32, steps=6, input_grad=False, **watch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with diag.watch(max_steps=steps, **watch) as run:
        for _ in range(steps + 2):
            x = torch.randn(batch, d_in, requires_grad=input_grad)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    n_params = sum(p.numel() for p in model.parameters())
    return run.evidence.primary, n_params


def test_mlp_step_flops_match_6_params_samples():
    """6·N·B counts, per sample and parameter, 2 FLOPs forward, 2 for the weight gradient and 2 for
    the input gradient. The first layer's input gradient is only computed when the input requires
    grad; here it does (x.requires_grad_()), so the counted step is 6·N·B within 5% (the bias adds are
    not matmuls and are not counted: 0.06% here)."""
    r, n = _mlp_run(input_grad=True)
    m = r.flops["measured"]
    analytic = 6 * n * 32
    assert m["flops"] == pytest.approx(analytic, rel=0.05)
    assert m["samples"] == 32 and m["n_forward"] == 1 and m["step"] == 3
    assert m["params"] == n


def test_mlp_step_without_input_grad_is_exactly_6nb_minus_first_layer_input_grad():
    """The usual case: the batch does not require grad, so autograd skips dL/dx of the first layer
    (2·B·d_in·hidden FLOPs). For 1024-4096-1024 that is a third of the backward of a two-layer MLP,
    and the counted step is 17% below 6·N·B: the brief's "less where the first layer's input
    gradient is not needed". The exact count (matmuls only, no bias adds):
    forward 2·B·(d_in·h + h·d_out), backward 2·B·(d_in·h + h·d_out) (weights) + 2·B·h·d_out (input)."""
    B, din, h, dout = 32, 1024, 4096, 1024
    r, n = _mlp_run(input_grad=False)
    m = r.flops["measured"]
    fwd = 2 * B * (din * h + h * dout)
    assert m["forward_flops"] == fwd
    assert m["backward_flops"] == fwd + 2 * B * h * dout
    assert m["flops"] == 6 * B * (din * h + h * dout) - 2 * B * din * h
    assert m["flops"] / (6 * n * B) == pytest.approx(0.833, abs=0.005)
    assert not m["recompute_detected"]


def test_deep_mlp_is_within_5_percent_even_without_input_grad():
    """With 8 equal layers the skipped first-layer input gradient is 1/24 of the step: within 5%."""
    torch.manual_seed(0)
    layers = []
    for _ in range(8):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with diag.watch(max_steps=5) as run:
        for _ in range(6):
            loss = model(torch.randn(64, 256)).square().mean()
            opt.zero_grad(); loss.backward(); opt.step()
    n = sum(p.numel() for p in model.parameters())
    m = run.evidence.primary.flops["measured"]
    assert m["flops"] == pytest.approx(6 * n * 64, rel=0.05)
    assert m["flops"] < 6 * n * 64


def test_instrumented_step_is_excluded_from_timing_and_overhead_is_reported():
    r, _ = _mlp_run(d_in=256, hidden=512, d_out=256, steps=8)
    inst = [s.index for s in r.steps if s.instrumented]
    assert inst == [3]
    assert r.step_stats.timed == r.step_stats.count - 1
    assert all(s.index != 3 for s in r.timed_steps())
    a = r.flops["achieved"]
    assert a["step_s"] > 0 and a["steps_timed"] >= 5
    assert a["model_flops_per_s"] == pytest.approx(r.flops["measured"]["model_flops"] / a["step_s"])
    assert a["overhead_ratio"] is not None and a["mfu"] is None    # CPU: no catalogue peak
    assert r.flops["measured"]["device"] == "cpu"
    assert "CPU" in r.flops["measured"]["peak_note"]
    assert "peak_flops" not in r.flops["measured"] and "gpu" not in r.flops["measured"]   # diag judges the peak
    assert _dispatch_mode() is None


def test_recomputation_is_detected_and_mfu_counts_model_flops():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = block

        def forward(self, x):
            return checkpoint(self.block, x, use_reentrant=False)

    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    with diag.watch(max_steps=5) as run:
        for _ in range(6):
            x = torch.randn(16, 256, requires_grad=True)
            loss = net(x).square().mean()
            opt.zero_grad(); loss.backward(); opt.step()
    m = run.evidence.primary.flops["measured"]
    F, B = m["forward_flops"], m["backward_flops"]
    assert F == 2 * 16 * (256 * 1024 + 1024 * 256)
    # the backward is 2F plus the recomputed forward; non-reentrant checkpoint stops recomputing once
    # the tensors the backward needs exist, so here only the first Linear (F/2) runs again
    assert B == 2 * F + F // 2
    assert m["recompute_detected"]
    assert m["model_flops"] == 3 * F                 # MFU counts the model's 6ND
    assert m["flops"] == F + B > m["model_flops"]   # HFU counts what executed (8ND with full recompute)


def test_token_model_counts_tokens_and_non_embedding_params():
    torch.manual_seed(0)
    V, T, D = 500, 32, 64

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.fc = nn.Linear(D, 4 * D)
            self.out = nn.Linear(4 * D, V)

        def forward(self, x):
            return self.out(torch.relu(self.fc(self.emb(x))))

    lm = LM()
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-3)
    with diag.watch(max_steps=5) as run:
        for _ in range(6):
            x = torch.randint(0, V, (8, T))
            loss = nn.functional.cross_entropy(lm(x).reshape(-1, V), x.reshape(-1))
            opt.zero_grad(); loss.backward(); opt.step()
    m = run.evidence.primary.flops["measured"]
    assert m["tokens"] == 8 * T and m["samples"] == 8
    assert m["params_non_embedding"] == m["params"] - V * D
    assert m["analytic_basis"] == "tokens"
    # the embedding does no matmul; the first Linear's input grad is needed (it flows into the embedding)
    assert m["ratio_to_analytic"] == pytest.approx(1.0, abs=0.02)


def test_manual_training_without_optimizer_still_counts_the_forward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 128))
    with diag.watch(max_steps=6) as run:
        for _ in range(8):
            loss = model(torch.randn(16, 128, requires_grad=True)).square().mean()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
                    p.grad = None
    r = run.evidence.primary
    m = r.flops["measured"]
    n = sum(p.numel() for p in model.parameters())
    assert m["forward_flops"] > 0
    assert m["flops"] == pytest.approx(6 * n * 16, rel=0.05)
    assert {s.index for s in r.steps if s.instrumented} == {2, 3}   # counting started one step early
    assert _dispatch_mode() is None


def test_eval_forwards_between_steps_are_not_counted():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 128))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with diag.watch(max_steps=5) as run:
        for _ in range(6):
            loss = model(torch.randn(16, 128)).square().mean()
            opt.zero_grad(); loss.backward(); opt.step()
            with torch.no_grad():
                model(torch.randn(512, 128))       # a big evaluation forward between steps
    m = run.evidence.primary.flops["measured"]
    fwd = 2 * 16 * (128 * 256 + 256 * 128)
    assert m["forward_flops"] == fwd
    assert m["window_flops"] > m["flops"]          # the evaluation was seen, and left out


def test_short_run_says_why_and_exits_the_counter():
    r, _ = _mlp_run(d_in=64, hidden=64, d_out=64, steps=2)
    # with --steps 2 the counter moves to the last step it will see
    assert r.flops["measured"]["step"] == 2
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with diag.watch() as run:
        for _ in range(2):        # the run ends after step 2: the counter, entered after step 2, must exit
            model(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()
    f = run.evidence.primary.flops
    assert "measured" not in f and "before step 3" in f["status"]
    assert _dispatch_mode() is None


def test_exception_inside_the_measured_step_leaves_no_mode_behind():
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="boom"):
        with diag.watch():
            for i in range(5):
                out = model(torch.randn(4, 8))
                if i == 2:
                    raise RuntimeError("boom")      # in step 3, while the counter is on
                out.sum().backward(); opt.step(); opt.zero_grad()
    assert _dispatch_mode() is None
    from torch.nn.modules import module as nn_module

    assert all("FlopCounter" not in repr(h) for h in nn_module._global_forward_pre_hooks.values())


def test_step_choice_from_environment(monkeypatch):
    monkeypatch.setenv("DIAG_FLOPS_STEP", "5")
    r, _ = _mlp_run(d_in=64, hidden=64, d_out=64, steps=7)
    assert r.flops["measured"]["step"] == 5
    assert [s.index for s in r.steps if s.instrumented] == [5]


def test_disabled_by_name(monkeypatch):
    monkeypatch.setenv("DIAG_PROBE_DISABLE", "flopcounter")
    r, _ = _mlp_run(d_in=64, hidden=64, d_out=64, steps=4)
    assert r.flops == {} and not any(s.instrumented for s in r.steps)


@pytest.mark.slow
def test_end_to_end_check_then_cost_from_evidence(diag_cli, write_script, tmp_path):
    script = write_script("train_lm.py", """
        import torch, torch.nn as nn
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        V, T, D = 300, 32, 64
        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(V, D); self.fc = nn.Linear(D, D); self.head = nn.Linear(D, V)
            def forward(self, x):
                return self.head(torch.relu(self.fc(self.emb(x))))
        dl = DataLoader(TensorDataset(torch.randint(0, V, (256, T))), batch_size=8)
        m = LM(); opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        for (x,) in dl:
            loss = nn.functional.cross_entropy(m(x).reshape(-1, V), x.reshape(-1))
            opt.zero_grad(); loss.backward(); opt.step()
    """)
    res = diag_cli("check", "--script", str(script), "--steps", "10", "--run-dir", str(tmp_path / "run"),
                   "--format", "json")
    assert res.code == 0, res.stderr
    rep = res.json()
    f = [x for x in rep["findings"] if x["id"] == "cost.mfu"][0]
    assert f["severity"] == "skipped" and "CPU" in f["message"] and f["evidence"]["achieved_tflops"] > 0
    ev = json.loads((tmp_path / "run" / "evidence.json").read_text())
    m = ev["ranks"][0]["flops"]["measured"]
    assert m["tokens"] == 8 * 32 and m["flops"] > 0

    # extrapolate: 2 epochs of the 256-sample dataset = 2 * 256 * 32 tokens at the measured rate
    res = diag_cli("cost", "--from", str(tmp_path / "run"), "--epochs", "2", "--format", "json")
    assert res.code == 0, res.stderr
    d = res.json()
    assert d["training"]["units"] == 2 * 256 * 32
    rate = d["measured"]["units_per_s"]
    assert d["training"]["gpu_hours"] == pytest.approx(2 * 256 * 32 / rate / 3600, rel=1e-6)
    assert d["mfu"] is None and d["gpu"] == "cpu"

    # to a GPU from the catalogue: measured FLOPs per token, assumed MFU (labelled), catalogue price
    res = diag_cli("cost", "--from", str(tmp_path / "run" / "evidence.json"), "--tokens", "1e9", "--gpu", "H100",
                   "--count", "8", "--format", "json")
    d = res.json()
    assert d["gpu"] == "h100-sxm" and d["count"] == 8 and d["mfu"] == 0.30 and "assumed" in d["mfu_basis"]
    assert d["training"]["flops"] == pytest.approx(d["measured"]["flops_per_unit"] * 1e9)
    assert d["price_per_gpu_hour"] == 2.99

    # samples of a token model are converted with the measured tokens per sample
    res = diag_cli("cost", "--from", str(tmp_path / "run"), "--samples", "100", "--format", "json")
    assert res.code == 0, res.stderr
    assert res.json()["training"]["units"] == 100 * 32

    res = diag_cli("cost", "--from", str(tmp_path / "run"), "--samples", "100", "--epochs", "2")
    assert res.code == 2 and res.stderr.count("\n") == 1 and "exactly one" in res.stderr


def test_precision_for_gpu_devices_and_no_catalogue_in_the_probe():
    from diag.probe.flops import FlopCounter, _dtype_precision

    assert _dtype_precision(torch.bfloat16, "cuda") == ("bf16", "bfloat16")
    assert _dtype_precision(torch.float16, "cuda")[0] == "fp16"
    assert _dtype_precision(torch.float32, "cpu")[0] == "fp32"
    prev = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert _dtype_precision(torch.float32, "cuda")[0] == "fp32"
        torch.set_float32_matmul_precision("high")
        assert _dtype_precision(torch.float32, "cuda")[0] == "tf32"
    finally:
        torch.set_float32_matmul_precision(prev)
    # the probe records, diag judges: the peak lookup (and its catalogue) is not in the user's process
    assert not hasattr(FlopCounter(), "_peak")


class OptimizedModule(nn.Module):
    """Stands in for torch.compile's wrapper (same class name and `_orig_mod`, as wrappers_of checks):
    compiling for real needs a C++ toolchain and tens of seconds on this machine."""

    def __init__(self, mod):
        super().__init__()
        self._orig_mod = mod

    def forward(self, x):
        return self._orig_mod(x)


def test_compiled_model_is_estimated_not_counted():
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))
    model = OptimizedModule(inner)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with diag.watch(max_steps=5) as run:
        for _ in range(6):
            model(torch.randn(16, 64)).square().mean().backward()
            opt.step(); opt.zero_grad()
    r = run.evidence.primary
    m = r.flops["measured"]
    n = sum(p.numel() for p in inner.parameters())
    assert m["method"] == "analytic" and m["compiled"]
    assert m["flops"] == m["model_flops"] == pytest.approx(6 * n * 16, abs=3)
    assert m["by_op"] == {} and not any(s.instrumented for s in r.steps)     # nothing slowed down
    assert "compiled model" in r.flops["status"]
    assert r.flops["achieved"]["model_flops_per_s"] > 0


def test_the_counted_step_adds_no_module_hooks():
    """FlopCounterMode's module tracker (global module hooks, a backward hook per module call) made the
    counted step 5.2x the others on an LSTMCell loop (3.2x without it); the probe wants the totals only (its own forward /
    backward snapshots split them), so it counts without the tracker: the same total, no hook."""
    from torch.nn.modules import module as M

    from diag.probe.flops import FlopCounter

    class Sink:
        events: list = []

        def emit(self, kind, **kw):
            self.events.append((kind, kw))

    fc = FlopCounter()
    pre, post = len(M._global_forward_pre_hooks), len(M._global_forward_hooks)
    fc._enter(Sink())
    try:
        layer = nn.Linear(64, 32)
        assert (len(M._global_forward_pre_hooks), len(M._global_forward_hooks)) == (pre, post)
        layer(torch.randn(8, 64)).sum().backward()
        total = fc.counter.get_total_flops()
    finally:
        fc.counter.__exit__(None, None, None)
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as stock:
        layer(torch.randn(8, 64)).sum().backward()
    assert total == stock.get_total_flops() == 2 * (2 * 8 * 64 * 32)   # the forward and the weight's gradient
