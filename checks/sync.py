"""Host-device synchronisation check."""
from __future__ import annotations

from diag.checks.api import check, cuda_training, Severity

from ._framework import LOOPS, NAMES, framework_entry, framework_of, words
from ._perf import guide, short_file
from ._util import loc, ms

SYNC_WARN_PER_STEP = 1.0    # at least one synchronisation per step on average: warning


@check(id="sync.host-device", title="Host-device synchronisations every step", severity="warning",
       needs=["ranks.sync", "ranks.models"], tags=["gpu", "tuning"],
       docs=guide("avoid-unnecessary-cpu-gpu-synchronization"),
       requires=[cuda_training("torch's sync debug mode exists for CUDA only.")])
def sync_host_device(ctx):
    """Synchronisations between the CPU and the GPU inside the training loop (`.item()`, `.cpu()`,
    `print(cuda_tensor)`, `nonzero()`, blocking copies, Python `if` on a CUDA value), counted per
    step with `torch.cuda.set_sync_debug_mode("warn")` over a window of 20 steps after the first, and
    located in the user's code. Each one stops the CPU from queuing work ahead of the GPU. Warning at
    >= 1 per step on average, info when some happen less often. Skipped without CUDA.
    Not seen by the debug mode: non_blocking copies from pageable memory (see dataloader.pin-memory)
    and collectives. Syncs inside a framework's loop (located at the script's trainer.train() /
    trainer.fit() line) name that code path and the framework's lever (the Hugging Face Trainer:
    logging_nan_inf_filter=False, logging_steps; Lightning: log_every_n_steps, the progress bar's
    refresh rate), or are info saying there is none."""
    ev = ctx.evidence
    r = ev.primary
    s = r.sync or {}
    state = s.get("state")
    if not s or not str(state or "").startswith(("sampled", "sampling")):
        yield ctx.skip(f"Synchronisations were not sampled ({state or 'no record'}).")
        return
    n = int(s.get("steps", 0) or 0)
    if n == 0:
        yield ctx.skip("The sampling window closed before a full step was counted.")
        return
    total = int(s.get("total", 0) or 0)
    per_step = total / n
    sites = s.get("sites") or []
    ph = r.median_step()
    numbers = {"syncs": total, "steps_sampled": n, "syncs_per_step": round(per_step, 3),
               "per_step": s.get("per_step", [])[:50],
               "window": [s.get("first_step"), s.get("last_step")],
               "sites": [{"location": short_file(x), "function": x.get("function"), "code": x.get("code"),
                          "count": x.get("count"), "per_step": round(x.get("count", 0) / n, 3)} for x in sites[:5]],
               "step_s": round(ph["total_s"], 6) if ph else None}
    if total == 0:
        yield ctx.passed(f"No host-device synchronisation in {n} sampled steps.", **numbers, title="No synchronisations")
        return
    sev = Severity.WARNING if per_step >= SYNC_WARN_PER_STEP else Severity.INFO
    top = sites[0] if sites else None
    step_txt = f" ({ms(ph['total_s'])} step)" if ph else ""
    fw, entry = framework_of(ev), framework_entry(ev)
    inside = [x for x in sites if fw and entry and x.get("file") == entry.get("file")
              and x.get("line") == entry.get("line")]
    n_inside = sum(int(x.get("count", 0) or 0) for x in inside)
    if inside and n_inside * 2 >= total:
        # the syncs happened in the framework's own loop, called from the user's trainer.train()/fit() line:
        # the user's lever is a setting of the framework, or there is none
        fix, snippet, lever = words(ev, "log.interval", n=100)
        numbers.update(framework=fw, inside_framework=n_inside, framework_loop=LOOPS.get(fw))
        if fw == "accelerate" or not lever:
            sev = Severity.INFO
            fix = (f"These synchronisations are inside {LOOPS.get(fw, fw)}, not in the script's own lines, and "
                   f"{NAMES.get(fw, fw)} has no setting that removes them: nothing to change in the script.")
            snippet = None
        yield ctx.finding(
            severity=sev,
            message=f"{per_step:.1f} host-device synchronisation(s) per step over {n} sampled steps{step_txt}, "
                    f"{n_inside / n:.1f} of them inside {LOOPS.get(fw, fw)}, called from {short_file(entry)}"
                    + (f" `{inside[0].get('code')}`" if inside[0].get("code") else "")
                    + " (the probe locates a sync at the script's line that called in, not the framework's line).",
            evidence=numbers,
            why="A synchronisation makes the CPU wait until the GPU has finished everything queued, so the "
                "next kernels are launched late and the GPU idles while Python catches up.",
            fix=fix, snippet=snippet, location=loc(entry))
        return
    where = "; ".join(f"{short_file(x)} `{x.get('code') or x.get('function')}` x{x.get('count', 0) / n:.1f}/step"
                      for x in sites[:3])
    step_txt = f" ({ms(ph['total_s'])} step)" if ph else ""
    yield ctx.finding(
        severity=sev,
        message=f"{per_step:.1f} host-device synchronisation(s) per step over {n} sampled steps{step_txt}"
                + (f": {where}" if where else "") + ".",
        evidence=numbers,
        why="A synchronisation makes the CPU wait until the GPU has finished everything queued, so the "
            "next kernels are launched late and the GPU idles while Python catches up.",
        fix="Keep values on the GPU and read them rarely: accumulate the loss in a tensor and call .item() "
            "every N steps; copy batches with pin_memory=True and non_blocking=True; avoid Python branches "
            "on CUDA values and nonzero()/masked indexing with data-dependent sizes in the step.",
        snippet=("running = torch.zeros((), device=\"cuda\")\nfor step, (x, y) in enumerate(loader):\n"
                 "    loss = train_step(x, y)\n    running += loss.detach()          # no sync\n"
                 "    if step % 100 == 0:\n        print(running.item() / 100)     # one sync per 100 steps\n"
                 "        running.zero_()"),
        location=loc(top),
    )
