"""Checks about diag itself: what its probe cost the run it observed (issue 20)."""
from __future__ import annotations

from diag.evidence import probe as probe_cost
from diag.checks.api import Severity, check

from ._framework import framework_of, words

# what makes each step do more work, where the framework runs the loop (the batch is its own argument)
BATCH_WORDS = {"transformers": "a larger TrainingArguments(per_device_train_batch_size=...)",
               "lightning": "a larger batch_size on the training DataLoader (the one trainer.fit() gets or "
                            "train_dataloader() returns)",
               "accelerate": "a larger batch_size on the DataLoader you pass to accelerator.prepare()"}


def more_work(ev) -> str:
    """'a larger batch, or gradient accumulation (...)' in the words of the framework that ran the loop."""
    fw = framework_of(ev)
    if fw not in BATCH_WORDS:
        return probe_cost.MORE_WORK
    fix, _, _ = words(ev, "train.accumulation", n="N")
    fix = fix.rstrip(".")
    if fix.split()[0].isalpha():          # "Construct the Trainer ...", not "Accelerator(...)"
        fix = fix[0].lower() + fix[1:]
    return f"{BATCH_WORDS[fw]}, or gradient accumulation: {fix}"


@check(id="probe.overhead", title="diag's probe took a visible share of the step", severity="warning",
       needs=["ranks.steps", "ranks.probe"], tags=["diag", "performance"], docs="docs/performance.md")
def probe_overhead(ctx):
    """diag's probe times its own hooks, extensions and event writes in every step (``probe_s``),
    plus an estimate of torch's dispatch of its hooks calibrated at install: a lower bound of its
    cost. Above 2% of the median step it is an info: verdicts that turn on a few percent of the step
    (data wait, host overhead, optimizer share) are less reliable in this run, but the job has no fault
    to fix (a clean script under `--fail-on warning` must pass). A warning above 10% on three steps in
    four (the lower quartile): the probe's own time then reaches the 10% lines of the data-wait and
    host-overhead checks (a DataLoader re-created every step reopening discovery windows, a 0.1 ms
    step). The finding names the largest part of
    the probe's time and how to switch it off, and says what makes each step do more work (a larger batch,
    gradient accumulation) in the words of the framework that ran the loop (Lightning's Trainer, the
    Hugging Face Trainer, accelerate)."""
    s = probe_cost.of_evidence(ctx.evidence)
    if s is None:
        yield ctx.skip(f"Fewer than {probe_cost.MIN_STEPS} timed steps after the probe's first "
                       f"{probe_cost.PROBE_WARMUP} (its one-off work) carry its own time: too short to judge "
                       "its steady cost (or evidence from an older probe).")
        return
    evidence = {k: s[k] for k in ("median_step_share", "median_probe_s", "median_step_s", "steps") if k in s}
    for k in ("by_part", "windows", "window_reasons"):
        if s.get(k) is not None:
            evidence[k] = s[k]
    head = probe_cost.headline(s)
    if s["median_step_share"] <= probe_cost.WARN_SHARE:
        yield ctx.passed(f"{head}.", title="diag's probe cost little", **evidence)
        return
    q1 = s.get("q1_step_share")
    evidence["q1_step_share"] = q1
    # a warning only when the share holds past the loud line on three steps in four: a median near a line
    # is the step's spread (and the machine's load), not a cost that moves the verdicts (issue 33)
    loud = q1 is not None and q1 > probe_cost.LOUD_SHARE
    yield ctx.finding(
        severity=Severity.WARNING if loud else Severity.INFO,
        message=f"{head}; verdicts that turn on a few percent of the step are less reliable in this run.",
        evidence=evidence,
        why="The probe runs inside the training process: its own work lengthens each step, so shares of "
            "the step it reports (data wait, host-side overhead) include some of its own time.",
        fix=probe_cost.lighten(s, more_work(ctx.evidence)),
    )
