"""Rules from the PyTorch Performance Tuning Guide that are not about data or precision: cuDNN
auto-tuner, zeroing gradients, optimizer implementations, debugging APIs left on, torch.compile."""
from __future__ import annotations

import re

from diag.checks.api import data_wait, check, cuda_training, knob_words, Severity

from ._perf import (PERF_MISSING, guide, perf_ran, phase_medians, short_file, size,
                    training_models, training_sites)
from ._framework import framework_entry, framework_of, knob
from ._util import flag, loc, ms, pct

OPTIM_DOCS = "https://pytorch.org/docs/stable/optim.html#algorithms"
COMPILE_DOCS = "https://pytorch.org/tutorials/intermediate/torch_compile_tutorial.html"

COMPUTE_WARN_SHARE = 0.30       # forward+backward >= 30% of the step: a compute-side fix matters (warning)
MAX_FIXED_SHAPES = 4            # <= 4 distinct input shapes counts as "fixed" for cudnn.benchmark
ZERO_GRAD_WARN_SHARE = 0.02     # zeroing >= 2% of the step: warning, else info
OPTIM_WARN_SHARE = 0.05         # for-loop optimizer taking >= 5% of the step: warning
FUSED_HINT_SHARE = 0.10         # foreach optimizer taking >= 10% of the step: suggest fused (info)
PROFILER_WARN_SHARE = 0.20      # a profiler on for >= 20% of the steps is left on, not a window
COMPILE_SPEEDUP = 1.43          # PyTorch 2.0 launch: mean training speed-up on A100 over 163 models
COMPILE_COST_S = 60.0           # assumed one-off compile time for the break-even estimate
DATA_BOUND_SHARE = 0.30


# torch's convolution modules by class name (nn.ConvNd, their transposes and lazy forms, the fused
# intrinsic/QAT ones), beside the probe's isinstance(m, _ConvNd) record in layer_shapes
_CONV_NAME = re.compile(r"^(Lazy)?Conv(Transpose)?[123]d$|^Conv(Bn)?(ReLU|Add|AddReLU)?[123]d$")


def _convolutions(m) -> tuple[dict, dict]:
    """({class: count} of the model's real convolutions, {class: count} of modules named like one
    that are not): layer_shapes records a layer of a convolution type only for torch's _ConvNd
    modules, so transformers' Conv1D (a linear layer, addmm) is not one."""
    types = m.module_types or {}
    shapes = m.layer_shapes or []
    from_shapes: dict[str, int] = {}
    for lay in shapes:
        t = lay.get("type") or ""
        if t not in ("Linear", "Embedding"):
            from_shapes[t] = from_shapes.get(t, 0) + 1
    by_name = {k: v for k, v in types.items() if _CONV_NAME.match(k)}
    # a subclass of nn.Conv2d keeps its own name (recorded through layer_shapes); torch's exact class
    # names count too (layer_shapes is bounded, and older evidence may lack it)
    real = {**{k: types.get(k, v) for k, v in from_shapes.items()}, **by_name}
    other = {k: v for k, v in types.items() if "conv" in k.lower() and k not in real}
    return real, other


@check(id="cudnn.benchmark", title="cuDNN auto-tuner off for a convolutional model", severity="warning",
       needs=["environment.cudnn_benchmark", "ranks.models.module_types", "ranks.extras.input_shapes"],
       tags=["gpu", "tuning"], docs=guide("enable-cudnn-auto-tuner"),
       requires=[cuda_training("cudnn.benchmark only affects cuDNN convolutions on CUDA.")])
