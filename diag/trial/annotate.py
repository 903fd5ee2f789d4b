"""``diag check --try``: the findings of a run, each with the measured effect of its knob.

The trials run as ``diag try`` would run them for those findings (:mod:`diag.trial.engine`, no first
run: the check's run is the evidence); each finding whose knob was tried gets one sentence appended
to its message ("Measured by diag try: 3.10x faster (2.90-3.30) in 60 steps.") and the trial under
``evidence["measured"]``."""
from __future__ import annotations

from typing import Any, Callable

from diag.trial import plan as P


def sentence(t: dict[str, Any]) -> str:
    v = t.get("verdict")
    if v == "faster":
        return (f"Measured by diag try: {t['speedup']:.2f}x faster ({t['ci_low']:.2f}-{t['ci_high']:.2f}) "
                f"in {t['steps']} steps.")
    if v == "slower":
        return (f"Measured by diag try: slower, {t['speedup']:.2f}x ({t['ci_low']:.2f}-{t['ci_high']:.2f}) "
                f"in {t['steps']} steps.")
    if v == "no change":
        iv = f" ({t['ci_low']:.2f}-{t['ci_high']:.2f}x)" if t.get("ci_low") is not None else ""
        return f"Measured by diag try: no significant change{iv} in {t['steps']} steps."
    if v == "broke":
        return f"Measured by diag try: the change broke the run ({t.get('why')})."
    return f"Measured by diag try: {v} ({t.get('why')})."


def annotate(evidence, findings: list, script: str, script_args: list[str], *, steps: int | None = None,
             budget_s: float = 300.0, progress: Callable[[str], None] | None = None):
    """Run the trials for ``findings`` and write each one's measured effect into its finding.
    Returns the TryResult."""
    from diag.trial.engine import TryConfig, run_try

    result = run_try(TryConfig(script=script, args=list(script_args), steps=steps, budget_s=budget_s,
                               evidence=evidence, findings=findings, progress=progress))
    by_spec: dict[str, dict] = {}
    for t in result.trials:
        if t.kind != "combined":
            for spec in t.knobs:
                by_spec[spec] = t.to_dict()
    for n in result.not_tried:
        by_spec.setdefault(n["knob"], {"verdict": n["verdict"], "why": n["why"], "knob": n["knob"]})
    for f in findings:
        picks = P.from_findings([f])
        if not picks:
            continue
        t = by_spec.get(picks[0].spec)
        if t is None:
            continue
        f.message = (f.message.rstrip() + " " + sentence(t)).strip()
        if isinstance(f.evidence, dict):
            f.evidence["measured"] = {k: t.get(k) for k in ("knob", "verdict", "speedup", "ci_low", "ci_high",
                                                             "steps", "why")}
    return result
