"""Evaluation checks."""
from __future__ import annotations

from diag.findings import Finding, Severity
from diag.registry import check

from ._util import TUNING_GUIDE, loc, passed, skipped


@check(id="eval.no-grad", title="Evaluation without no_grad", severity="warning",
       needs=["ranks.forwards", "ranks.models"], tags=["eval", "memory"],
       docs=TUNING_GUIDE + "#disable-gradient-calculation-for-validation-or-inference")
def eval_no_grad(ev):
    """Model forwards in eval mode (`model.eval()`) with grad enabled whose output requires grad:
    each one builds an autograd graph through trainable parameters and keeps its activations
    alive, for nothing. Forwards under `torch.no_grad()`, `torch.inference_mode()`,
    `@torch.no_grad()`, or through frozen modules (output needs no grad) are not flagged."""
    r = ev.primary
    evals = [s for s in r.forwards if not s.training]
    if not r.forwards:
        yield skipped("eval.no-grad", "Evaluation without no_grad", "No model forward was observed.")
        return
    bad = [s for s in evals if s.grad_enabled and not s.inference_mode and s.output_requires_grad]
    if not bad:
        if evals:
            n = sum(s.count for s in evals)
            yield passed("eval.no-grad", "Evaluation runs without building graphs",
                         f"{n} eval-mode forward(s) ran without building an autograd graph.", forwards=n)
        else:
            yield passed("eval.no-grad", "No evaluation forwards",
                         "No eval-mode forward was observed, so none built a graph needlessly.")
        return
    for site in sorted(bad, key=lambda s: -s.count):
        model = r.model(site.model)
        trainable = model.params_trainable if model else None
        where = f" at {loc(site.location)}" if site.location else ""
        mem = (r.memory.get("eval_graph_bytes") or {}).get(site.key) if isinstance(r.memory, dict) else None
        msg = (f"{site.count} forward(s) of {site.module}{where} ran in eval mode with gradients enabled, "
               f"building an autograd graph through {trainable:,} trainable parameters"
               if trainable is not None else
               f"{site.count} forward(s) of {site.module}{where} ran in eval mode with gradients enabled")
        if mem:
            msg += f" and keeping about {mem / (1 << 20):.0f} MiB of activations alive per forward"
        yield Finding(
            id="eval.no-grad", severity=Severity.WARNING, title="Evaluation without no_grad",
            message=msg + ".",
            evidence={"forwards": site.count, "module": site.module, "trainable_params": trainable,
                      "graph_bytes_per_forward": mem, "site": site.key},
            why="Without no_grad every evaluation forward records the autograd graph and keeps "
                "activations for a backward that never comes: slower evaluation and more memory "
                "(a common cause of OOM during validation).",
            fix="Wrap the evaluation loop in torch.inference_mode() (or torch.no_grad()).",
            snippet="model.eval()\nwith torch.inference_mode():\n    for batch in val_loader:\n        out = model(batch)",
            location=loc(site.location),
        )