def cudnn_benchmark(ctx):
    """A convolutional model trained on CUDA with fixed input shapes (at most 4 distinct shapes
    seen) while `torch.backends.cudnn.benchmark` is False. Convolutions are torch's own
    (nn.Conv1d/2d/3d, their transposes: the modules the probe recorded as _ConvNd), not modules named
    Conv (transformers' Conv1D is a linear layer); the evidence names the modules counted and the
    look-alikes left out. Without the auto-tuner cuDNN uses heuristics instead of timing
    the convolution algorithms once per shape. Warning when forward+backward take >= 30% of the
    step, info below. Passes with varying shapes (the auto-tuner would re-run per shape).
    Skipped without CUDA."""
    ev = ctx.evidence
    r = ev.primary
    models = ctx.models
    counted = [(m,) + _convolutions(m) for m in models]
    convs = [(m, sum(c.values()), c) for m, c, _ in counted if c]
    lookalikes = {k: v for _, _, other in counted for k, v in other.items()}
    if not convs:
        yield ctx.passed("The model has no convolution layers (nn.Conv1d/2d/3d or their transposes): "
                         "cudnn.benchmark would not help"
                         + (f" ({', '.join(f'{k} x{v}' for k, v in sorted(lookalikes.items()))} "
                            "named like one, but not a torch convolution: transformers' Conv1D is a linear "
                            "layer)" if lookalikes else "") + ".",
                         title="No convolutions", conv_modules={}, not_convolutions=lookalikes)
        return
    if ev.environment.cudnn_benchmark:
        yield ctx.passed("torch.backends.cudnn.benchmark is True.", title="cuDNN auto-tuner on")
        return
    if ev.environment.cudnn_benchmark is None:
        yield ctx.skip("The cudnn.benchmark flag was not recorded.")
        return
    m, nconv, kinds = convs[0]
    shapes = ((r.extras or {}).get("input_shapes") or {}).get(str(m.id))
    distinct = shapes.get("distinct") if shapes else None
    numbers = {"model": m.cls, "conv_layers": nconv, "conv_modules": kinds, "not_convolutions": lookalikes,
               "distinct_input_shapes": distinct,
               "shapes": (shapes or {}).get("shapes"), "cudnn_deterministic": ev.environment.cudnn_deterministic}
    if distinct is not None and distinct > MAX_FIXED_SHAPES:
        yield ctx.passed(f"{distinct} distinct input shapes were seen: the auto-tuner would benchmark each one "
                     "again, so leaving it off is reasonable.", **numbers, title="Input shapes vary")
        return
    ph = phase_medians(r)
    share = ph["compute_share"] if ph else None
    numbers["forward_backward_share"] = round(share, 4) if share is not None else None
    sev = Severity.WARNING if share is None or share >= COMPUTE_WARN_SHARE else Severity.INFO
    shape_txt = (f"{distinct} input shape(s) {numbers['shapes']}" if distinct is not None
                 else "input shapes not recorded")
    site = next((s for s in training_sites(r) if s.model == m.id and s.location), None)
    fw = framework_of(ev)
    fix, snippet, _ = knob_words(ctx.id, fw)   # the knob has the check's id
    kinds_txt = ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))
    yield ctx.finding(
        severity=sev,
        message=f"{m.cls} has {nconv} convolution layer(s) ({kinds_txt}) and trains on CUDA with {shape_txt}, but "
                "torch.backends.cudnn.benchmark is False"
                + (f"; forward+backward take {pct(share)} of the step" if share is not None else "") + ".",
        evidence=numbers,
        why="With benchmark on, cuDNN times the available convolution algorithms for each new input shape "
            "once and keeps the fastest; with fixed shapes that one-off cost buys faster steps for the "
            "rest of the run.",
        fix=fix, snippet=snippet,
        location=loc(site.location) if site else loc(framework_entry(ev)),
    )


@check(id="optim.zero-grad", title="Gradients zeroed instead of set to None", severity="info",
       needs=["ranks.optimizers.zero_grad_set_to_none", "ranks.optimizers.zero_grad_s",
              "ranks.extras.module_zero_grad", "ranks.steps"], tags=["optimizer", "tuning"],
       docs=guide("use-parameter-grad-none-instead-of-model-zero-grad-or-optimizer-zero-grad"))
