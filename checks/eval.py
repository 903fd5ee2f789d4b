"""Evaluation checks."""
from __future__ import annotations

from diag.checks.api import check, cuda_device, fmt_seconds, knob_words, median, peak_flops, Severity

from ._perf import amdahl, cap_str, capability, guide, short_file, size
from ._framework import framework_of
from ._util import pct
from ._util import constructed_at, loc


def _graph_record(r, site_key: str) -> dict:
    """What the perf probe measured for this site (extras.eval_graph), or the memory section's
    per-site bytes (memory.eval_graph_bytes) when only that exists."""
    rec = ((r.extras or {}).get("eval_graph") or {}).get(site_key)
    if isinstance(rec, dict):
        return rec
    mem = (r.memory.get("eval_graph_bytes") or {}).get(site_key) if isinstance(r.memory, dict) else None
    return {"bytes": mem} if mem else {}


@check(id="eval.no-grad", title="Evaluation without no_grad", severity="warning",
       needs=["ranks.forwards", "ranks.models", "ranks.extras.eval_graph"], tags=["eval", "memory"],
       docs=guide("disable-gradient-calculation-for-validation-or-inference"))
def eval_no_grad(ctx):
    """Model forwards in eval mode (`model.eval()`) with grad enabled whose output requires grad:
    each one builds an autograd graph through trainable parameters and keeps its activations
    alive, for nothing. Reports the activation bytes the graph retained per forward (measured by
    walking the graph of the first forwards at each call site: saved tensors, parameters and inputs
    excluded) and a one-line fix for the calling line. Forwards under `torch.no_grad()`,
    `torch.inference_mode()`, `@torch.no_grad()`, or through frozen modules (output needs no grad)
    are not flagged."""
    ev = ctx.evidence
    r = ev.primary
    evals = [s for s in r.forwards if not s.training]
    if not r.forwards:
        yield ctx.skip("No model forward was observed.")
        return
    bad = [s for s in evals if s.grad_enabled and not s.inference_mode and s.output_requires_grad
           and not s.backpropagated]   # trained in eval mode (frozen BatchNorm): not an evaluation
    if not bad:
        if evals:
            n = sum(s.count for s in evals)
            yield ctx.passed(f"{n} eval-mode forward(s) ran without building an autograd graph.", forwards=n, title="Evaluation runs without building graphs")
        else:
            yield ctx.passed("No eval-mode forward was observed, so none built a graph needlessly.", title="No evaluation forwards")
        return
    # one finding per call site: a model reloaded each pass (torch.load) is a new model object with
    # its own site record at the same line
    by_line: dict = {}
    for s in bad:
        key = (s.location or {}).get("file"), (s.location or {}).get("line")
        by_line.setdefault(key if key != (None, None) else s.key, []).append(s)
    for group in sorted(by_line.values(), key=lambda g: -sum(s.count for s in g)):
        site = max(group, key=lambda s: (_graph_record(r, s.key).get("bytes") or 0, s.count))
        count = sum(s.count for s in group)
        model = r.model(site.model)
        trainable = model.params_trainable if model else None
        where = f" at {short_file(site.location)}" if site.location else ""
        rec = _graph_record(r, site.key)
        mem = rec.get("bytes")
        code = rec.get("code")
        mode = "train" if site.training else "eval"
        msg = (f"{count} forward(s) of {site.module}{where} ran in {mode} mode with gradients enabled, "
               f"building an autograd graph through {trainable:,} trainable parameters"
               if trainable is not None else
               f"{count} forward(s) of {site.module}{where} ran in {mode} mode with gradients enabled")
        ratio = None
        if mem:
            msg += f" and keeping {size(mem)} of activations alive per forward"
            if model and model.param_bytes:
                ratio = mem / model.param_bytes
                msg += f" ({ratio:.1f}x the model's weights)" if ratio >= 0.1 else ""
        if code:
            fix = (f"{short_file(site.location)}: run `{code}` under torch.inference_mode() "
                   "(or torch.no_grad()); better, wrap the whole evaluation loop or decorate the "
                   "evaluation function with @torch.inference_mode().")
            snippet = f"with torch.inference_mode():\n    {code}"
        else:
            fix = "Wrap the evaluation loop in torch.inference_mode() (or torch.no_grad())."
            snippet = ("model.eval()\nwith torch.inference_mode():\n    for batch in val_loader:\n"
                       "        out = model(batch)")
        yield ctx.finding(
            severity=Severity.WARNING,
            message=msg + ".",
            evidence={"forwards": count, "model_objects": len(group), "module": site.module, "trainable_params": trainable,
                      "graph_bytes_per_forward": mem, "graph_nodes": rec.get("nodes"),
                      "graph_to_weights_ratio": round(ratio, 3) if ratio is not None else None,
                      "graph_measured_forwards": rec.get("measured"), "site": site.key, "code": code},
            why="Without no_grad every evaluation forward records the autograd graph and keeps "
                "activations for a backward that never comes: slower evaluation and more memory "
                "(a common cause of OOM during validation).",
            fix=fix, snippet=snippet, location=loc(site.location),
        )


