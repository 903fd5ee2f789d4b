"""FLOP formulas for training and evaluation, and the arithmetic that turns FLOPs into time.

Pure Python (no torch). Every function states the formula and where it comes from.

Vocabulary
----------
N
    parameters of the model (non-embedding parameters in the papers; diag takes what you give it).
D
    tokens processed (or samples, for models that are not sequence models: then "per token" below
    reads "per sample" and N·D only holds for dense layers applied once per sample, see
    :func:`training_flops`).
MFU, model FLOPs utilisation
    the FLOPs the *model* needs (forward + backward, no recomputation: 6·N per token) divided by
    wall-clock time and by the hardware's dense peak. Defined in PaLM (Chowdhery et al. 2022,
    section 4.1 and appendix B) so that runs with and without activation recomputation compare.
HFU, hardware FLOPs utilisation
    the FLOPs the hardware actually *executes* (recomputed forwards included: 8·N per token with full
    activation recomputation) over time and peak. HFU >= MFU; they are equal without recomputation.
    (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
    section 6, report both.)

Sources
-------
* Kaplan et al. 2020, "Scaling Laws for Neural Language Models", section 2.1 and table 1:
  C_forward ≈ 2·N per token, training C ≈ 6·N per token (backward ≈ 2x forward).
* Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways", appendix B: per token
  6·N + 12·L·H·Q·T model FLOPs (L layers, H heads, Q head dimension, T sequence length), the
  attention term being the Q·Kᵀ and attention·V matmuls, which hold no parameters.
* Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM", section 5.1: with full activation recomputation each iteration runs an extra
  forward, 4 passes' worth (8·N per token) instead of 3 (6·N).
* Hoffmann et al. 2022, "Training Compute-Optimal Large Language Models" (Chinchilla): about 20
  training tokens per parameter is compute-optimal (table 3: 70B parameters, 1.4T tokens).
* Brown et al. 2020, "Language Models are Few-Shot Learners" (GPT-3), table D.1: 175B parameters,
  300B tokens, 3.14e23 FLOPs; the worked example in tests/test_cost.py.
* Epoch AI, "Estimating Training Compute of Deep Learning Models" (2022): assume 30% utilisation for
  large language models and 40% for other models when nothing is measured.
"""
from __future__ import annotations

import math

SECONDS_PER_HOUR = 3600.0
HOURS_PER_DAY = 24.0

#: Chinchilla's compute-optimal ratio (Hoffmann et al. 2022): tokens per parameter.
CHINCHILLA_TOKENS_PER_PARAM = 20.0

#: Epoch AI's default utilisation when nothing is measured (LLMs; 0.40 for other models).
DEFAULT_MFU_LLM = 0.30
DEFAULT_MFU_OTHER = 0.40

#: Typical MFU reached by well-tuned public runs (model FLOPs over dense peak), for context.
#: (label, low, high, source)
TYPICAL_MFU: list[tuple[str, float, float, str]] = [
    ("GPT-3 175B on V100", 0.21, 0.21, "PaLM paper, table 3 (Chowdhery et al. 2022)"),
    ("Megatron-Turing NLG 530B on A100", 0.30, 0.30, "PaLM paper, table 3"),
    ("PaLM 540B on TPU v4", 0.462, 0.462, "PaLM paper, table 3"),
    ("Megatron-LM GPT 22B-1T on A100", 0.41, 0.56,
     "Korthikanti et al. 2022, 'Reducing Activation Recomputation in Large Transformer Models'"),
    ("Llama 3 405B on H100", 0.38, 0.43, "The Llama 3 Herd of Models (Meta 2024), table 4"),
    ("MosaicML MPT, bf16 on A100", 0.43, 0.64, "mosaicml/llm-foundry benchmarks README"),
    ("MosaicML MPT, bf16 on H100", 0.26, 0.46, "mosaicml/llm-foundry benchmarks README"),
]


