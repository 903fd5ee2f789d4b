from diag.checks.api import check, cuda_training, fmt_seconds


@check(id="example.slow-step", title="Slow training steps", severity="warning",
       requires=[cuda_training("slow steps on a CPU are expected.")])
def slow_step(ctx):
    """Median training step longer than 1 s on a GPU."""
    med = ctx.rank.median_step()
    if med is None:
        return ctx.skip("No timed training step was recorded.")
    if med["total_s"] > 1.0:
        return ctx.finding(f"The median step takes {fmt_seconds(med['total_s'])}.",
                           fix="Profile one step (torch.profiler) to see where the time goes.")
    return ctx.passed(f"The median step takes {fmt_seconds(med['total_s'])}.")
