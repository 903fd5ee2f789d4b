"""Precision checks: automatic mixed precision, gradient scaling, TF32, tensor-core friendly sizes."""
from __future__ import annotations

from diag.checks.api import check, cuda_training, Severity

from ._framework import framework_entry, framework_of, words
from ._perf import (PERF_MISSING, amdahl, autocast_dtypes, cap_str, capability, cuda_device, gain_sentence,
                    guide, half_param_dtypes, perf_ran, precision_gain, short_file, training_models,
                    training_sites)
from ._util import loc, pct

AMP_DOCS = "https://pytorch.org/docs/stable/amp.html"
SCALER_DOCS = "https://pytorch.org/docs/stable/amp.html#gradient-scaling"
TF32_DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#tensorfloat-32-tf32-on-ampere-and-later-devices"

AMP_MAX_SPEEDUP = 3.0        # tuning guide: "up to 3x overall speedup on Volta and newer"
COMPUTE_WARN_SHARE = 0.30    # forward+backward under 30% of the step: the step is bound elsewhere (info)
TF32_PEAK_RATIO = 494.5 / 67  # H100 SXM dense TF32 vs FP32 peaks (A100: 156 / 19.5 = 8x); an upper bound
ALIGN = 8                    # tensor cores want fp16/bf16 matrix dimensions in multiples of 8
ALIGN_WARN_SHARE = 0.10      # misaligned layers holding >= 10% of the matmul weights: warning
ALIGN_MIN_SHARE = 0.01       # below 1% (a 10-class head): ignored


TENSOR_CORES = "this check is about CUDA tensor cores (see amp.availability for what this machine supports)."


@check(id="amp.unused", title="Training in fp32 on a GPU with tensor cores", severity="warning",
       needs=["ranks.forwards", "ranks.models", "environment.devices", "ranks.steps"], tags=["amp", "gpu"],
       docs=guide("use-mixed-precision-and-amp"),
       requires=[cuda_training(TENSOR_CORES)])
def amp_unused(ctx):
    """Training forwards run in fp32 (no autocast, fp32 parameters) on a CUDA device whose tensor
    cores take fp16 (compute capability >= 7.0) or bf16 (>= 8.0). Recommends bf16 autocast (fp16
    plus GradScaler before Ampere) in the words of the framework that ran the loop (plain PyTorch,
    TrainingArguments(bf16=True), Trainer(precision="bf16-mixed"), Accelerator(mixed_precision=
    "bf16")). The gain is a range with its basis (Amdahl's law at the catalogue's bf16/fp32 peak
    ratio): the low end speeds up only the time the counted matmul FLOPs need at the fp32 peak, the
    high end all of forward+backward (device clock when there is a timeline). When those FLOPs would
    take under 15% of the step the step is not matmul-bound: the finding says the gain cannot be
    predicted and is info (measure it). Warning when forward+backward take >= 30% of the step,
    info below. Skipped on CPU-only runs."""
    ev = ctx.evidence
    r = ev.primary
    models = ctx.models
    sites = training_sites(r)
    dev = cuda_device(ev, models)
    cap = capability(dev)
    name = dev.name if dev else "the GPU"
    if cap is not None and cap < (7, 0):
        yield ctx.passed(f"{name} (compute capability {cap_str(cap)}) has no tensor cores: mixed precision "
                     "would save memory but not much time.", capability=cap_str(cap), title="No tensor cores to use")
        return
    ac = autocast_dtypes(r)
    half = half_param_dtypes(models)
    if ac or half:
        used = sorted(ac | half)
        yield ctx.passed(f"Training forwards run in {', '.join(used)} "
                     f"({'autocast' if ac else 'half-precision parameters'}).", dtypes=used, title="Mixed precision in use")
        return
    bf16 = cap is None or cap >= (8, 0)
    dtype = "bfloat16" if bf16 else "float16"
    g = precision_gain(ev, r, dev, "bf16" if bf16 else "fp16", "bf16" if bf16 else "fp16")
    share = g["share_high"]
    fw = framework_of(ev)
    numbers = {"device": name, "capability": cap_str(cap), "recommended_dtype": dtype,
               "forward_backward_share": share, "step_s": g["step_s"],
               "max_step_speedup": g["high"], "min_step_speedup": g["low"] if g["predictable"] else None,
               "speedup_basis": g, "forwards": sum(s.count for s in sites), "framework": fw,
               "knob": "amp.bf16" if bf16 else "amp.fp16"}
    sev = Severity.WARNING if share is None or share >= COMPUTE_WARN_SHARE else Severity.INFO
    if g["launch_bound"]:
        sev = Severity.INFO          # the gain is not predictable: said, and measured first
    gain = gain_sentence(g)
    how, snippet, _ = words(ev, numbers["knob"])
    if not bf16:
        how = how.rstrip(".") + f" (this GPU, compute capability {cap_str(cap)}, has no bf16 tensor cores)."
    site = max(sites, key=lambda s: s.count)
    yield ctx.finding(
        severity=sev,
        message=f"Training forwards run in float32 on {name} (compute capability {cap_str(cap)}), whose "
                f"tensor cores take {dtype}{gain}.",
        evidence=numbers,
        why="Tensor cores run fp16/bf16 matrix multiplies many times faster than fp32, and half-precision "
            "activations halve the memory traffic; autocast keeps precision-sensitive ops in fp32.",
        fix=how, snippet=snippet, location=loc(site.location) if not fw else loc(framework_entry(ev) or site.location),
    )


