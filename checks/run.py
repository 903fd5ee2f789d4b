"""Checks about the run itself: did the script fail, did it train at all."""
from __future__ import annotations

from diag.checks.api import check, fmt_seconds, median, Severity

from ._util import loc


def _sentence(text: str) -> str:
    """One line of an exception's message as the end of a sentence: one full stop, never two."""
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else text + "."


@check(id="run.failed", title="The script failed", severity="error", needs=["run", "ranks.exceptions"],
       tags=["run"])
def run_failed(ctx):
    """The script raised an exception (or exited with a non-zero status). The traceback is shown;
    out-of-memory errors are diagnosed by `memory.oom`. Exit code 3 from `diag check`."""
    ev = ctx.evidence
    run = ev.run
    if run.status == "running":
        yield ctx.skip("The run is still going.")
        return
    if run.status not in ("failed", "oom", "killed"):
        yield ctx.passed(f"The run ended with status '{run.status}'.", title="The script did not fail")
        return
    excs = [(r.rank, e) for r in ev.ranks for e in r.exceptions]
    if excs:
        # several ranks: the first to fail is the cause, the others' errors its consequences
        rank, exc = min(excs, key=lambda x: (ev.rank(x[0]).started_at or 0.0) + (x[1].t or 0.0))
        where = f" on rank {rank}" if ev.multi_rank else ""
        yield ctx.finding(
            severity=Severity.ERROR,
            message=f"The script raised {exc.type}{where} after {exc.step or 0} training step(s): "
                    f"{_sentence(exc.message.splitlines()[0][:300] if exc.message.strip() else exc.type)}",
            evidence={"type": exc.type, "step": exc.step, "rank": rank, "is_oom": exc.is_oom,
                      "traceback": exc.traceback},
            why="Nothing after the failure was observed; the findings below cover what ran before it.",
            fix="Read the traceback (shown above and in the run's log); "
                + ("see memory.oom for the out-of-memory diagnosis." if exc.is_oom else "fix the error and run again."),
            location=loc(exc.location),
        )
    else:
        yield ctx.finding(
            severity=Severity.ERROR,
            message=f"The script ended with status '{run.status}' (exit code {run.exit_code})"
                    + (f": {run.stop_reason}." if run.stop_reason else "."),
            evidence={"status": run.status, "exit_code": run.exit_code, "reason": run.stop_reason},
            fix="Look at the end of the run's log for the cause" + (f" ({run.log_path})." if run.log_path else "."),
        )


@check(id="run.no-steps", title="No training step observed", severity="error",
       needs=["ranks.steps", "ranks.forwards"], tags=["run"])