# ---------------------------------------------------------------------------------------------------
# evaluation runs (docs/steps.md section 5: evaluation steps; README "Evaluation runs")

AMP_MAX_SPEEDUP = 3.0        # the tuning guide's "up to 3x" for tensor-core matmuls
FORWARD_WARN_SHARE = 0.30    # forwards under 30% of an evaluation step: bound elsewhere first (info)
SMALL_EVAL_BATCH = 8         # an evaluation batch of at most 8 samples
SMALL_MIN_STEPS = 16         # judged over at least this many evaluation batches
SMALL_EVAL_TOKENS = 2048     # ...unless each batch holds this many tokens (8 sequences of 256 and more)
FIXED_COST_SHARE = 0.5       # on a CPU: a measured per-batch fixed cost of at least half a batch's time
SYNC_STEP_SHARE = 0.5        # host syncs in at least half the evaluation steps: per batch
SYNC_MIN_STEPS = 4
TRAIN_MODE_LAYERS = ("Dropout", "BatchNorm", "AlphaDropout", "FeatureAlphaDropout", "SyncBatchNorm")


def _group_facts(r, group) -> tuple:
    """(first site, forwards, its model or None, the model's train-mode layers) of sites on one line."""
    site = group[0]
    model = r.model(site.model)
    return site, sum(s.count for s in group), model, _train_mode_layers((model.module_types if model else {}) or {})


def _train_mode_layers(types: dict) -> dict:
    """The model's layers that act differently in train mode (dropout, batch norm: their names hold it)."""
    return {k: v for k, v in types.items() if any(k.endswith(t) or k.startswith(t) for t in TRAIN_MODE_LAYERS)
            or "Dropout" in k or "BatchNorm" in k}


def eval_sites(r) -> list:
    """The forward sites that evaluated: the sites of the evaluation steps, or (older evidence, an
    evaluation run) every forward site that did not train. Most-called first."""
    keys = {s.site for s in r.eval_steps if s.site}
    sites = [s for s in r.forwards if s.key in keys and s.count > 0]
    if not sites:
        sites = r.eval_forward_sites() if (r.evaluations or r.eval_stats.count or r.run_kind() == "evaluation") else []
    return sorted(sites, key=lambda s: -s.count)


def _by_line(sites) -> list[list]:
    groups: dict = {}
    for s in sites:
        key = (s.location or {}).get("file"), (s.location or {}).get("line")
        groups.setdefault(key if key != (None, None) else s.key, []).append(s)
    return sorted(groups.values(), key=lambda g: -sum(s.count for s in g))


def _where(site) -> str:
    return f" at {short_file(site.location)}" if site.location else ""


# frameworks whose own evaluation loop chooses no_grad (what the user sees, and why it is not theirs to change)
_FRAMEWORK_NO_GRAD = {
    "lightning": "Lightning's Trainer runs the validation inside fit() under no_grad on purpose (its "
                 "fit loop passes inference_mode=False: inference tensors could not enter training "
                 "afterwards); trainer.validate() and test() use inference_mode already "
                 "(Trainer(inference_mode=True), the default).",
    "transformers": "the Hugging Face Trainer's prediction_step() wraps every evaluation forward in "
                    "torch.no_grad(), and TrainingArguments has no switch for inference_mode.",
}


@check(id="eval.inference-mode", title="Evaluation under no_grad where inference_mode would do", severity="info",
       needs=["ranks.forwards", "ranks.eval_steps"], tags=["eval"],
       docs="https://pytorch.org/docs/stable/generated/torch.autograd.grad_mode.inference_mode.html")