@check(id="amp.fp16-without-scaler", title="fp16 without gradient scaling", severity="warning",
       needs=["ranks.forwards", "ranks.models", "ranks.amp"], tags=["amp"], docs=SCALER_DOCS)
def amp_fp16_without_scaler(ctx):
    """Training forwards under fp16 autocast (or with fp16 parameters) and no enabled GradScaler
    scaling the loss: small gradients underflow to zero in fp16, so training silently stalls or
    diverges. bf16 needs no scaler. Observed through GradScaler construction and scale() calls."""
    ev = ctx.evidence
    r = ev.primary
    sites = training_sites(r)
    if not sites:
        yield ctx.skip("No training forward was observed.")
        return
    fp16_sites = [s for s in sites if s.autocast == "float16"]
    models = training_models(r)
    fp16_params = [m for m in models if "float16" in (m.dtypes or [])]
    if not fp16_sites and not fp16_params:
        used = sorted(autocast_dtypes(r) | half_param_dtypes(models)) or ["float32"]
        yield ctx.passed(f"Training runs in {', '.join(used)}: no loss scaling needed.",
                     dtypes=used, title="No fp16 training")
        return
    if not perf_ran(r) and not r.amp:
        yield ctx.skip(f"fp16 is used, but GradScaler use was not recorded: {PERF_MISSING}.")
        return
    sc = (r.amp or {}).get("scaler") or {}
    steps = r.step_stats.count
    numbers = {"fp16_forwards": sum(s.count for s in fp16_sites), "fp16_param_models": len(fp16_params),
               "scalers_created": sc.get("created", 0), "scaler_enabled": sc.get("enabled"),
               "scale_calls": sc.get("scale_calls", 0), "steps": steps}
    enabled_and_used = sc.get("enabled") and sc.get("scale_calls", 0) > 0
    if enabled_and_used:
        yield ctx.passed(f"An enabled GradScaler scaled the loss {sc['scale_calls']} time(s) over {steps} step(s).",
                     **numbers, title="fp16 with gradient scaling")
        return
    if not sc.get("created"):
        what = "no GradScaler was created"
    elif not sc.get("enabled"):
        what = "a GradScaler was created with enabled=False"
    else:
        what = "a GradScaler was created but scaler.scale(loss) was never called"
    site = (fp16_sites or sites)[0]
    where = f" ({short_file(site.location)})" if site.location else ""
    dev = site.autocast_device or "cuda"
    yield ctx.finding(
        severity=Severity.WARNING,
        message=f"{numbers['fp16_forwards'] or 'Every'} training forward(s) ran under float16{where}, but {what}.",
        evidence=numbers,
        why="fp16 cannot represent gradients below ~6e-8; without loss scaling they flush to zero and "
            "those weights stop learning (or the loss turns NaN). GradScaler multiplies the loss before "
            "backward and unscales before the optimizer step, skipping steps with inf/NaN.",
        fix="Scale the loss with torch.amp.GradScaler (enabled=True), or switch autocast to bfloat16, "
            "which has fp32's range and needs no scaler (compute capability >= 8.0).",
        snippet=(f'scaler = torch.amp.GradScaler("{dev}")\n'
                 f'with torch.autocast("{dev}", dtype=torch.float16):\n'
                 "    loss = loss_fn(model(x), y)\nscaler.scale(loss).backward()\n"
                 "scaler.step(opt)\nscaler.update()"),
        location=loc(sc.get("location")) or loc(site.location),
    )


