"""``diag attach``: sample a running training job from outside (py-spy machine formats + NVML) into
Evidence marked ``run.source = "attach"``, judged by the same registry (docs/attach.md).

Modules: ``pyspy`` (running py-spy, permission errors), ``target`` (what a PID is, workers, ranks),
``phases`` (phase of one stack), ``analyse`` (speedscope -> per-process summaries), ``session`` (one
window), ``evidence`` (the one adapter: window -> Evidence), ``report`` (text). Judging is the registry's, as
for ``diag check``: the checks declare the evidence sources they can judge (diag.checks.api).
"""