def eval_inference_mode(ctx):
    """Evaluation forwards (the forwards of evaluation steps: between training steps, or in an
    evaluation-only run) that ran under `torch.no_grad()` rather than `torch.inference_mode()`.
    inference_mode also skips the version counters and view tracking that no_grad keeps, so it is a
    little faster for the same results; its tensors cannot enter autograd later, which evaluation
    never needs. Info, once per call site. Forwards inside a training step (a teacher under no_grad
    whose output meets the student's graph) are not judged. The saving is not measured: one run runs
    each forward one way only. Under Lightning's fit() and the Hugging Face Trainer the no_grad is the
    framework's own choice, with no switch to change it: passed, with that said."""
    r = ctx.evidence.primary
    sites = eval_sites(r)
    if not sites:
        yield ctx.skip("No evaluation forward was observed.")
        return
    ng = [s for s in sites if not s.grad_enabled and not s.inference_mode and not s.training]
    graphs = [s for s in sites if s.grad_enabled and not s.inference_mode]
    if not ng and graphs:
        # no pass beside eval.no-grad's warning: these forwards ran with grad on, not under inference_mode
        n = sum(s.count for s in graphs)
        yield ctx.skip(f"{n} of {sum(s.count for s in sites)} evaluation forward(s) ran with gradients enabled "
                       "(eval.no-grad and eval.train-mode judge them): neither no_grad nor inference_mode to compare.",
                       title="Evaluation with gradients enabled")
        return
    if not ng:
        im = sum(s.count for s in sites if s.inference_mode)
        yield ctx.passed(f"{im} of {sum(s.count for s in sites)} evaluation forward(s) ran under inference_mode; "
                         "none under plain no_grad.", title="Evaluation under inference_mode")
        return
    fw = framework_of(ctx.evidence)
    if fw in _FRAMEWORK_NO_GRAD:
        # the framework opened that no_grad, on purpose, and offers no switch for it: advice to
        # change the script would be wrong
        count = sum(s.count for s in ng)
        yield ctx.passed(f"{count} evaluation forward(s) ran under torch.no_grad(): {_FRAMEWORK_NO_GRAD[fw]} "
                         "Nothing to change in the script.", title="Evaluation under the framework's no_grad",
                         framework=fw, forwards=count)
        return
    tp = r.eval_throughput()
    for group in _by_line(ng):
        site = group[0]
        count = sum(s.count for s in group)
        yield ctx.finding(
            severity=Severity.INFO,
            message=f"{count} evaluation forward(s) of {site.module}{_where(site)} ran under torch.no_grad(); "
                    "torch.inference_mode() gives the same results with less bookkeeping per tensor"
                    + (f" (forwards take {pct(tp['forward_share'])} of the evaluation)" if tp else "")
                    + "; the saving is not measured (one run runs each forward one way).",
            evidence={"forwards": count, "module": site.module, "site": site.key,
                      "forward_share": round(tp["forward_share"], 4) if tp else None},
            why="no_grad stops graph building but still keeps version counters and view metadata on every "
                "tensor; inference_mode drops them too. Evaluation never needs its outputs in autograd.",
            fix=f"{short_file(site.location) or 'The evaluation loop'}: use torch.inference_mode() instead of "
                "torch.no_grad() (as a context manager or as the evaluation function's decorator).",
            snippet="model.eval()\nwith torch.inference_mode():\n    for x, y in val_loader:\n        out = model(x)",
            location=loc(site.location),
        )


@check(id="eval.train-mode", title="Evaluation in train mode", severity="warning",
       needs=["ranks.forwards", "ranks.models", "ranks.eval_steps"], tags=["eval"],
       docs="https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.eval")