def optim_zero_grad(ctx):
    """`optimizer.zero_grad(set_to_none=False)` or `model.zero_grad(set_to_none=False)`: every step
    writes zeros into every gradient, the next backward adds into them instead of assigning, and the
    gradient memory stays allocated between steps. Sized by the measured time inside zero_grad per
    call as a share of the step: warning at >= 2%, info below. Skipped when no zero_grad() call was
    seen (gradients cleared by `param.grad = None` are fine)."""
    ev = ctx.evidence
    r = ev.primary
    mz = (r.extras or {}).get("module_zero_grad") or {}
    calls = sum(o.zero_grad_calls for o in r.optimizers) + int(mz.get("calls", 0) or 0)
    if calls == 0:
        yield ctx.skip("No optimizer.zero_grad() or model.zero_grad() call was observed "
                                  "(param.grad = None is already the recommended way).")
        return
    bad_opts = [o for o in r.optimizers if o.zero_grad_calls and o.zero_grad_set_to_none is False]
    bad_mod = int(mz.get("set_to_none_false", 0) or 0)
    if not bad_opts and not bad_mod:
        yield ctx.passed(f"{calls} zero_grad() call(s), all with set_to_none=True.",
                     calls=calls, title="Gradients set to None")
        return
    zs = sum(o.zero_grad_s for o in bad_opts) + (float(mz.get("s", 0.0) or 0.0) if bad_mod else 0.0)
    zc = sum(o.zero_grad_calls for o in bad_opts) + (int(mz.get("calls", 0) or 0) if bad_mod else 0)
    per_call = zs / zc if zc else 0.0
    ph = r.median_step()
    step_s = ph["total_s"] if ph else None
    share = per_call / step_s if step_s else None
    opt_info = (r.extras or {}).get("optimizers") or {}
    grad_bytes = sum(int((opt_info.get(str(o.id)) or {}).get("param_bytes") or 0) for o in bad_opts) or \
        sum(m.param_bytes for m in training_models(r)) or None
    numbers = {"calls_set_to_none_false": sum(o.zero_grad_calls for o in bad_opts) + bad_mod,
               "zero_grad_s_per_call": round(per_call, 7), "step_s": round(step_s, 6) if step_s else None,
               "share_of_step": round(share, 5) if share is not None else None,
               "grad_bytes_kept": grad_bytes, "optimizers": [o.cls for o in bad_opts],
               "module_zero_grad_calls": bad_mod}
    sev = Severity.WARNING if share is not None and share >= ZERO_GRAD_WARN_SHARE else Severity.INFO
    fw = framework_of(ev)
    fix, snippet, lever = knob_words("optim.set-to-none", fw)
    numbers.update(framework=fw, knob="optim.set-to-none")
    if not lever:
        # the framework zeroes the gradients itself, set_to_none by default: no setting to turn, and the
        # call may be code of the user's or not (the fix says where to look; never an order to change code)
        sev = Severity.INFO
    who = f"{bad_opts[0].cls}.zero_grad(set_to_none=False)" if bad_opts else "model.zero_grad(set_to_none=False)"
    cost = (f"; zeroing takes {ms(per_call)} per call ({pct(share)} of the {ms(step_s)} step)"
            if share is not None else "")
    mem = f" and keeps {size(grad_bytes)} of gradients allocated between steps" if grad_bytes else ""
    yield ctx.finding(
        severity=sev,
        message=f"{who} writes zeros into every gradient each step{cost}{mem}.",
        evidence=numbers,
        why="Setting .grad to None skips the memset, lets backward assign instead of accumulate (fewer "
            "memory operations), and frees gradient memory until backward needs it again.",
        fix=fix, snippet=snippet,
        location=loc(mz.get("location") if bad_mod and not bad_opts else _zero_grad_site(ev)),
    )


def _zero_grad_site(ev) -> dict | None:
    """The script's zero_grad(...) call that passes set_to_none=False (the fix's line), else its only
    zero_grad() call, from the script's source (run.script_facts)."""
    facts = getattr(ev.run, "script_facts", None) or {}
    calls = facts.get("zero_grad") or []
    pick = [c for c in calls if c.get("set_to_none") is False] or (calls if len(calls) == 1 else [])
    return {"file": facts["file"], "line": pick[0]["line"]} if pick else None


@check(id="optim.foreach-fused", title="Optimizer without foreach/fused kernels", severity="warning",
       needs=["ranks.optimizers", "ranks.extras.optimizers", "ranks.steps.optimizer_s"],
       tags=["optimizer", "gpu", "tuning"], docs=OPTIM_DOCS)