@check(id="amp.availability", title="Mixed precision on this machine", severity="info",
       needs=["environment.devices", "ranks.extras.perf"], tags=["amp"], docs=AMP_DOCS)
def amp_availability(ctx):
    """An info line saying which reduced precisions this machine's devices support and why: fp16
    tensor cores from compute capability 7.0 (Volta), bf16 and TF32 from 8.0 (Ampere), fp8 from 8.9
    (Ada/Hopper). On a CPU-only run: bf16 autocast on CPU, fast only with AVX512-BF16/AMX, and the
    GPU-specific AMP checks are skipped."""
    ev = ctx.evidence
    envr = ev.environment
    cuda = [d for d in envr.devices if d.type == "cuda"]
    perf = (ev.primary.extras or {}).get("perf") or {}
    cpu_cap = perf.get("cpu_capability")
    if cuda:
        parts, support = [], []
        for d in cuda:
            cap = capability(d)
            s = {"index": d.index, "name": d.name, "capability": cap_str(cap),
                 "fp16_tensor_cores": bool(cap and cap >= (7, 0)), "bf16": bool(cap and cap >= (8, 0)),
                 "tf32": bool(cap and cap >= (8, 0)), "fp8": bool(cap and cap >= (8, 9))}
            support.append(s)
            have = [k for k, v in (("fp16", s["fp16_tensor_cores"]), ("bf16", s["bf16"]),
                                   ("TF32", s["tf32"]), ("fp8", s["fp8"])) if v]
            parts.append(f"cuda:{d.index} {d.name} (compute capability {cap_str(cap)}): "
                         + (", ".join(have) if have else "no tensor cores"))
        best = "bfloat16" if all(s["bf16"] for s in support) else "float16 with GradScaler"
        yield ctx.finding(
            severity=Severity.INFO,
            message="; ".join(parts) + f". Use torch.autocast(\"cuda\", dtype=torch.{best.split()[0]})"
                    + (" with a GradScaler" if best.startswith("float16") else "") + " for training.",
            evidence={"devices": support, "cuda": envr.cuda, "torch": envr.torch, "cpu_capability": cpu_cap},
            why="fp16 tensor cores arrived with Volta (7.0); bf16 and TF32 with Ampere (8.0); fp8 with "
                "Ada/Hopper (8.9/9.0).",
        )
        return
    bf16_fast = bool(cpu_cap and ("AMX" in str(cpu_cap).upper() or "BF16" in str(cpu_cap).upper()))
    msg = (f"No CUDA device (torch {envr.torch}, CUDA build: {'yes' if envr.cuda else 'no'}): the GPU "
           "mixed-precision checks (amp.unused, matmul.tf32, tensor-cores.alignment) are skipped. "
           f"On this CPU ({cpu_cap or 'capability unknown'}) torch.autocast(\"cpu\", dtype=torch.bfloat16) "
           + ("runs bf16 matmuls in hardware (AMX/AVX512-BF16)." if bf16_fast else
              "works but is not expected to be faster than fp32 without AVX512-BF16 or AMX."))
    if envr.mps_available:
        msg += " Apple MPS is available: torch.autocast(\"mps\", dtype=torch.float16) is supported there."
    yield ctx.finding(severity=Severity.INFO, message=msg,
                  evidence={"cuda_available": envr.cuda_available, "cuda_build": envr.cuda,
                            "cpu_capability": cpu_cap, "mps_available": envr.mps_available,
                            "cpu_bf16_hardware": bf16_fast})