def eval_train_mode(ctx):
    """Evaluation forwards made with the model in training mode (`model.eval()` not called, or
    `model.train()` called before evaluating): dropout drops activations at random and batch-norm
    normalises with the batch's statistics and updates its running averages, so the evaluation's
    numbers are wrong (and noisy) and evaluating changes the model. A warning with the call site when the
    model has such layers; an info when it has none (nothing changes today, but a layer added later would).
    Forwards whose output fed a backward are training, not evaluation."""
    ev = ctx.evidence
    r = ev.primary
    sites = eval_sites(r)
    if not sites:
        yield ctx.skip("No evaluation forward was observed.")
        return
    bad = [s for s in sites if s.training and not s.backpropagated]
    if not bad:
        yield ctx.passed(f"{sum(s.count for s in sites)} evaluation forward(s) ran with the model in eval mode.",
                         title="Evaluation in eval mode")
        return
    for group in _by_line(bad):
        site, count, model, layers = _group_facts(r, group)
        sev = Severity.WARNING if layers or model is None else Severity.INFO
        named = ", ".join(f"{n} x{c}" for n, c in sorted(layers.items())) if layers else ""
        msg = (f"{count} evaluation forward(s) of {site.module}{_where(site)} ran with the model in training mode"
               + (f": its {named} behave as in training ("
                  + "; ".join(x for x in (
                      "dropout drops activations at random" if any("Dropout" in k for k in layers) else "",
                      "batch-norm normalises with the batch's statistics and updates its running averages"
                      if any("BatchNorm" in k for k in layers) else "") if x)
                  + "), so the evaluation's numbers are wrong"
                  if layers else
                  (": no dropout or batch-norm layer was found, so the numbers are right today, but a layer added "
                   "later would change them" if model is not None else "")) + ".")
        if site.grad_enabled and not site.inference_mode:
            msg += (" They also ran with gradients enabled (no torch.no_grad()/inference_mode()): every one built "
                    "an autograd graph for a backward that never came.")
        yield ctx.finding(
            severity=sev, message=msg,
            evidence={"forwards": count, "module": site.module, "site": site.key, "layers": layers,
                      "grad_enabled": site.grad_enabled},
            why="Module.training switches dropout and batch-norm between their training and inference "
                "behaviour; no_grad and inference_mode do not change it.",
            fix=f"Call model.eval() before the evaluation loop{_where(site)}"
                + (" and model.train() after it, before training resumes." if r.step_stats.count else "."),
            snippet="model.eval()\nwith torch.inference_mode():\n    for x, y in val_loader:\n        out = model(x)"
                    + ("\nmodel.train()" if r.step_stats.count else ""),
            location=loc(site.location),
        )


@check(id="eval.small-batch", title="Small evaluation batches", severity="warning",
       needs=["ranks.eval_steps", "ranks.forwards", "memory_plan"], tags=["eval", "throughput"],
       docs=guide("disable-gradient-calculation-for-validation-or-inference"))