def optim_foreach_fused(ctx):
    """An optimizer over CUDA parameters running the per-parameter for-loop implementation
    (foreach=False, or a class without foreach) where foreach (multi-tensor) or fused kernels
    exist. Sized by the measured optimizer.step() share of the step: warning at >= 5%, info below;
    an info hint to try fused=True when a foreach optimizer takes >= 10%. Skipped for CPU parameters."""
    ev = ctx.evidence
    r = ev.primary
    if not r.optimizers:
        yield ctx.skip("No torch.optim optimizer step was observed.")
        return
    info = (r.extras or {}).get("optimizers") or {}
    if not info:
        yield ctx.skip(f"Optimizer implementations were not recorded: {PERF_MISSING}.")
        return
    recs = [(o, info.get(str(o.id))) for o in r.optimizers if info.get(str(o.id))]
    cuda = [(o, i) for o, i in recs if i.get("device") == "cuda"]
    if not cuda:
        devs = sorted({i.get("device") or "?" for _, i in recs}) or ["?"]
        yield ctx.skip(f"The optimizer's parameters are on {', '.join(devs)}: this check is "
                                  "about CUDA optimizer kernels.", devices=devs)
        return
    ph = r.median_step()
    share = ph["optimizer_s"] / ph["total_s"] if ph and ph["total_s"] > 0 else None
    o, i = max(cuda, key=lambda x: x[0].steps)
    fw = framework_of(ev)
    numbers = {"framework": fw, "knob": "optim.fused",
               "optimizer": o.cls, "foreach": i.get("foreach"), "fused": i.get("fused"),
               "effective_foreach": i.get("effective_foreach"), "effective_fused": i.get("effective_fused"),
               "supports_foreach": i.get("supports_foreach"), "supports_fused": i.get("supports_fused"),
               "params": i.get("params"), "optimizer_share": round(share, 4) if share is not None else None,
               "optimizer_s": round(ph["optimizer_s"], 6) if ph else None}
    if i.get("effective_fused"):
        yield ctx.passed(f"{o.cls} runs with fused=True.", **numbers, title="Fused optimizer")
        return
    if i.get("effective_foreach"):
        if i.get("supports_fused") and share is not None and share >= FUSED_HINT_SHARE:
            yield ctx.finding(
                severity=Severity.INFO, title="Optimizer could use fused kernels",
                message=f"{o.cls} uses the foreach implementation and its step takes {pct(share)} of the step "
                        f"time; fused=True runs the whole update in one kernel per parameter group.",
                evidence=numbers, **_fused_words(fw, o.cls, "fused=True"))
            return
        yield ctx.passed(f"{o.cls} uses the foreach (multi-tensor) implementation.",
                     **numbers, title="Multi-tensor optimizer")
        return
    if not i.get("supports_foreach") and not i.get("supports_fused"):
        yield ctx.passed(f"{o.cls} has no foreach or fused implementation.",
                     **numbers, title="No faster implementation")
        return
    sev = Severity.WARNING if share is None or share >= OPTIM_WARN_SHARE else Severity.INFO
    better = "fused=True" if i.get("supports_fused") else "foreach=True"
    yield ctx.finding(
        severity=sev,
        message=f"{o.cls} updates its {i.get('params')} CUDA parameters one by one (for-loop implementation, "
                f"foreach={i.get('foreach')})"
                + (f"; optimizer.step() takes {pct(share)} of the step" if share is not None else "") + ".",
        evidence=numbers,
        why="The for-loop implementation launches several small kernels per parameter; foreach batches "
            "them over all parameters and fused does the whole update in one kernel.",
        **_fused_words(fw, o.cls, better, foreach_note=True),
    )


def _fused_words(fw, cls, better, foreach_note=False) -> dict:
    """fix and snippet of optim.fused (diag/knobs.py) in ``fw``'s words. The Trainer's optim string
    names a fused kernel for AdamW only: another class under the Trainer was built by the user (or by
    an optim string with no fused variant), so the plain words apply, said so."""
    if fw == "transformers" and cls != "AdamW":
        fix, snippet, _ = knob_words("optim.fused", None, cls=cls, better=better)
        fix = (f"TrainingArguments(optim=...) has a fused variant for AdamW only (\"adamw_torch_fused\"): "
               f"construct the {cls} you pass in Trainer(optimizers=(opt, scheduler)) with {better}.")
        snippet = (f"opt = torch.optim.{cls}(model.parameters(), lr=..., {better})\n"
                   "trainer = Trainer(..., optimizers=(opt, None))")
    else:
        fix, snippet, _ = knob_words("optim.fused", fw, cls=cls, better=better)
    if foreach_note and fw != "transformers":
        fix += " (Or leave foreach unset: PyTorch picks foreach on CUDA.)"
    return {"fix": fix, "snippet": snippet}


@check(id="debug.anomaly-detection", title="Debugging tools left on", severity="warning",
       needs=["ranks.extras.debug", "environment.anomaly_detection"], tags=["debug", "tuning"],
       docs=guide("disable-debugging-apis"))
