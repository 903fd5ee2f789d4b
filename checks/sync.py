"""Host-device synchronisation check."""
from __future__ import annotations

from diag.checks.api import check, cuda_training, Severity

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
    and collectives."""
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