def eval_small_batch(ctx):
    """Evaluation runs many batches of at most 8 samples: every forward pays the per-call cost
    (Python, operator dispatch, kernel launches) for a handful of samples, and evaluation keeps no
    activations for a backward, so memory rarely limits its batch. Judged over at least 16 evaluation
    steps; batches of token sequences holding 2,048 tokens or more (a language model's few long
    sequences) pass; the measured samples/s and per-batch time are in the message. When the memory plan
    estimated the largest evaluation batch and it is under 2x the observed one, passes (no memory to
    spare); memory.eval-batch reports the estimated largest batch. On a CPU a forward's cost grows with
    its batch (batch 8 and 64 measured the same samples/s), so a CPU evaluation is judged on a measured
    per-batch fixed cost only: from batches of two sizes (a last partial batch), t(b) = fixed + b x
    per-sample; a warning when the fixed cost is at least half a batch's time, else (or unmeasured) a
    pass. Located at the evaluation DataLoader(...) call where the batch size is set."""
    ev = ctx.evidence
    r = ev.primary
    tp = r.eval_throughput()
    if tp is None:
        yield ctx.skip("No evaluation step was observed.")
        return
    batches = [s.samples for s in r.eval_steps if s.samples]
    if not batches:
        yield ctx.skip("The evaluation steps' batch size is unknown (no tensor input with a batch dimension).")
        return
    batch = int(median(batches))
    verdict = ev.memory_plan.get("verdict") if isinstance(ev.memory_plan, dict) else None
    max_eval = (verdict or {}).get("max_eval_batch")
    numbers = {"eval_batch": batch, "eval_steps": tp["steps"], "samples_per_s": tp["samples_per_s"],
               "median_step_s": tp["median_step_s"], "max_eval_batch": max_eval}
    if batch > SMALL_EVAL_BATCH:
        yield ctx.passed(f"Evaluation runs at batch {batch}.", **numbers, title="Evaluation batches are not small")
        return
    if tp["steps"] < SMALL_MIN_STEPS:
        yield ctx.passed(f"Evaluation ran {tp['steps']} batch(es) of {batch}: too few to matter.", **numbers)
        return
    tokens = [s.tokens for s in r.eval_steps if s.tokens]
    per_batch = int(median(tokens)) if tokens else 0
    if per_batch >= SMALL_EVAL_TOKENS:
        # a few long sequences (a language model's evaluation): each forward already has thousands of rows
        numbers["eval_tokens"] = per_batch
        yield ctx.passed(f"Evaluation runs at batch {batch} of {per_batch:,} tokens: each forward "
                         "already works on thousands of tokens.", **numbers,
                         title="Evaluation batches are not small")
        return
    if max_eval is not None and max_eval < 2 * batch:
        yield ctx.passed(f"Evaluation runs at batch {batch}; the memory plan says at most {max_eval} fits.", **numbers)
        return
    esites = eval_sites(r)
    on_cuda = any(str(d).startswith("cuda") for s in esites for m in [r.model(s.model)] if m for d in m.devices)
    fixed = _fixed_cost(r)
    numbers.update(cuda=on_cuda, **(fixed or {}))
    if not on_cuda:
        # on a CPU a forward's cost grows with its batch (measured: batch 8 and 64 gave the same
        # evaluation throughput, 1,389 vs 1,391 samples/s): a larger batch helps only where a per-batch
        # fixed cost was measured to dominate
        if fixed is None:
            yield ctx.passed(f"Evaluation runs at batch {batch} on the CPU, where a forward's cost grows with its "
                             "batch; the per-batch fixed cost was not measured (every evaluation batch had the same "
                             "size), so a larger batch is not predicted to help.", **numbers,
                             title="Small evaluation batches on the CPU")
            return
        if fixed["fixed_share"] < FIXED_COST_SHARE:
            yield ctx.passed(f"Evaluation runs at batch {batch} on the CPU; the measured per-batch fixed cost is "
                             f"{fmt_seconds(fixed['fixed_cost_s'])} ({pct(fixed['fixed_share'])} of a batch), so a "
                             "larger batch would gain little.", **numbers, title="Small evaluation batches on the CPU")
            return
    site = next(iter(esites), None)
    loaders = r.eval_loaders()
    where = loaders[0].location if loaders and loaders[0].location else (site.location if site else None)
    built = constructed_at(getattr(ev.run, "script_facts", None), loaders[0].location) if loaders else None
    where = {"file": built["file"], "line": built["line"]} if built else where   # where the batch size is set
    graphs = any(s.grad_enabled and not s.inference_mode and s.output_requires_grad for s in esites)
    sps = tp["samples_per_s"]
    target = 64 if max_eval is None else max(2 * batch, min(1 << (int(max_eval).bit_length() - 1), 1024))
    fw = framework_of(ev)
    numbers.update(framework=fw)
    if loaders or fw in ("transformers", "lightning"):
        # the knob's words (diag/knobs.py); a Trainer builds the evaluation loader itself, Lightning
        # iterates the one val_dataloader() returns
        fix, snippet, _ = knob_words("eval.batch", fw, n=target)
        numbers.update(knob="eval.batch")
    else:
        fix, snippet = (f"Build the evaluation batches with {target} samples where the evaluation loop makes "
                        "them (the batches are not from a DataLoader here; a get_batch-style helper can take the "
                        "batch size as an argument), or the largest that fits: `diag memory`.", None)
    yield ctx.finding(
        severity=Severity.WARNING,
        message=f"Evaluation ran {tp['steps']} batches of {batch} sample(s)"
                + (f" at {sps:,.0f} samples/s" if sps else "")
                + f" ({fmt_seconds(tp['median_step_s'])} per batch): each forward pays its fixed per-call cost "
                  f"for {batch} sample(s)"
                + (f" (measured: {fmt_seconds(fixed['fixed_cost_s'])}, {pct(fixed['fixed_share'])} of a batch)"
                   if fixed else "")
                + (f", and up to {max_eval:,} fit (memory plan)." if max_eval else
                   ", and under no_grad (see eval.no-grad: these forwards build graphs today) an evaluation forward "
                   "keeps no activations for a backward, so a much larger batch fits." if graphs else
                   ", and an evaluation forward keeps no activations for a backward, so a much larger batch fits."),
        evidence=numbers,
        why="Per-forward overhead (Python, dispatch, kernel launches; on a GPU, a nearly idle device) is paid per "
            "batch: larger evaluation batches spread it over more samples.",
        fix=fix,
        snippet=snippet,
        location=loc(where),
    )


