"""The fake-tensor replay (diag.probe.replay) against analytical expectations.

Everything runs in-process on fake CPU tensors: no real memory proportional to the models or
batches is allocated. The analytical expectations are derived in the comments from what each op
saves for its backward (fp32, 4 bytes per element)."""
from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from diag.probe.replay import InputSpec, ReplayError, StepReplay  # noqa: E402

MiB = 1 << 20


def nbytes_params(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def mlp(d_in: int, h: int, layers: int, classes: int) -> nn.Sequential:
    mods = [nn.Linear(d_in, h), nn.ReLU()]
    for _ in range(layers - 1):
        mods += [nn.Linear(h, h), nn.ReLU()]
    mods.append(nn.Linear(h, classes))
    return nn.Sequential(*mods)


def close(actual: float, expected: float, tol: float) -> bool:
    return abs(actual - expected) <= tol * expected


# ---- a plain MLP -------------------------------------------------------------------------------------

def test_mlp_activation_dominated_matches_analytical():
    """32 hidden layers (Linear + ReLU) of width 256, batch 2048, SGD with momentum,
    zero_grad(set_to_none=False): gradients live through the whole step.

    Saved for the backward, per sample: the input x (d_in, saved by the first Linear), each
    ReLU's output (h, saved by the ReLU and by the next Linear: one tensor), the logits (C) and
    log_softmax's output (C, the surrogate loss, as cross-entropy keeps). Linear outputs before
    the ReLU are freed as soon as the ReLU has run.
    Expected peak = params + grads + momentum (= params) + saved activations."""
    d_in, h, L, C, B = 256, 256, 32, 16, 2048
    model = mlp(d_in, h, L, C)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    spec = InputSpec((torch.randn(4, d_in),), {})
    P = nbytes_params(model)
    saved = B * 4 * (d_in + L * h + 2 * C)
    expected = 3 * P + saved
    est = StepReplay(model, [opt], spec, set_to_none=False).train(B)
    assert close(est["peak"], expected, 0.10), (est["peak"] / MiB, expected / MiB)
    cats = est["categories"]
    # the categories are exact up to the allocator's 512-byte rounding per tensor
    n_tensors = len(list(model.parameters()))
    assert P <= cats["parameters"] <= P + 512 * n_tensors
    assert P <= cats["gradients"] <= P + 512 * n_tensors
    assert P <= cats["optimizer_state"] <= P + 512 * n_tensors
    assert est["peak_phase"] == "backward"


def test_mlp_state_dominated_matches_analytical():
    """8 layers of 1024, batch 16, Adam (for-each loop, as on CPU), zero_grad(set_to_none=True):
    the peak is in the optimizer step, where params + grads + Adam's two moments are alive.
    Expected = params + grads + 2 x params (+ tiny activations)."""
    model = mlp(1024, 1024, 8, 10)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
    spec = InputSpec((torch.randn(16, 1024),), {})
    P = nbytes_params(model)
    saved = 16 * 4 * (1024 + 8 * 1024 + 2 * 10)
    expected = 4 * P + saved
    est = StepReplay(model, [opt], spec, set_to_none=True, target="cpu").train(16)
    assert close(est["peak"], expected, 0.10), (est["peak"] / MiB, expected / MiB)
    # target cpu: no rounding; Adam also keeps a 4-byte step counter per parameter tensor
    n_tensors = len(list(model.parameters()))
    assert 2 * P <= est["categories"]["optimizer_state"] <= 2 * P + 4 * n_tensors
    assert est["categories"]["parameters"] == P
    assert est["peak_phase"] == "optimizer"


def test_cuda_target_uses_foreach_and_rounds_to_512_bytes():
    """For a CUDA target the optimizer runs its foreach implementation (PyTorch's default for CUDA
    parameters): one more parameter-sized temporary in the step; every storage is rounded up to 512 B."""
    model = mlp(512, 512, 4, 10)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    spec = InputSpec((torch.randn(8, 512),), {})
    P = nbytes_params(model)
    cpu = StepReplay(model, [opt], spec, target="cpu").train(8)
    cuda = StepReplay(model, [opt], spec, target="cuda").train(8)
    assert cuda["peak"] > cpu["peak"] + 0.5 * P          # foreach temporaries
    assert cuda["peak"] % 512 == 0
    assert cuda["categories"]["parameters"] % 512 == 0


def test_matches_torch_memtracker():
    """Cross-check with torch's own tracker (torch.distributed._tools.mem_tracker.MemTracker) on the
    same step: the peaks agree within 1% (ours rounds to 512-byte blocks)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    def build():
        return mlp(1024, 2048, 2, 10)

    B = 512
    with FakeTensorMode() as fm:
        model = build()
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)
        x = torch.randn(B, 1024)
    mt = MemTracker()
    mt.track_external(model, opt, x)
    with fm, mt:
        for i in range(2):
            opt.zero_grad(set_to_none=False)
            out = model(x)
            out.float().log_softmax(-1).mean().backward()
            opt.step()
            if i == 0:
                mt.reset_mod_stats()
    theirs = max(d["Total"] for d in mt.get_tracker_snapshot("peak").values())
    real = build()
    ours = StepReplay(real, [torch.optim.Adam(real.parameters(), lr=1e-3)], InputSpec((torch.randn(2, 1024),), {}),
                      set_to_none=False, hold_output=False).train(B)["peak"]
    assert close(ours, theirs, 0.01), (ours, theirs)


# ---- a small transformer ---------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, h, a):
        super().__init__()
        self.a = a
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x):
        B, S, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, self.a, h // self.a).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(o.transpose(1, 2).reshape(B, S, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyGPT(nn.Module):
    def __init__(self, V, h, a, L, S):
        super().__init__()
        self.emb = nn.Embedding(V, h)
        self.pos = nn.Parameter(torch.zeros(S, h))
        self.blocks = nn.ModuleList(Block(h, a) for _ in range(L))
        self.lnf = nn.LayerNorm(h)
        self.head = nn.Linear(h, V, bias=False)

    def forward(self, idx):
        x = self.emb(idx) + self.pos
        for b in self.blocks:
            x = b(x)
        return self.head(self.lnf(x))


def transformer_saved_bytes(B, S, h, a, L, V) -> int:
    """Saved activations of TinyGPT, per token (fp32):
    per block: the residual input (h, LayerNorm's input), LN1's output (h, the qkv Linear's input)
    and its mean/rstd (2), the qkv output (3h: q, k, v are views of it, saved by attention), the
    attention output (h; the kernel lays it out as (B, S, heads, d) so transpose+reshape is a view,
    saved by attention and by the projection), its log-sum-exp (a), the second residual (h) with
    LN2's stats (2), LN2's output (h), fc1's output (4h, GELU's input) and GELU's output (4h, fc2's
    input): 16h + a + 4.
    Outside the blocks: the final LayerNorm's input and output (2h) and stats (2), the logits and
    log_softmax's output (2V), the token ids (int64, 8 bytes). The embedding's output is not saved."""
    tok = B * S
    return 4 * tok * (L * (16 * h + a + 4) + 2 * h + 2 + 2 * V) + 8 * tok


def test_small_transformer_matches_analytical():
    V, h, a, L, S, B = 64, 256, 4, 8, 128, 32
    model = TinyGPT(V, h, a, L, S)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    spec = InputSpec((torch.randint(0, V, (2, S)),), {})
    P = nbytes_params(model)
    A = transformer_saved_bytes(B, S, h, a, L, V)
    expected = 4 * P + A            # params + grads (kept: set_to_none=False) + AdamW's 2 moments + saved
    est = StepReplay(model, [opt], spec, set_to_none=False, target="cpu").train(B)
    assert close(est["peak"], expected, 0.10), (est["peak"] / MiB, expected / MiB)
    # the forward's end holds exactly the persistent state, the saved activations and the previous
    # step's logits (the loop variable `out` still points at them until the new forward returns)
    fwd = est["phase_peaks"]["forward"]
    assert close(fwd, 4 * P + A + 4 * B * S * V, 0.01), (fwd / MiB, (4 * P + A) / MiB)


def test_peak_grows_monotonically_with_batch():
    V, h, a, L, S = 64, 128, 4, 2, 64
    model = TinyGPT(V, h, a, L, S)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    r = StepReplay(model, [opt], InputSpec((torch.randint(0, V, (2, S)),), {}))
    peaks = [r.train(b)["peak"] for b in (1, 2, 3, 4, 8, 16, 32, 33, 64)]
    assert all(x < y for x, y in zip(peaks, peaks[1:])), peaks
    evals = [r.eval(b)["peak"] for b in (1, 4, 16, 64)]
    assert all(x < y for x, y in zip(evals, evals[1:])), evals
    # evaluation keeps no activations for a backward: it fits far more per byte
    assert r.eval(64)["peak"] < r.train(64)["peak"]


def test_accumulation_keeps_gradients_through_the_next_forward():
    model = mlp(512, 1024, 4, 10)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    r = StepReplay(model, [opt], InputSpec((torch.randn(4, 512),), {}), set_to_none=True, target="cpu")
    one = r.train(256)
    acc = r.train(256, accumulation=2)
    assert acc["peak"] >= one["peak"]
    assert acc["accumulation"] == 2


# ---- the user's objects are left alone -------------------------------------------------------------

def test_replay_leaves_the_live_model_optimizer_and_rng_untouched():
    class Cache(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(32, 32)
            self.bn = nn.BatchNorm1d(32)

        def forward(self, x):
            self.last = x.mean()                  # a forward that caches a tensor on the module
            return self.bn(F.dropout(self.lin(x), 0.5, self.training))

    torch.manual_seed(0)
    model = Cache()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    w = model.lin.weight.detach().clone()
    rm = model.bn.running_mean.clone()
    model(torch.randn(8, 32)).sum().backward()
    opt.step()
    w = model.lin.weight.detach().clone()
    state_keys = {k: set(v) for k, v in opt.state.items()}
    grads = model.lin.weight.grad.clone()
    last = model.last
    spec = InputSpec((torch.randn(8, 32),), {})
    rng = torch.get_rng_state()
    r = StepReplay(model, [opt], spec)
    r.train(64)
    r.eval(128)
    assert torch.equal(model.lin.weight.detach(), w)
    assert torch.equal(model.lin.weight.grad, grads)
    assert model.last is last and type(model.last) is torch.Tensor
    assert torch.equal(torch.get_rng_state(), rng)
    assert {k: set(v) for k, v in opt.state.items()} == state_keys
    assert model.training and model.bn.training
    assert isinstance(model.lin.weight, nn.Parameter) and type(model.lin.weight) is nn.Parameter
    assert not torch.equal(model.bn.running_mean, rm)     # the real update from the real step
    assert int(model.bn.num_batches_tracked) == 1


def test_autocast_bf16_halves_saved_activations():
    model = mlp(512, 512, 8, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    spec = InputSpec((torch.randn(4, 512),), {})
    fp32 = StepReplay(model, [opt], spec, set_to_none=False, target="cpu").train(1024)
    bf16 = StepReplay(model, [opt], spec, autocast="bfloat16", set_to_none=False, target="cpu").train(1024)
    a32 = fp32["phase_peaks"]["forward"]
    a16 = bf16["phase_peaks"]["forward"]
    assert a16 < a32
    assert bf16["categories"]["parameters"] == fp32["categories"]["parameters"]   # master weights stay fp32


# ---- what cannot be replayed ------------------------------------------------------------------------

def test_data_dependent_shape_is_a_clear_replay_error():
    class Masked(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)

        def forward(self, x):
            y = self.lin(x)
            return y[y > 0].sum() + y.sum()

    model = Masked()
    r = StepReplay(model, [torch.optim.SGD(model.parameters(), lr=0.1)], InputSpec((torch.randn(4, 16),), {}))
    with pytest.raises(ReplayError, match="data-dependent"):
        r.train(8)


def test_item_in_forward_is_a_clear_replay_error():
    class Item(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)

        def forward(self, x):
            if self.lin(x).mean().item() > 10:
                return x
            return self.lin(x)

    model = Item()
    with pytest.raises(ReplayError, match="data-dependent"):
        StepReplay(model, [], InputSpec((torch.randn(4, 16),), {})).train(8)


def test_custom_op_without_fake_kernel_is_a_clear_replay_error():
    lib = torch.library.Library("diagtest_nofake", "DEF")  # noqa: F841 (kept alive for the test)
    lib.define("double(Tensor x) -> Tensor")
    lib.impl("double", lambda x: x * 2, "CPU")

    class Custom(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)

        def forward(self, x):
            return torch.ops.diagtest_nofake.double(self.lin(x))

    model = Custom()
    with pytest.raises(ReplayError, match=r"diagtest_nofake.double.*no fake \(meta\) kernel"):
        StepReplay(model, [], InputSpec((torch.randn(4, 16),), {})).train(8)


def test_opaque_input_object_is_a_clear_replay_error():
    class Batch:
        def __init__(self, x):
            self.x = x

    with pytest.raises(ReplayError, match="Batch object"):
        InputSpec((Batch(torch.randn(2, 3)),), {})


def test_structured_inputs_are_rebuilt_at_other_batch_sizes():
    class Dict(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 32)
            self.lin = nn.Linear(32, 4)

        def forward(self, ids, mask=None, extra=(1, 2)):
            assert ids.shape[0] == mask.shape[0]
            return self.lin(self.emb(ids) * mask.unsqueeze(-1))

    model = Dict()
    spec = InputSpec((torch.randint(0, 100, (3, 7)),), {"mask": torch.ones(3, 7), "extra": (1, 2)})
    assert spec.batch == 3
    small = StepReplay(model, [], spec).train(3)
    big = StepReplay(model, [], spec).train(300)
    assert big["peak"] > small["peak"]
    assert not math.isnan(big["peak"])