def _check_positive(name: str, value: float) -> float:
    """Raise ValueError with one sentence unless value is a finite number > 0."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if math.isnan(v):
        raise ValueError(f"{name} must be a number, got NaN")
    if math.isinf(v):
        raise ValueError(f"{name} must be finite, got {value}")
    if v <= 0:
        raise ValueError(f"{name} must be greater than zero, got {value:g}")
    return v


def check_fraction(name: str, value: float) -> float:
    """A utilisation must lie in (0, 1]."""
    try:
        v = _check_positive(name, value)
    except ValueError as e:
        if "greater than zero" not in str(e):
            raise
        raise ValueError(f"{name} must be a fraction in (0, 1] (e.g. 0.4 for 40%), got {value:g}") from None
    if v > 1:
        raise ValueError(f"{name} must be a fraction in (0, 1] (e.g. 0.4 for 40%), got {value:g}")
    return v


# ---- FLOPs ------------------------------------------------------------------------------------

def forward_flops_per_token(params: float) -> float:
    """2·N: one multiply and one add per parameter per token (Kaplan et al. 2020, table 1)."""
    return 2.0 * _check_positive("params", params)


def training_flops_per_token(params: float, n_layers: int | None = None, n_heads: int | None = None,
                             head_dim: int | None = None, seq_len: int | None = None) -> float:
    """Model FLOPs per training token.

    Without the architecture: 6·N (forward 2·N, backward 4·N; Kaplan et al. 2020).
    With layers L, heads H, head dimension Q and sequence length T:
    6·N + 12·L·H·Q·T (PaLM, Chowdhery et al. 2022, appendix B). The second term is the attention
    score and value matmuls (2·T·H·Q each per token and layer in the forward, times 3 for forward +
    backward); it carries no parameters, so 6·N misses it, which matters when T is large next to
    the model width (T ≳ 8·d_model / 12).
    """
    base = 6.0 * _check_positive("params", params)
    attn = attention_flops_per_token(n_layers, n_heads, head_dim, seq_len)
    return base + 3.0 * attn


def attention_flops_per_token(n_layers: int | None, n_heads: int | None, head_dim: int | None,
                              seq_len: int | None) -> float:
    """Forward attention FLOPs per token: 4·L·H·Q·T (one third of PaLM's 12·L·H·Q·T training term).

    Zero unless all four are given (PaLM appendix B; causal masking is not discounted, as in PaLM).
    """
    given = [v for v in (n_layers, n_heads, head_dim, seq_len) if v is not None]
    if not given:
        return 0.0
    if len(given) != 4:
        raise ValueError("the attention term needs all of layers, heads, head dimension and sequence length")
    L = _check_positive("layers", n_layers)
    H = _check_positive("heads", n_heads)
    Q = _check_positive("head dimension", head_dim)
    T = _check_positive("sequence length", seq_len)
    return 4.0 * L * H * Q * T


def training_flops(params: float, tokens: float, **arch) -> float:
    """Model FLOPs of a training run: 6·N·D (Kaplan et al. 2020), plus PaLM's attention term when
    the architecture is given (``n_layers``, ``n_heads``, ``head_dim``, ``seq_len``).

    GPT-3: 6 × 175e9 × 300e9 = 3.15e23 (the paper's table D.1 gives 3.14e23).
    For convolutional networks N·D under-counts (weights are reused at every position): measure
    with the probe instead (``diag check`` records FLOPs of one real step).
    """
    return training_flops_per_token(params, **arch) * _check_positive("tokens", tokens)


def hardware_flops(params: float, tokens: float, recompute: str = "none", **arch) -> float:
    """FLOPs the hardware executes for training.

    ``recompute="none"``: equal to the model FLOPs (6·N·D).
    ``recompute="full"``: every layer's forward runs again during the backward, 8·N·D
    (Narayanan et al. 2021, section 5.1; Korthikanti et al. 2022 call the ratio of the two utilisations
    HFU/MFU). With the attention term, the extra forward adds 4·L·H·Q·T per token as well.
    """
    model = training_flops(params, tokens, **arch)
    if recompute in (None, "none"):
        return model
    if recompute != "full":
        raise ValueError(f"recompute must be 'none' or 'full', got {recompute!r}")
    extra_fwd = (forward_flops_per_token(params) + attention_flops_per_token(**_arch(arch))) * float(tokens)
    return model + extra_fwd


def eval_flops(params: float, tokens: float, **arch) -> float:
    """FLOPs of evaluation (forward only): 2·N·D (Kaplan et al. 2020), plus the forward attention
    term 4·L·H·Q·T per token when the architecture is given (PaLM appendix B)."""
    per_tok = forward_flops_per_token(params) + attention_flops_per_token(**_arch(arch))
    return per_tok * _check_positive("eval tokens", tokens)


def _arch(arch: dict) -> dict:
    return {"n_layers": arch.get("n_layers"), "n_heads": arch.get("n_heads"),
            "head_dim": arch.get("head_dim"), "seq_len": arch.get("seq_len")}


def chinchilla_tokens(params: float) -> float:
    """Compute-optimal training tokens for N parameters: ≈ 20·N (Hoffmann et al. 2022)."""
    return CHINCHILLA_TOKENS_PER_PARAM * _check_positive("params", params)


# ---- time and money -------------------------------------------------------------------------------

def gpu_seconds(flops: float, peak_flops_per_s: float, utilisation: float) -> float:
    """Seconds of one device: FLOPs / (peak × utilisation).

    Pass model FLOPs with MFU, or hardware FLOPs with HFU; never mix them.
    """
    return _check_positive("FLOPs", flops) / (_check_positive("peak FLOP/s", peak_flops_per_s)
                                              * check_fraction("MFU", utilisation))


def gpu_hours(flops: float, peak_flops_per_s: float, utilisation: float) -> float:
    """GPU-hours = FLOPs / (peak × MFU) / 3600.

    GPT-3 on A100 (312e12 dense bf16): 3.15e23 / (312e12 × 0.30) / 3600 ≈ 934,800 GPU-hours;
    at 0.50 ≈ 560,900 (see docs/cost.md).
    """
    return gpu_seconds(flops, peak_flops_per_s, utilisation) / SECONDS_PER_HOUR


def wall_days(gpu_hours_total: float, count: int) -> float:
    """Wall-clock days on ``count`` devices, assuming perfect scaling (the MFU given is the one
    reached at that scale: communication overhead belongs in the MFU)."""
    return float(gpu_hours_total) / _check_positive("GPU count", count) / HOURS_PER_DAY


def money(gpu_hours_total: float, price_per_gpu_hour: float | None) -> float | None:
    """Cost = GPU-hours × price per GPU-hour (None when no price is known)."""
    if price_per_gpu_hour is None:
        return None
    return float(gpu_hours_total) * float(price_per_gpu_hour)


def utilisation(flops: float, seconds: float, peak_flops_per_s: float, devices: int = 1) -> float:
    """Achieved FLOP/s over the dense peak: MFU with model FLOPs, HFU with executed FLOPs."""
    return float(flops) / float(seconds) / (float(peak_flops_per_s) * devices)


def hfu_from_mfu(mfu: float, recompute: str = "none") -> float:
    """HFU for the same wall time: MFU × (hardware FLOPs / model FLOPs) = MFU × 8/6 with full
    recomputation (without the attention term)."""
    return float(mfu) * (8.0 / 6.0 if recompute == "full" else 1.0)