def _fixed_cost(r) -> dict | None:
    """The per-batch fixed cost measured from evaluation batches of two sizes (a last, partial batch
    is the usual second size): t(b) = fixed + b x per_sample, from the median time at each size.
    {fixed_cost_s, per_sample_s, fixed_share (of the common batch's time), sizes} or None."""
    by: dict = {}
    steps = [s for s in r.eval_steps if not s.instrumented and s.samples and s.total_s > 0]
    for s in steps[1:] if len(steps) > 3 else steps:
        by.setdefault(int(s.samples), []).append(s.total_s - s.data_s)
    if len(by) < 2:
        return None
    common = max(by, key=lambda b: len(by[b]))
    other = max((b for b in by if b != common), key=lambda b: abs(b - common))
    t1, t2 = median(by[common]), median(by[other])
    per = (t1 - t2) / (common - other)
    if per <= 0:
        return None          # noise: a bigger batch no slower than a smaller one says nothing
    fixed = max(t1 - per * common, 0.0)
    return {"fixed_cost_s": round(fixed, 7), "per_sample_s": round(per, 8),
            "fixed_share": round(fixed / t1, 4) if t1 > 0 else None, "sizes": [common, other]}


@check(id="eval.host-sync", title="Host syncs on every evaluation batch", severity="warning",
       needs=["ranks.eval_steps", "ranks.eval_stats", "ranks.models"], tags=["eval", "sync"],
       docs=guide("avoid-unnecessary-cpu-gpu-synchronization"))
def eval_host_sync(ctx):
    """`.item()`, `.tolist()`, `.cpu()` or `.numpy()` called outside the forward in at least half of
    the evaluation steps (per batch), located at the user's line. On a GPU each one waits for the
    device to finish the batch before the host may queue the next: the GPU idles once per batch
    (warning). On a CPU-only run the call costs little, but the same loop on a GPU pays it (info).
    Fix: accumulate metrics on the device and convert once after the loop."""
    ev = ctx.evidence
    r = ev.primary
    st = r.eval_stats
    if st.count < SYNC_MIN_STEPS:
        yield ctx.skip(f"Fewer than {SYNC_MIN_STEPS} evaluation steps were observed ({st.count}).")
        return
    share = st.steps_with_syncs / st.count
    numbers = {"eval_steps": st.count, "steps_with_syncs": st.steps_with_syncs, "host_syncs": st.host_syncs,
               "share": round(share, 4), "sites": st.sync_sites[:5]}
    if share < SYNC_STEP_SHARE:
        yield ctx.passed(f"{st.steps_with_syncs} of {st.count} evaluation step(s) called .item()/.cpu() "
                         "outside the forward.", **numbers, title="No per-batch host syncs in evaluation")
        return
    site = max(st.sync_sites, key=lambda s: s.get("calls", 0)) if st.sync_sites else None
    sites = eval_sites(r)
    on_cuda = any(str(d).startswith("cuda") for s in sites for m in [r.model(s.model)] if m for d in m.devices)
    op = f".{site['op']}()" if site else ".item()"
    where = f" at {short_file(site)}" if site else ""
    yield ctx.finding(
        severity=Severity.WARNING if on_cuda else Severity.INFO,
        message=f"{st.steps_with_syncs} of {st.count} evaluation steps called {op}{where} "
                f"({st.host_syncs} host sync(s) in all): "
                + ("each one makes the host wait for the GPU to finish the batch before it can queue the next."
                   if on_cuda else
                   "on this CPU-only run that costs little, but on a GPU each one stalls the device once per batch."),
        evidence={**numbers, "cuda": on_cuda},
        why="A tensor's value on the host needs the device's work to be done: a per-batch .item() serialises "
            "the host and the GPU.",
        fix="Accumulate the metric in a tensor on the device and read it once after the loop.",
        snippet="total = torch.zeros((), device=device)\nfor x, y in val_loader:\n    total += loss_fn(model(x), y)\n"
                "loss = total.item() / len(val_loader.dataset)   # one sync",
        location=loc({"file": site["file"], "line": site["line"], "function": site.get("function")} if site else None),
    )


