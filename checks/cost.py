"""Cost checks: the model FLOPs utilisation the run achieved, measured on one real step."""
from __future__ import annotations

from diag.checks.api import device_busy, check, DEFAULT_MFU_LLM, DEFAULT_MFU_OTHER, flops_summary, Severity, TYPICAL_MFU

from ._util import ms, pct

PALM = "https://arxiv.org/abs/2204.02311"
LOW_MFU = 0.20          # below every large public run in formulas.TYPICAL_MFU (GPT-3 on V100: 21%)
DATA_SHARE = 0.10       # TraceML warns at 10% input wait
OTHER_SHARE = 0.20
OPT_SHARE = 0.20
SMALL_BATCH = 16
SMALL_BATCH_TOKENS = 8192


def _sci(x) -> str:
    return f"{x:.3g}".replace("e+", "e") if isinstance(x, (int, float)) else "N/A"


def _typical_for(gpu: str | None) -> list[tuple[str, float, float, str]]:
    key = (gpu or "").lower()
    fam = next((f for f in ("h100", "h200", "a100", "v100") if f in key), None)
    if fam == "h200":
        fam = "h100"
    rows = [t for t in TYPICAL_MFU if fam and fam in t[0].lower()]
    return rows or TYPICAL_MFU


def _fmt_range(lo: float, hi: float) -> str:
    return f"{lo:.0%}" if lo == hi else f"{lo:.0%}-{hi:.0%}"


def _hints(r, m: dict, s: dict, ev) -> list[tuple[str, str, str | None]]:
    """(reason, fix, snippet) that would raise MFU, from the rest of the evidence, biggest first."""
    out: list[tuple[float, str, str, str | None]] = []
    med = r.median_step()
    if med and med["total_s"] > 0:
        total = med["total_s"]
        dw = r.data_wait_share()   # the one data-wait share dataloader.workers reports
        data = dw["share"] if dw else med["data_s"] / total
        if data >= DATA_SHARE:
            out.append((data, f"the step waits {pct(data)} of its time for data (see dataloader.workers)",
                        "Feed the GPU faster: more DataLoader workers, pin_memory=True, persistent_workers=True.",
                        "DataLoader(ds, batch_size=..., num_workers=8, pin_memory=True, persistent_workers=True)"))
        other = med["other_s"] / total
        if other >= OTHER_SHARE:
            out.append((other, f"{pct(other)} of the step is outside forward, backward and the optimizer "
                               "(logging, .item() synchronisations, host-side work)",
                        "Move host work out of the loop: log every N steps, avoid .item()/.cpu() per step.", None))
        opt = med["optimizer_s"] / total
        if opt >= OPT_SHARE:
            out.append((opt, f"the optimizer takes {pct(opt)} of the step",
                        "Use the fused (or foreach) optimizer implementation.",
                        "torch.optim.AdamW(model.parameters(), lr=..., fused=True)"))
    prec = m.get("precision")
    if prec in ("fp32", "tf32") and m.get("gpu"):
        out.append((0.5, f"the model runs in {prec}: on this GPU bf16/fp16 tensor cores have a higher peak "
                         f"(MFU here is measured against the {prec} peak)",
                    "Train under bf16 autocast (fp16 with a GradScaler on GPUs without bf16).",
                    "with torch.autocast(device_type='cuda', dtype=torch.bfloat16):\n    loss = model(x)"))
    samples = m.get("samples")
    tokens = m.get("tokens")
    if samples and samples < SMALL_BATCH and (not tokens or tokens < SMALL_BATCH_TOKENS) \
            and s.get("mfu") is not None and s["mfu"] < LOW_MFU:
        out.append((0.15, f"the batch is small ({samples} samples per step): small matrix multiplies use a "
                         "fraction of the GPU",
                    "Raise the batch size if memory allows (see `diag memory` for the largest that fits).", None))
    if m.get("recompute_detected") and s.get("hfu") and s.get("mfu"):
        out.append((0.2, f"activation recomputation runs extra forwards (HFU {pct(s['hfu'])} vs MFU {pct(s['mfu'])})",
                    "Recompute selectively (attention only) or not at all when memory allows.", None))
    if m.get("compiled") and m.get("method") != "analytic":
        out.append((0.1, "the model is compiled: FlopCounterMode may not see fused kernels, so the FLOPs and "
                         "the MFU can read low", "Compare with an uncompiled run.", None))
    out.sort(key=lambda t: -t[0])
    return [(a, b, c) for _, a, b, c in out]


@check(id="cost.mfu", title="Model FLOPs utilisation", severity="info",
       needs=["ranks.flops", "ranks.steps"], tags=["cost", "performance"], docs=PALM)
