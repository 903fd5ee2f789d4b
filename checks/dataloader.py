"""Data pipeline checks."""
from __future__ import annotations

import math

from diag.findings import Finding, Severity
from diag.registry import check

from ._util import TUNING_GUIDE, loc, ms, passed, pct, skipped

WARN_SHARE = 0.10    # data wait >= 10% of step time: warning (TraceML warns at 10%)
ERROR_SHARE = 0.30   # >= 30%: error (the model idles a third of the time)


def data_share(r) -> tuple[float, float, float, int] | None:
    """(share of step time waiting for data, mean data wait, mean compute, n steps) over the timed
    steps of a rank, or None without steps."""
    steps = r.timed_steps()
    if not steps:
        return None
    total = sum(s.total_s for s in steps)
    data = sum(s.data_s for s in steps)
    if total <= 0:
        return None
    n = len(steps)
    return data / total, data / n, (total - data) / n, n


def recommended_workers(num_workers: int, wait_per_step: float, compute_per_step: float,
                        cpu_count: int | None) -> int:
    """Workers needed so that batches are ready when the model asks for them.

    With w workers each producing a batch in f seconds, the pipeline delivers w/f batches per
    second; a step needs one batch every c seconds of compute. Measured: with w = 0 the wait per
    batch is f itself; with w > 0 the observed step rate 1/(c + wait) equals w/f, so
    f = w (c + wait). Then w* = ceil(1.5 f / c), with 50% headroom, capped by the usable CPUs.
    """
    c = max(compute_per_step, 1e-6)
    f = wait_per_step if num_workers == 0 else num_workers * (c + wait_per_step)
    need = math.ceil(1.5 * f / c)
    need = max(need, num_workers + 1, 1)
    if cpu_count:
        need = min(need, max(cpu_count - 1, 1))
    return need


@check(id="dataloader.workers", title="Training waits for data", severity="warning",
       needs=["ranks.steps", "ranks.dataloaders", "environment.cpu_count"], tags=["data"],
       docs=TUNING_GUIDE + "#enable-async-data-loading-and-augmentation")
def dataloader_workers(ev):
    """Share of step time spent waiting in DataLoader.__next__ (median over the steady state,
    the first step excluded). Warning at >= 10% of step time, error at >= 30%. Passes when the wait
    is negligible, even with num_workers=0. Recommends a num_workers from the measured per-batch
    fetch time and the usable CPU count."""
    r = ev.primary
    if not r.dataloaders:
        yield skipped("dataloader.workers", "Training waits for data",
                      "No DataLoader was iterated (see dataloader.main-thread-data for hand-made batching).")
        return
    share = data_share(r)
    if share is None:
        yield skipped("dataloader.workers", "Training waits for data", "No training step was observed.")
        return
    frac, wait, compute, n = share
    loader = max(r.dataloaders, key=lambda d: d.batches)
    cpus = ev.environment.cpu_count
    numbers = {"data_share": round(frac, 4), "data_wait_per_step_s": round(wait, 6),
               "compute_per_step_s": round(compute, 6), "steps": n, "num_workers": loader.num_workers,
               "cpu_count": cpus}
    if frac < WARN_SHARE:
        yield passed("dataloader.workers", "Data arrives in time",
                     f"The model waited for data {pct(frac)} of step time ({ms(wait)} per step, "
                     f"num_workers={loader.num_workers}).", **numbers)
        return
    rec = recommended_workers(loader.num_workers, wait, compute, cpus)
    numbers["recommended_workers"] = rec
    sev = Severity.ERROR if frac >= ERROR_SHARE else Severity.WARNING
    if loader.num_workers >= (cpus or 1) - 1 and rec <= loader.num_workers:
        fix = ("The workers already use every CPU: make each batch cheaper (decode/augment on the GPU, "
               "cache preprocessed data, a faster storage format).")
        snippet = None
    else:
        fix = f"Load batches in background worker processes: num_workers={rec} (this machine has {cpus} usable CPUs)."
        snippet = (f"loader = DataLoader(dataset, batch_size={loader.batch_size}, num_workers={rec},\n"
                   f"                    pin_memory=True, persistent_workers=True)")
    yield Finding(
        id="dataloader.workers", severity=sev, title="Training waits for data",
        message=f"The model waited for data {pct(frac)} of step time ({ms(wait)} of {ms(wait + compute)} "
                f"per step over {n} steps) with num_workers={loader.num_workers} on {cpus} CPUs.",
        evidence=numbers,
        why="While the main process fetches and collates the next batch, the model does nothing; "
            "this time is lost on every step.",
        fix=fix, snippet=snippet, location=loc(loader.location),
    )