@check(id="eval.amp", title="Evaluation in fp32 on a GPU with tensor cores", severity="warning",
       needs=["ranks.forwards", "ranks.models", "environment.devices", "ranks.eval_steps"], tags=["eval", "amp", "gpu"],
       docs=guide("use-mixed-precision-and-amp"))
def eval_amp(ctx):
    """Evaluation forwards run in fp32 (no autocast, fp32 parameters) on a CUDA device whose tensor
    cores take bf16 (compute capability >= 8.0) or fp16 (>= 7.0). Evaluation needs no GradScaler:
    `torch.autocast("cuda", dtype=torch.bfloat16)` (fp16 before Ampere) around the loop is the whole
    change (TrainingArguments(bf16=True) or bf16_full_eval=True under the Hugging Face Trainer,
    Trainer(precision="bf16-mixed") under Lightning). The gain is an upper bound with its basis:
    Amdahl's law at the catalogue's bf16/fp32 peak ratio (the tuning guide's "up to 3x" for a GPU the
    catalogue lacks) over the share of the evaluation steps that is not data wait or host-to-device
    copies (host clock: the device's
    forward time surfaces where the host next waits for it). Warning when that share is >= 30%, info
    below. Skipped when evaluation runs on the CPU."""
    ev = ctx.evidence
    r = ev.primary
    sites = eval_sites(r)
    if not sites:
        yield ctx.skip("No evaluation forward was observed.")
        return
    models = [m for s in sites for m in [r.model(s.model)] if m is not None]
    dev = cuda_device(ev, models)
    if dev is None:
        kinds = sorted({str(d).split(":")[0] for m in models for d in m.devices}) or ["cpu"]
        yield ctx.skip(f"The evaluation runs on {', '.join(kinds)}: this check is about CUDA tensor cores "
                       "(see amp.availability for what this machine supports).")
        return
    cap = capability(dev)
    if cap is not None and cap < (7, 0):
        yield ctx.passed(f"{dev.name} (compute capability {cap_str(cap)}) has no tensor cores.",
                         capability=cap_str(cap), title="No tensor cores to use")
        return
    if any(s.autocast for s in sites) or any(set(m.dtypes) & {"float16", "bfloat16"} for m in models):
        dt = sorted({s.autocast for s in sites if s.autocast} | {d for m in models for d in m.dtypes
                                                                  if d in ("float16", "bfloat16")})
        yield ctx.passed(f"Evaluation runs in {', '.join(dt)}.", title="Evaluation in reduced precision")
        return
    bf16 = cap is None or cap >= (8, 0)
    dtype = "bfloat16" if bf16 else "float16"
    tp = r.eval_throughput()
    st = r.eval_stats
    # host clock: a CUDA forward returns when its kernels are queued, and the device's time surfaces
    # where the host next waits for it (a .item(), the next copy), so the share the device may be busy
    # is bounded by everything but the data wait and the copies
    share = ((st.forward_s + st.other_s) / st.total_s) if tp and st.total_s > 0 else None
    label = "bf16" if bf16 else "fp16"
    gpu_id, p32, _ = peak_flops(dev.name, "fp32")
    _, pto, _ = peak_flops(dev.name, label)
    if p32 and pto:
        ratio, ratio_basis = pto / p32, f"the catalogue's {label}/fp32 dense peak ratio on {gpu_id}"
    else:
        ratio, ratio_basis = AMP_MAX_SPEEDUP, "the tuning guide's \"up to 3x\" (the catalogue has no peaks for this GPU)"
    gain = amdahl(share, ratio) if share is not None else None
    site = sites[0]
    sev = Severity.WARNING if share is None or share >= FORWARD_WARN_SHARE else Severity.INFO
    fw = framework_of(ev)
    fix, snippet, _ = knob_words("eval.bf16", fw, dtype=dtype)
    if fw is None:
        fix = f"Run the evaluation loop under torch.autocast(\"cuda\", dtype=torch.{dtype}) inside inference_mode."
        snippet = (f"with torch.inference_mode(), torch.autocast(\"cuda\", dtype=torch.{dtype}):\n"
                   "    for x, y in val_loader:\n        out = model(x.cuda(non_blocking=True))")
    yield ctx.finding(
        severity=sev,
        message=f"Evaluation forwards{_where(site)} run in float32 on {dev.name} (compute capability "
                f"{cap_str(cap)}), whose tensor cores take {dtype}"
                + (f": forwards and what waits on them are {pct(share)} of the evaluation time (host clock), so "
                   f"evaluation could run at most {gain:.1f}x faster (an upper bound: all of that time sped up by "
                   f"{ratio:.1f}x, {ratio_basis}; how much of it is matmul work was not measured: measure it)."
                   if gain else "."),
        evidence={"device": dev.name, "capability": cap_str(cap), "recommended_dtype": dtype,
                  "forward_share": round(share, 4) if share is not None else None,
                  "max_speedup": round(gain, 3) if gain else None, "peak_ratio": round(ratio, 2),
                  "speedup_basis": ratio_basis, "site": site.key, "framework": fw, "knob": "eval.bf16"},
        why="Tensor cores run half-precision matrix multiplies several times faster than fp32; evaluation has "
            "no gradients to underflow, so it needs no GradScaler.",
        fix=fix, snippet=snippet, location=loc(site.location),
    )


