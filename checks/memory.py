"""Memory checks."""
from __future__ import annotations

from diag.findings import Finding, Severity
from diag.memory.oom import parse_oom
from diag.registry import check

from ._util import gib, loc, passed

CUDA_MEMORY_DOCS = "https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"


def _batch_at(r, step: int | None) -> int | None:
    for s in reversed(r.steps):
        if s.samples:
            return s.samples
    for site in r.forwards:
        if site.in_step and site.input_shapes:
            return site.input_shapes[0][0] if site.input_shapes[0] else None
    for d in r.dataloaders:
        if d.batch_size:
            return d.batch_size
    return None


@check(id="memory.oom", title="Out of memory", severity="error", needs=["ranks.exceptions", "ranks.memory"],
       tags=["memory"], docs=CUDA_MEMORY_DOCS)
def memory_oom(ev):
    """The run died of an out-of-memory error: when (step), at what batch size, what the message
    said (requested / capacity / free / allocated / reserved but unallocated) and what to try."""
    hits = [(r, e) for r in ev.ranks for e in r.exceptions if e.is_oom]
    if not hits:
        yield passed("memory.oom", "No out-of-memory error", "The run did not run out of memory.")
        return
    r, exc = hits[0]
    nums = parse_oom(exc.message)
    batch = _batch_at(r, exc.step)
    parts = []
    if "requested" in nums:
        parts.append(f"it asked for {gib(nums['requested'])}")
    if "capacity" in nums:
        parts.append(f"the device holds {gib(nums['capacity'])}")
    if "free" in nums:
        parts.append(f"{gib(nums['free'])} was free")
    if "allocated" in nums:
        parts.append(f"PyTorch had {gib(nums['allocated'])} allocated")
    if "reserved_unallocated" in nums:
        parts.append(f"{gib(nums['reserved_unallocated'])} reserved but unallocated")
    when = f"at step {exc.step + 1}" if exc.step is not None and r.step_stats.count else "before the first step completed"
    msg = f"The script ran out of memory {when}" + (f" with batch size {batch}" if batch else "")
    if parts:
        msg += ": " + ", ".join(parts)
    fixes = []
    frag = nums.get("reserved_unallocated", 0)
    if frag and nums.get("requested") and frag >= nums["requested"]:
        fixes.append("fragmentation: enough memory was reserved but not in one piece; set "
                     "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
    if batch and batch > 1:
        fixes.append(f"halve the micro-batch to {batch // 2} and accumulate gradients over 2 steps "
                     "(same effective batch); `diag memory` estimates the largest batch that fits")
    fixes.append("use mixed precision (torch.autocast with bfloat16) and activation checkpointing "
                 "for the largest blocks")
    yield Finding(
        id="memory.oom", severity=Severity.ERROR, title="Out of memory",
        message=msg + ".",
        evidence={**nums, "batch_size": batch, "step": exc.step, "rank": r.rank, "message": exc.message[:2000]},
        why="The step's peak (weights, gradients, optimizer state and the activations of the batch) "
            "exceeded what the device could give.",
        fix="Try, in order: " + "; ".join(fixes) + ".",
        snippet=("accum = 2\nfor i, (x, y) in enumerate(loader):   # loader batch halved\n"
                 "    loss = loss_fn(model(x), y) / accum\n    loss.backward()\n"
                 "    if (i + 1) % accum == 0:\n        opt.step(); opt.zero_grad(set_to_none=True)"),
        location=loc(exc.location),
    )