def cost_mfu(ctx):
    """The model FLOPs utilisation (MFU) of the run: FLOPs of one real training step (counted with
    torch.utils.flop_counter.FlopCounterMode) over the median step time, divided by the dense peak
    of the device for the precision used (from the GPU catalogue). Warning below 20% (every large
    public run reaches more: GPT-3 21%, Megatron 41-56%, PaLM 46%, Llama 3 38-43%); otherwise info,
    with what typical well-tuned runs reach on that GPU class and what in the evidence would raise it.
    Skipped on CPU or on a GPU the catalogue does not know (the achieved FLOP/s are still reported)."""
    ev = ctx.evidence
    title = ctx.title
    if not ev.ranks:
        yield ctx.skip("No process was observed.")
        return
    r = ev.primary
    flops = r.flops if isinstance(r.flops, dict) else {}
    m = flops.get("measured")
    if not m:
        if ev.run_kind() == "evaluation":
            yield ctx.skip("An evaluation-only run: MFU is measured on a training step (forward, backward and "
                           "optimizer step), and this run trained none.")
            return
        reason = flops.get("status") or "FLOPs were not measured (the flopcounter probe extension did not run)"
        yield ctx.skip(f"No FLOP measurement: {reason}.".replace("..", "."))
        return
    if not m.get("flops"):
        yield ctx.skip("The measured step counted no FLOPs (compiled or custom kernels are "
                                        "invisible to FlopCounterMode).", step=m.get("step"))
        return
    # judged here, against diag's catalogue, from the recorded FLOPs and device name
    m, s = flops_summary(r)
    if not s or not s.get("step_s"):
        yield ctx.skip("No timed step besides the measured one: run a few more steps.",
                      flops=m["flops"])
        return
    numbers = {
        "step": m.get("step"), "model_flops_per_step": m.get("model_flops"), "hardware_flops_per_step": m["flops"],
        "median_step_s": s["step_s"], "steps_timed": s["steps_timed"],
        "achieved_tflops": (s["model_flops_per_s"] or 0) / 1e12, "mfu": s["mfu"], "hfu": s["hfu"],
        "peak_tflops": (m.get("peak_flops") or 0) / 1e12 or None, "precision": m.get("precision"),
        "device": m.get("device_name") or m.get("device"), "gpu": m.get("gpu"),
        "samples_per_s": s["samples_per_s"], "tokens_per_s": s["tokens_per_s"],
        "counter_overhead_ratio": s["overhead_ratio"], "ratio_to_6ND": m.get("ratio_to_analytic"),
    }
    numbers["mfu_clock"] = "wall"          # MFU over the wall-clock step (what a job pays for)
    busy = device_busy(r)                  # CUDA runs with a device timeline: also over GPU busy time
    if busy and busy[0] > 0 and s["mfu"] is not None and s["step_s"]:
        numbers.update(device_busy_s=round(busy[0], 6), device_step_s=round(busy[1], 6),
                       mfu_busy=round(s["mfu"] * s["step_s"] / busy[0], 4))
    achieved = f"{s['model_flops_per_s'] / 1e12:.3g} TFLOP/s" if s["model_flops_per_s"] >= 1e11 else \
        f"{s['model_flops_per_s'] / 1e9:.3g} GFLOP/s"
    rate = (f"{s['tokens_per_s']:,.0f} tokens/s" if s.get("tokens_per_s")
            else f"{s['samples_per_s']:,.1f} samples/s" if s.get("samples_per_s") else "")
    if s["mfu"] is None:
        why = m.get("peak_note") or "no catalogue peak for this device"
        yield ctx.skip(f"The run achieved {achieved} ({_sci(m.get('model_flops'))} FLOPs per step in "
                      f"{ms(s['step_s'])}{', ' + rate if rate else ''}), but MFU needs a dense peak: {why}.",
                      **numbers)
        return
    mfu = s["mfu"]
    typical = _typical_for(m.get("gpu"))
    typical_txt = "; ".join(f"{label} {_fmt_range(lo, hi)}" for label, lo, hi, _ in typical[:3])
    hints = _hints(r, m, s, ev)
    numbers["typical"] = [{"run": t[0], "low": t[1], "high": t[2], "source": t[3]} for t in typical]
    numbers["suggestions"] = [h[0] for h in hints]
    device = m.get("device_name") or m.get("gpu")
    base = (f"The run reaches {pct(mfu)} MFU: {achieved} of model FLOPs per device against the {m.get('precision')} "
            f"dense peak of {(m.get('peak_flops') or 0) / 1e12:,.1f} TFLOPS ({device}), median step {ms(s['step_s'])}")
    if m.get("recompute_detected") and s.get("hfu"):
        base += f", HFU {pct(s['hfu'])}"
    if "mfu_busy" in numbers:
        # "busy" is the device span less the idle gaps at the step's marks: gaps between kernels
        # inside a phase (a launch-bound step) still count as busy, so this is a lower bound on the
        # MFU of the kernels themselves
        base += (f" (on wall time; {pct(numbers['mfu_busy'])} over the device clock's busy time, "
                 f"{ms(numbers['device_busy_s'])} per step, which still counts gaps between kernels)")
    if mfu > 1.0:
        yield ctx.finding(
            severity=Severity.WARNING, title="MFU above 100%",
            message=base + "; more than the hardware can do, so the catalogue's peak for this device is likely wrong.",
            evidence=numbers, fix="Check the GPU's entry (diag cost --list-gpus) and override it in "
                                  "~/.config/diag/gpus.toml.")
        return
    if mfu < LOW_MFU:
        sev, ttl = Severity.WARNING, "Low model FLOPs utilisation"
    else:
        sev, ttl = Severity.INFO, title
    msg = base + f"; well-tuned large runs reach {typical_txt}"
    if hints:
        msg += f"; what would raise it: {hints[0][0]}"
    fix = hints[0][1] if hints else ("Larger batches, bf16 autocast and a fused optimizer are the usual levers; "
                                     "profile the step to see which kernels dominate.")
    snippet = hints[0][2] if hints else None
    yield ctx.finding(
        severity=sev, title=ttl, message=msg + ".", evidence=numbers,
        why=(f"MFU turns into money: at {pct(mfu)} a job pays for {1 / mfu:.1f}x the GPU time its FLOPs need. "
             f"Without a measurement, estimates assume {DEFAULT_MFU_LLM:.0%} (language models) or "
             f"{DEFAULT_MFU_OTHER:.0%} (other models) (Epoch AI)."),
        fix=fix + (" Other suggestions: " + "; ".join(h[0] for h in hints[1:]) + "." if len(hints) > 1 else ""),
        snippet=snippet,
    )