@check(id="inference.after-training", title="Forwards after training in train mode or with gradients",
       severity="warning", needs=["ranks.forwards", "ranks.models", "ranks.steps", "ranks.eval_steps"],
       tags=["eval", "memory"], docs="https://pytorch.org/docs/stable/generated/torch.autograd.grad_mode.inference_mode.html")
def inference_after_training(ctx):
    """Model forwards first made after the last training step, outside any evaluation pass (text
    generation or a demo after training: the evidence records each call site with the step it first
    appeared at), that ran with the model in training mode (dropout still drops, batch-norm still
    updates its running statistics: the outputs are wrong and noisy) or with gradients enabled (each one
    builds an autograd graph no backward uses). A warning per call site, with its count; passes when
    such forwards ran in eval mode under no_grad/inference_mode, or when there were none. Skipped when
    diag stopped the run (its next step's forward is not "after training")."""
    ev = ctx.evidence
    r = ev.primary
    n = r.step_stats.count
    if n == 0:
        yield ctx.skip("No training step was observed.")
        return
    if ev.run.status != "completed" or ev.run.stop_reason:
        yield ctx.skip("The run did not end by itself: forwards after its last recorded step may be the next step's.")
        return
    eval_keys = {s.site for s in r.eval_steps if s.site}
    after = [s for s in r.forwards if s.count > 0 and (s.first_step or 0) > n and s.key not in eval_keys
             and not s.backpropagated]
    bad = [s for s in after if s.training or (s.grad_enabled and not s.inference_mode and s.output_requires_grad)]
    if not bad:
        yield ctx.passed(f"{sum(s.count for s in after)} forward(s) after the last training step, none in train mode "
                         "with gradients enabled." if after else "No forward after the last training step.",
                         forwards=sum(s.count for s in after), title="Nothing runs in training mode after training")
        return
    for group in _by_line(bad):
        site, count, model, layers = _group_facts(r, group)
        train = any(s.training for s in group)
        grad = any(s.grad_enabled and not s.inference_mode and s.output_requires_grad for s in group)
        parts = []
        if train:
            parts.append("with the model in training mode" + (
                f" (its {', '.join(f'{k} x{v}' for k, v in sorted(layers.items()))} behave as in training: the "
                "outputs are wrong and noisy)" if layers else ""))
        if grad:
            parts.append("with gradients enabled (each one built an autograd graph no backward used)")
        yield ctx.finding(
            severity=Severity.WARNING if (grad or layers) else Severity.INFO,
            message=f"{count} forward(s) of {site.module}{_where(site)} ran after the last of {n} training steps, "
                    "outside any evaluation pass, " + " and ".join(parts) + ".",
            evidence={"forwards": count, "module": site.module, "site": site.key, "after_step": n,
                      "training": train, "grad_enabled": grad, "layers": layers},
            why="Generation or inference after training is evaluation: model.train() mode keeps dropout and "
                "batch-norm updates on, and grad mode records a graph for every forward.",
            fix=f"Before the loop{_where(site)}: call model.eval() and run it under torch.inference_mode() "
                "(or decorate the generation function with @torch.inference_mode()).",
            snippet="model.eval()\nwith torch.inference_mode():\n    out = model.generate(idx, max_new_tokens=500)",
            location=loc(site.location),
        )