def run_no_steps(ctx):
    """No training step was observed: no optimizer.step() and no backward() through a model's
    output. An evaluation or batch-inference run (forwards that do not train, no backward and no
    optimizer: `Evidence.run_kind()` is `evaluation`) passes: it is judged by the eval.* checks.
    Usually the wrong script, a script that exits early, or training code diag cannot see
    (a model that is not a torch.nn.Module). When the main process only started child processes that
    trained (Hogwild with torch.multiprocessing, fork or spawn: diag follows them), an info that says
    so, with each child's step count, instead of an error. A script that raised before its first step
    is skipped here: run.failed (or memory.oom) reports that failure, and "is this the training
    script?" would be the wrong advice."""
    ev = ctx.evidence
    total = sum(r.step_stats.count for r in ev.ranks)
    if total == 0 and ev.run.status == "running":
        yield ctx.skip("The run is still starting: no step yet.")
        return
    if total > 0:
        yield ctx.passed(f"{total} training step(s) observed.",
                     steps=total, title="Training steps observed")
        return
    if ev.run_kind() == "evaluation":
        # an evaluation or batch-inference script: judged as one (the eval.* checks), not as a failure
        r = ev.primary
        tp = r.eval_throughput()
        forwards = sum(s.count for s in r.forwards)
        yield ctx.passed(
            f"An evaluation run: {forwards} forward(s) without a training step"
            + (f" ({tp['steps']} evaluation step(s), {tp['batches_per_s']:.1f} batches/s)." if tp else "."),
            kind="evaluation", forwards=forwards, eval_steps=tp["steps"] if tp else 0,
            title="Evaluation run (no training expected)")
        return
    kids = [c for r in ev.ranks for c in r.children]
    child_steps = sum(c.steps for c in kids)
    if child_steps > 0:
        # Hogwild-style training: the parent starts processes that train; diag followed them
        med = [c.median_step_s for c in kids if c.median_step_s]
        per = ", ".join(f"{c.steps}" for c in kids[:8]) + (", ..." if len(kids) > 8 else "")
        yield ctx.finding(
            severity=Severity.INFO, title="Training ran in child processes",
            message=f"Training ran in {len(kids)} child process(es) ({child_steps} step(s) in all: {per}; "
                    f"{sum(c.samples for c in kids)} samples"
                    + (f"; median step {fmt_seconds(median(med))}" if med else "")
                    + "); the main process only started them, so the per-step checks, which read the "
                    "main process's steps, do not judge this run.",
            evidence={"children": len(kids), "steps": child_steps, "steps_per_child": [c.steps for c in kids],
                      "samples": sum(c.samples for c in kids),
                      "start_methods": sorted({c.start_method for c in kids if c.start_method})},
            why="diag follows multiprocessing / torch.multiprocessing children and counts their steps; "
                "its detailed measurements are taken in the process that runs the script.",
            fix="Nothing to fix. To have every check judge the training loop, run one training process "
                "under diag (for example the child's function called directly, or torchrun for DDP).",
        )
        return
    if ev.run.status in ("failed", "oom") and any(r.exceptions for r in ev.ranks):
        # the failure is why no step was seen: run.failed (or memory.oom) says it, with the traceback;
        # "is this the training script?" would be advice for another situation
        yield ctx.skip("The script failed before its first training step (run.failed has the error): "
                       "no step to judge.")
        return
    forwards = sum(s.count for r in ev.ranks for s in r.forwards)
    yield ctx.finding(
        severity=Severity.ERROR,
        message=f"No training step was observed in {ev.run.wall_s or 0:.1f} s "
                f"({forwards} model forward(s), {sum(r.backward_calls for r in ev.ranks)} backward(s), "
                f"{sum(o.steps for r in ev.ranks for o in r.optimizers)} optimizer step(s)).",
        evidence={"forwards": forwards, "status": ev.run.status, "wall_s": ev.run.wall_s},
        why="Without steps, no performance check can judge this run.",
        fix="Check that this is the training script and that its arguments make it train "
            "(a --help or a dry-run flag exits early); diag sees torch.nn.Module forwards, "
            "backward() and torch.optim optimizer steps.",
    )


@check(id="host.contention", title="A contended host", severity="info", needs=["gpu.host", "gpu.processes"],
       tags=["run", "data"])
def host_contention_check(ctx):
    """Whether other processes competed with the run for the CPUs, from what diag's sampler recorded
    beside it (the machine's CPU use and 1-minute load, the run's own process tree's CPU; medians over
    the samples). Contended: the machine was at least 90% busy and other processes kept at least half
    a core busy (from the CPU use, or the load beyond the cores). Info: every timing of such a run is
    inflated and noisier, a DataLoader worker would compete for the same busy cores (dataloader.workers
    then says a worker count will not help and gives no error), and a comparison needs repeats. Passes
    on a host with room; skipped without host samples (attached evidence, or a run shorter than the
    sampler's first reading)."""
    from ._workers import contention_words, host_contention

    c = host_contention(ctx.evidence)
    if c is None:
        yield ctx.skip("No host CPU samples were recorded beside the run.")
        return
    if not c["contended"]:
        yield ctx.passed(f"The host had room: {c['host_cpu_percent']:.0f}% of {c['cpus']} CPUs busy"
                         + (f", load {c['load1']:.1f}" if c.get("load1") is not None else "")
                         + (f", this run {c['run_cpu_percent']:.0f}% of one core" if c.get("run_cpu_percent") is not None
                            else "") + ".", title="The host had room", **c)
        return
    yield ctx.finding(
        severity=Severity.INFO,
        message=f"During the run {contention_words(c)}: its timings are inflated and noisier than on a quiet "
                "machine, and more DataLoader workers would compete for the same busy cores.",
        evidence=c,
        why="Processes that are not the run's take CPU time from its main process, its DataLoader workers and its "
            "intra-op threads alike; the waits diag measures then include the machine's queue.",
        fix="Judge speed on a quiet machine (or a dedicated runner); compare with `diag compare --runs 3` so that "
            "the run-to-run variance is measured; torch.set_num_threads() below the free cores avoids "
            "oversubscription.",
    )
