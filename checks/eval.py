"""Evaluation checks."""
from __future__ import annotations

from diag.checks.api import check, Severity

from ._perf import guide, short_file, size
from ._util import loc


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
        msg = (f"{count} forward(s) of {site.module}{where} ran in eval mode with gradients enabled, "
               f"building an autograd graph through {trainable:,} trainable parameters"
               if trainable is not None else
               f"{count} forward(s) of {site.module}{where} ran in eval mode with gradients enabled")
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