def debug_anomaly_detection(ctx):
    """Autograd anomaly detection (`torch.autograd.set_detect_anomaly(True)` / `detect_anomaly()`)
    on during training steps (warning: it records a traceback for every forward op and checks every
    backward for NaN), or a profiler (torch.profiler / torch.autograd.profiler) on for >= 20% of the
    steps (warning; a shorter profiling window is info). Counted per step: every step once either was
    seen on (switched on through torch's API, or found on), at steps 1, 9, 17, ... until then;
    torch.compile's own `detect_anomaly(check_nan=False)` while it compiles (AOTAutograd's tracing) is
    not the script's."""
    ev = ctx.evidence
    r = ev.primary
    dbg = (r.extras or {}).get("debug") or {}
    steps = int(dbg.get("steps", 0) or 0)
    anomaly_steps = int(dbg.get("anomaly_steps", 0) or 0)
    prof_steps = int(dbg.get("profiler_steps", 0) or 0)
    env_anomaly = bool(ev.environment.anomaly_detection)
    if not dbg and not env_anomaly:
        if ev.environment.anomaly_detection is None:
            yield ctx.skip(f"Debug state was not recorded: {PERF_MISSING}.")
            return
        if not perf_ran(r):
            yield ctx.skip(f"Anomaly detection was off at the samples taken, but per-step state "
                                      f"and profilers were not recorded: {PERF_MISSING}.")
            return
    found = False
    if anomaly_steps or env_anomaly:
        found = True
        where = dbg.get("anomaly_location")
        spoken = knob(framework_of(ev), "detect_anomaly")
        yield ctx.finding(
            severity=Severity.WARNING, title="Autograd anomaly detection left on",
            message=(f"Autograd anomaly detection was on for {anomaly_steps} of {steps} training steps"
                     if steps else "Autograd anomaly detection was on during the run")
                    + (f" (switched on at {short_file(where)})" if where else "")
                    + ": every forward op records a Python traceback and every backward checks for NaN.",
            evidence={"anomaly_steps": anomaly_steps, "steps": steps, "env_anomaly_detection": env_anomaly},
            why="Anomaly detection is a debugging aid: it slows every step (often several-fold on small "
                "ops) and keeps extra metadata per op.",
            fix=spoken[0] if spoken else
                "Remove the call, or enable it only while chasing a NaN (e.g. behind a --debug flag).",
            snippet=spoken[1] if spoken else "torch.autograd.set_detect_anomaly(args.debug)   # off for real training",
            location=loc(where or (framework_entry(ev) if spoken else None)),
        )
    if prof_steps:
        found = True
        share = prof_steps / steps if steps else 1.0
        where = dbg.get("profiler_location")
        sev = Severity.WARNING if share >= PROFILER_WARN_SHARE else Severity.INFO
        yield ctx.finding(
            severity=sev, title="Profiler on during training",
            message=f"A profiler was recording during {prof_steps} of {steps} training steps ({pct(share)})"
                    + (f" (created at {short_file(where)})" if where else "") + ".",
            evidence={"profiler_steps": prof_steps, "steps": steps, "share": round(share, 4)},
            why="Profilers add per-op overhead and memory; they belong around a short window of steps, "
                "not the whole run.",
            fix="Profile a few steps with a schedule (wait/warmup/active) and leave it off otherwise.",
            snippet=("with torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=1, active=3,\n"
                     "                                  repeat=1)) as prof:\n"
                     "    for step, batch in enumerate(loader):\n        train_step(batch)\n        prof.step()"),
            location=loc(where),
        )
    if not found:
        yield ctx.passed(f"Anomaly detection and profilers were off over {steps} step(s).",
                     steps=steps, title="No debugging tools on")


@check(id="compile.unused", title="torch.compile not used", severity="info",
       needs=["ranks.models.wrappers", "ranks.extras.compile", "ranks.steps"], tags=["tuning", "compile"],
       docs=COMPILE_DOCS)