@check(id="matmul.tf32", title="fp32 matmuls without TF32", severity="warning",
       needs=["environment.float32_matmul_precision", "environment.devices", "ranks.forwards", "ranks.steps"],
       tags=["amp", "gpu"], docs=guide("enable-tensor-cores"),
       requires=[cuda_training(TENSOR_CORES)])
def matmul_tf32(ctx):
    """fp32 training (no autocast) on an Ampere-or-newer GPU (compute capability >= 8.0) with
    `torch.get_float32_matmul_precision() == "highest"` and TF32 matmuls off: matrix multiplies run
    on the slow fp32 path instead of TF32 tensor cores (7-8x the fp32 peak on A100/H100). The gain is
    a range with its basis, as amp.unused's (at the TF32/fp32 peak ratio); info when it cannot be
    predicted (matmul FLOPs under 15% of the step). The fix speaks the framework
    (TrainingArguments(tf32=True); Lightning and Accelerate have no switch: the torch call). Warning when
    forward+backward take >= 30% of the step, info below. Skipped on CPU-only runs."""
    ev = ctx.evidence
    r = ev.primary
    models = ctx.models
    dev = cuda_device(ev, models)
    cap = capability(dev)
    if cap is not None and cap < (8, 0):
        yield ctx.passed(f"{dev.name} (compute capability {cap_str(cap)}) has no "
                     "TF32 tensor cores.", capability=cap_str(cap), title="No TF32 on this GPU")
        return
    if autocast_dtypes(r) or half_param_dtypes(models):
        yield ctx.passed("Training runs under autocast / half "
                     "precision: its matmuls do not use the fp32 path.", title="Matmuls run in reduced precision")
        return
    envr = ev.environment
    prec = envr.float32_matmul_precision
    if prec in ("high", "medium") or envr.allow_tf32_matmul:
        yield ctx.passed(f"float32 matmul precision is {prec!r} "
                     f"(allow_tf32={envr.allow_tf32_matmul}): fp32 matmuls use TF32 tensor cores.",
                     precision=prec, title="TF32 enabled")
        return
    if prec is None:
        yield ctx.skip("The float32 matmul precision was not recorded.")
        return
    g = precision_gain(ev, r, dev, "tf32", "TF32")
    if g["ratio_basis"].startswith("the tuning guide"):
        g["peak_ratio"], g["ratio_basis"] = round(TF32_PEAK_RATIO, 2), "H100 SXM's TF32/fp32 dense peak ratio"
        if g["share_high"] is not None:
            g["high"] = round(amdahl(g["share_high"], TF32_PEAK_RATIO), 2)
    share = g["share_high"]
    sev = Severity.WARNING if share is None or share >= COMPUTE_WARN_SHARE else Severity.INFO
    if g["launch_bound"]:
        sev = Severity.INFO
    name = dev.name if dev else "the GPU"
    fw = framework_of(ev)
    fix, snippet, _ = words(ev, ctx.id)   # the knob has the check's id
    yield ctx.finding(
        severity=sev,
        message=f"fp32 matmuls run at full fp32 precision on {name} (compute capability {cap_str(cap)}, "
                f"float32_matmul_precision={prec!r})" + gain_sentence(g) + ".",
        evidence={"precision": prec, "allow_tf32_matmul": envr.allow_tf32_matmul, "device": name,
                  "capability": cap_str(cap), "forward_backward_share": share,
                  "tf32_to_fp32_peak_ratio": g["peak_ratio"], "max_step_speedup": g["high"],
                  "min_step_speedup": g["low"] if g["predictable"] else None, "speedup_basis": g,
                  "framework": fw, "knob": ctx.id},
        why="TF32 keeps fp32's range with a 10-bit mantissa and runs on tensor cores: H100 494.5 vs 67 "
            "TFLOPS dense (A100: 156 vs 19.5). Most training converges the same; check yours.",
        fix=fix, snippet=snippet, location=loc(framework_entry(ev)) if fw else None,
    )


