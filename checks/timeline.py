"""GPU idle time on the device clock (CUDA runs with a device timeline; docs/timeline.md)."""
from __future__ import annotations

from diag.checks.api import Severity, check, cuda_training, gpu_timeline

from ._util import ms, pct

INFO_SHARE = 0.10      # the GPU idle >= 10% of the step: info
WARN_SHARE = 0.30      # >= 30%: warning

FIXES = {
    "data": ("The GPU waits for batches: load them in DataLoader workers (num_workers > 0, "
             "persistent_workers=True) and see dataloader.workers.",
             "loader = DataLoader(ds, batch_size=B, num_workers=4, pin_memory=True, persistent_workers=True)"),
    "h2d": ("Copies from pageable memory block the stream: pin the batches and copy with non_blocking=True "
            "(see dataloader.pin-memory).",
            "loader = DataLoader(ds, batch_size=B, pin_memory=True)\nx = x.to('cuda', non_blocking=True)"),
    "h2d_pinned": ("Pinned copies on the training stream still hold it up: copy the next batch on a side stream "
                   "while this one computes, or keep the data on the GPU.",
                   "copy_stream = torch.cuda.Stream()\nwith torch.cuda.stream(copy_stream):\n"
                   "    nxt = batch.to('cuda', non_blocking=True)\n"
                   "torch.cuda.current_stream().wait_stream(copy_stream)"),
    "sync": ("A host sync every step (.item(), .cpu(), synchronize) empties the GPU's queue, so the Python "
             "after it leaves the GPU idle: read values back every N steps instead (see sync.host-device).",
             "if step % 100 == 0:\n    print(loss.item())"),
    "host": ("Python between two steps (logging, metrics) leaves the GPU idle: do it less "
             "often, or asynchronously.", None),
    "checkpoint": ("Saving checkpoints leaves the GPU idle while the host serialises: save less often, or hand "
                   "the state to a background writer (torch.distributed.checkpoint.async_save).", None),
    "eval": ("The GPU idles during evaluation passes (their data loading, per-batch .item()): give the "
             "evaluation DataLoader workers and read metrics back once per pass.", None),
}


@check(id="gpu.idle", title="GPU idle time by cause", severity="warning", requires=[cuda_training()],
       tags=["performance", "gpu"], docs="docs/timeline.md")
def gpu_idle(ctx):
    """The share of each step the GPU sat idle, measured with CUDA events on the device's clock, and
    what the host was doing meanwhile: waiting for data, host-to-device copies (pageable and pinned
    apart), after a per-step host sync, Python between steps, checkpointing, evaluation passes
    (their idle; their whole device time is reported beside it). Info at >= 10% of the
    step, warning at >= 30%. Skipped without a device timeline (CPU runs, DIAG_TIMELINE=0)."""
    r = ctx.rank
    s = gpu_timeline(r)
    if s is None:
        tl = r.timeline
        why = ("no step's events were resolved" if tl.clock == "device"
               else "the device timeline was not recorded (DIAG_TIMELINE=0, or evidence from an older diag)")
        yield ctx.skip(f"No device timeline: {why}.")
        return
    numbers = s.as_dict()
    numbers.update(dropped=r.timeline.dropped, resolved=r.timeline.resolved)
    head = s.headline()
    head = head[0].upper() + head[1:]
    where = f" (device clock, {s.steps} steps, {ms(s.step_s)} per step on the device)"
    if s.idle_share < INFO_SHARE:
        # events see the stream reach each mark, not whether kernels ran in between: a step bound by
        # its kernel launches (a small model, a GPU waiting on Python inside the forward) has no idle
        # gap at the marks though the GPU computes a fraction of the time (seen on an H200: 0% idle here,
        # 15% MFU). Said, so that a pass is not read as "the GPU is busy"
        yield ctx.passed(head + where + "; gaps between kernels inside a phase (a step bound by kernel "
                         "launches) are not visible to events: cost.mfu and gpu.low-utilization judge those.",
                         title="No idle gap at the step's marks", **numbers)
        return
    top = max((k for k in FIXES), key=lambda k: s.causes.get(k, 0.0))
    fix, snippet = FIXES[top]
    sev = Severity.WARNING if s.idle_share >= WARN_SHARE else Severity.INFO
    yield ctx.finding(
        severity=sev, message=head + where + ".", evidence=numbers,
        why=(f"Every idle millisecond is paid for: at {pct(s.idle_share)} idle the GPU does "
             f"{pct(1 - s.idle_share)} of the work it could."),
        fix=fix, snippet=snippet)