def compile_unused(ctx):
    """An info suggestion: the model is not compiled. States the condition under which torch.compile
    pays off: forward+backward dominate the step (not the data pipeline: >= 30% data wait says fix
    that first), and the run is long enough to repay a one-off compilation (assumed 60 s; break-even
    steps = 60 s / (step x forward+backward share x (1 - 1/1.43)), 1.43x being the mean training
    speed-up PyTorch 2.0 measured on A100 over 163 models). The saving is taken on the fastest quarter of
    the steps' forward+backward (stable under a loaded machine's stalls), the break-even rounded to two
    figures. Passes when the run ended by itself in fewer steps than the break-even (compilation would
    not pay off in this run). When the script has its own compile flag (``--compile``), the fix names
    it, located at its ``add_argument`` line."""
    ev = ctx.evidence
    r = ev.primary
    comp = (r.extras or {}).get("compile") or {}
    compiled = [m for m in r.models if "compiled" in (m.wrappers or [])]
    if compiled or comp.get("calls") or comp.get("models"):
        yield ctx.passed(f"torch.compile was called {comp.get('calls', 0)} time(s); {len(compiled) or len(comp.get('models', []))} "
                     "compiled model(s) seen.", calls=comp.get("calls", 0), title="torch.compile in use")
        return
    ph = phase_medians(r)
    if not ph:
        yield ctx.skip("No training step was observed.")
        return
    share = ph["compute_share"]
    host = r.data_wait_share()    # the one data-wait share (the same number dataloader.workers reports)
    data_share = host["share"] if host else ph["data_s"] / ph["total_s"]
    dw = data_wait(r)   # CUDA runs with a device timeline: data wait as GPU idle (hidden waits do not count)
    if dw.clock == "device" and dw.share is not None:
        data_share = dw.share
    # stable under load: the forward+backward time of the fastest quarter of the steps (what the machine
    # gives when nothing else runs), not the median of a loaded machine's stalls; break-even to 2
    # significant figures
    fb = sorted(s.forward_s + s.backward_s for s in r.timed_steps() if s.total_s > 0)
    fb_fast = fb[max((len(fb) + 3) // 4 - 1, 0)] if fb else ph["total_s"] * share
    gain_s = fb_fast * (1 - 1 / COMPILE_SPEEDUP)
    breakeven = _two_figures(int(COMPILE_COST_S / gain_s) + 1) if gain_s > 0 else None
    steps_seen = r.step_stats.count
    # the run's own length: all of it when it ended by itself; at least what was seen when diag stopped it
    whole = ev.run.status == "completed" and not ev.run.stop_reason
    numbers = {"step_s": round(ph["total_s"], 6), "forward_backward_share": round(share, 4),
               "forward_backward_fast_s": round(fb_fast, 7),
               "data_share": round(data_share, 4), "expected_saving_per_step_s": round(gain_s, 7),
               "break_even_steps": breakeven, "assumed_compile_s": COMPILE_COST_S,
               "assumed_speedup": COMPILE_SPEEDUP, "clock": dw.clock, "run_steps": steps_seen,
               "run_length_known": whole}
    facts = getattr(ev.run, "script_facts", None)
    fl = flag(facts, "compile")
    if fl:
        numbers["script_flag"] = fl["flag"]
    if breakeven is not None and whole and breakeven > steps_seen:
        yield ctx.passed(f"The model is not compiled, and need not be for this run: compilation (~{COMPILE_COST_S:.0f} s "
                         f"assumed) would be repaid after ~{breakeven:,} steps, and the run took {steps_seen:,}.",
                         title="torch.compile would not pay off in this run", **numbers)
        return
    if data_share >= DATA_BOUND_SHARE:
        cond = (f"not yet: the step waits for data {pct(data_share)} of the time, and compile only speeds up "
                "forward/backward; fix the data pipeline first")
    else:
        cond = (f"forward+backward take {pct(share)} of the {ms(ph['total_s'])} step; at the 1.43x mean speed-up "
                f"that saves about {ms(gain_s)} per step, repaying ~{COMPILE_COST_S:.0f} s of compilation after "
                f"~{breakeven:,} steps"
                + (f" (this run was stopped after {steps_seen:,}: worth it only if the whole run is longer)"
                   if not whole else "")
                + " (basis: PyTorch 2.0's mean training speed-up over 163 models on an A100, "
                "an average, not a bound for this model: measure it)"
                if breakeven else "the step has no forward/backward time to speed up")
    fw = framework_of(ev)
    fix, snippet, _ = knob_words("compile", fw)
    numbers.update(framework=fw, knob="compile")
    if fl:
        fix = (f"This script has its own flag for it: run it with {fl['flag']}"
               + ("" if fl.get("store_true") else " (its value turning compilation on)")
               + f" (defined at line {fl['line']}).")
        snippet = None
    yield ctx.finding(
        severity=Severity.INFO,
        message=f"The model is not compiled. torch.compile pays off when forward+backward dominate the step "
                f"and the run is long enough to repay compilation: here, {cond}.",
        evidence=numbers,
        why="torch.compile fuses element-wise ops and cuts Python and kernel-launch overhead; compilation "
            "itself takes from seconds to minutes and recompiles on new input shapes.",
        fix=fix, snippet=snippet,
        location=loc({"file": facts["file"], "line": fl["line"]}) if fl else None,
    )


def _two_figures(n: int) -> int:
    """17,903 -> 18,000: a break-even is an estimate; its last digits are noise."""
    if n < 100:
        return n
    mag = 10 ** (len(str(n)) - 2)
    return int(round(n / mag) * mag)