def _misaligned(layer: dict) -> list[str]:
    bad = []
    t = layer.get("type", "")
    a, b = layer.get("in"), layer.get("out")
    if t == "Embedding":
        if isinstance(b, int) and b % ALIGN:
            bad.append(f"embedding_dim={b}")
        return bad
    if "Conv" in t and isinstance(a, int) and a <= 4:
        a = None        # the first conv of an image model (3 channels): cuDNN pads it
    if isinstance(a, int) and a % ALIGN:
        bad.append(f"in={a}")
    if isinstance(b, int) and b % ALIGN:
        bad.append(f"out={b}")
    return bad


@check(id="tensor-cores.alignment", title="Layer sizes not multiples of 8", severity="warning",
       needs=["ranks.models.layer_shapes", "ranks.forwards", "environment.devices"], tags=["amp", "gpu"],
       docs=guide("use-mixed-precision-and-amp"),
       requires=[cuda_training(TENSOR_CORES)])
def tensor_cores_alignment(ctx):
    """Under fp16/bf16 on CUDA, Linear in/out features, Embedding dims and conv channels that are not
    multiples of 8 keep matmuls off the fastest tensor-core kernels. Weighted by each layer's share of
    the matmul weights (in x out): warning at >= 10%, ignored below 1% (a small classifier head).
    Skipped without CUDA or without mixed precision (see amp.unused)."""
    ev = ctx.evidence
    r = ev.primary
    models = ctx.models
    if not (autocast_dtypes(r) or half_param_dtypes(models)):
        yield ctx.skip("Training runs in fp32, which does not use fp16/bf16 tensor cores "
                                  "(see amp.unused and matmul.tf32).")
        return
    layers = [(m, lay) for m in models for lay in (m.layer_shapes or [])]
    if not layers:
        yield ctx.skip("No Linear/Embedding/convolution layer shapes were recorded.")
        return
    weight = lambda lay: (lay.get("in") or 0) * (lay.get("out") or 0)  # noqa: E731
    total = sum(weight(lay) for _, lay in layers) or 1
    bad = []
    for m, lay in layers:
        why = _misaligned(lay)
        if why:
            bad.append((m, lay, why, weight(lay) / total))
    counted = [b for b in bad if b[3] >= ALIGN_MIN_SHARE]
    share = sum(b[3] for b in counted)
    if not counted:
        yield ctx.passed(f"{len(layers)} layer(s) checked: every one holding >= 1% of the weights has sizes "
                     "in multiples of 8.", layers=len(layers), misaligned_small=len(bad), title="Layer sizes fit tensor cores")
        return
    counted.sort(key=lambda b: -b[3])
    examples = [f"{lay.get('type')}({lay.get('in')}, {lay.get('out')}) in {m.cls}: {', '.join(why)}"
                for m, lay, why, _ in counted[:5]]
    sev = Severity.WARNING if share >= ALIGN_WARN_SHARE else Severity.INFO

    def pad(n):
        return ((n + 63) // 64) * 64 if n > 1000 else ((n + ALIGN - 1) // ALIGN) * ALIGN

    _, lay0, _, _ = counted[0]
    a, b = lay0.get("in"), lay0.get("out")
    yield ctx.finding(
        severity=sev,
        message=f"{len(counted)} layer(s) holding {pct(share)} of the matmul weights have sizes that are "
                f"not multiples of 8: " + "; ".join(examples) + ".",
        evidence={"misaligned_layers": len(counted), "weight_share": round(share, 4),
                  "examples": examples, "layers_checked": len(layers)},
        why="fp16/bf16 tensor-core kernels tile matrices in multiples of 8 elements; other sizes fall back "
            "to slower kernels or padded work (NVIDIA's deep learning performance guide).",
        fix="Pad the sizes up: hidden/feature sizes to a multiple of 8, a vocabulary to a multiple of 64 "
            "(GPT-2's 50257 -> 50304); mask or ignore the padded classes/tokens.",
        snippet=(f"nn.{lay0.get('type')}({pad(a) if isinstance(a, int) else a}, "
                 f"{pad(b) if isinstance(b, int) else b})   # was ({a}, {b})"),
    )


__all__ = ["amp_unused", "amp_fp16_without_scaler", "amp_availability", "matmul_tf32",
           "tensor_cores_alignment"]
