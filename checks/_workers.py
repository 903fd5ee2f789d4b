"""What a DataLoader worker count can and cannot do, said once for every check that advises one
(dataloader.workers on training and evaluation loaders, its attach variant) and the host-contention
reading they share (host.contention).

Host contention is read from what the GPU sampler already records for every run (diag's own process,
CPU runs included): the machine's CPU use and 1-minute load (``gpu.host.series``: ``cpu``, ``load1``)
and the run's own process tree (``gpu.processes.series.cpu``, 100 = one core). A host is *contended*
when its cores are nearly all busy and other processes, not the run, keep at least half a core busy
(or the load stands above the core count by that much): then a DataLoader worker competes for the
same saturated cores as the model and the main process, and more workers will not help (measured on
a 2-core CPU run at load 6: num_workers=1 predicted 204 -> 131 ms, measured +4.2%, its forward +56 ms).
"""
from __future__ import annotations

import math

from diag.checks.api import median

from ._util import ms, pct

SATURATED_HOST = 90.0      # % of the machine's CPU busy (all cores)
OTHERS_CORES = 0.5         # cores kept busy by processes that are not the run's
HEADROOM = 1.5             # workers sized for 1.5x the measured fetch rate


def _col(series: dict | None, key: str) -> list[float]:
    return [float(v) for v in ((series or {}).get(key) or []) if isinstance(v, (int, float))]


def host_contention(ev) -> dict | None:
    """{cpus, samples, host_cpu_percent, load1, run_cpu_percent, run_share, others_cores, contended}
    from the run's host and process series (medians over the samples), or None without them."""
    g = ev.gpu
    host = (g.host if g is not None else None) or {}
    procs = (g.processes if g is not None else None) or {}
    hs, ps = host.get("series") or {}, procs.get("series") or {}
    cpu_host = _col(hs, "cpu")
    if not cpu_host:
        return None
    cpus = host.get("cpu_count") or ev.environment.cpu_count_logical or ev.environment.cpu_count
    if not cpus:
        return None
    load = _col(hs, "load1")
    run_cpu = _col(ps, "cpu")
    host_pct = median(cpu_host)
    run_pct = median(run_cpu) if run_cpu else None
    load1 = median(load) if load else None
    run_cores = (run_pct or 0.0) / 100.0
    busy_others = max(host_pct / 100.0 * cpus - run_cores, 0.0)
    load_others = max(load1 - run_cores, 0.0) if load1 is not None else 0.0
    # the load counts runnable tasks the cores could not serve: beyond the cores, it is demand too
    others = max(busy_others, load_others - max(cpus - run_cores - busy_others, 0.0)) if load1 is not None \
        else busy_others
    contended = host_pct >= SATURATED_HOST and others >= OTHERS_CORES
    return {"cpus": cpus, "samples": len(cpu_host), "host_cpu_percent": round(host_pct, 1),
            "load1": round(load1, 2) if load1 is not None else None,
            "run_cpu_percent": round(run_pct, 1) if run_pct is not None else None,
            "run_share": round(run_cores / cpus, 3) if run_pct is not None else None,
            "others_cores": round(others, 2), "contended": contended}


def contention_words(c: dict) -> str:
    """'the host was saturated (load 6.3 on 2 CPUs, 100% busy; this run got 37% of one core)'."""
    load = f"load {c['load1']:.1f} on {c['cpus']} CPUs, " if c.get("load1") is not None else f"{c['cpus']} CPUs "
    mine = (f"; this run got {c['run_cpu_percent']:.0f}% of one core, other processes ~{c['others_cores']:.1f} "
            "core(s)" if c.get("run_cpu_percent") is not None else "")
    return f"the host was saturated ({load}{c['host_cpu_percent']:.0f}% busy{mine})"


def fetch_time(num_workers: int, wait_per_step: float, compute_per_step: float) -> float:
    """Seconds one worker needs to produce a batch, from what was measured: with 0 workers the wait
    per batch is the fetch itself; with w workers the observed step rate 1/(c + wait) is w/f."""
    c = max(compute_per_step, 1e-6)
    return wait_per_step if num_workers == 0 else num_workers * (c + wait_per_step)


def recommended_workers(num_workers: int, wait_per_step: float, compute_per_step: float,
                        cpu_count: int | None, cpu_training: bool = False) -> int:
    """w* = ceil(1.5 f / c), at least one more than today, capped by the usable CPUs (half of them
    on a CPU-only run: the model's compute uses the cores too)."""
    c = max(compute_per_step, 1e-6)
    f = fetch_time(num_workers, wait_per_step, compute_per_step)
    need = max(math.ceil(HEADROOM * f / c), num_workers + 1, 1)
    if cpu_count:
        cap = max(cpu_count // 2, 1) if cpu_training else max(cpu_count - 1, 1)
        need = min(need, cap)
    return need


def advice(*, num_workers: int, wait: float, compute: float, cpus: int | None, on_cpu: bool,
           contention: dict | None, batch_size=None, lead: str | None = None, snippet: str | None = None,
           pin_word: str = "pin_memory=True", evaluation: bool = False, timed: bool = True) -> dict:
    """The one data-worker advice: {rec, fetch_s, predicted_s, helps, capped, fix, snippet, why_not}.

    ``lead``/``snippet``: the knob's words for ``num_workers=rec`` in the run's framework (None: plain
    words). No pin_memory on a CPU run; no prediction and no worker count where workers cannot help
    (already at the cap, or a contended host: a worker then competes for the same saturated cores).
    ``timed=False`` (sampled evidence, diag attach): ``wait`` and ``compute`` are shares of the window,
    and the text gives ratios, not times."""
    rec = recommended_workers(num_workers, wait, compute, cpus, on_cpu)
    f = fetch_time(num_workers, wait, compute)
    predicted = max(compute, f / max(rec, 1))
    if rec <= num_workers or predicted >= wait + compute:
        predicted = None
    contended = bool(contention and contention.get("contended"))
    cheaper = ("cache decoded/preprocessed data, a faster storage format" if on_cpu else
               "decode/augment on the GPU, cache preprocessed data, a faster storage format")
    what = "evaluation batches" if evaluation else "batches"
    step = "an evaluation step" if evaluation else "the step"
    out = {"rec": rec, "fetch_s": f, "predicted_s": None, "helps": False, "capped": False, "why_not": None}
    if contended:
        out["why_not"] = "contended"
        out["fix"] = (f"Not a worker count: {contention_words(contention)}, so a DataLoader worker would compete "
                      f"for the same busy cores as the model (the wait measures the machine's load as much as the "
                      f"pipeline). Re-measure on a quiet machine, or compare num_workers={num_workers} and "
                      f"{max(rec, num_workers + 1)} with `diag compare --runs 3`; making each batch cheaper ({cheaper}) "
                      "helps either way.")
        out["snippet"] = None
        return out
    if rec <= num_workers:
        out["why_not"] = "at-cap"
        out["fix"] = (("On this CPU-only run the DataLoader workers share the cores with the model's compute, and "
                       f"{num_workers} worker(s) is as many as {cpus} CPUs leave room for: " if on_cpu else
                       "The workers already use every CPU: ") + f"make each batch cheaper ({cheaper}).")
        out["snippet"] = None
        return out
    out["helps"] = True
    out["predicted_s"] = predicted
    out["capped"] = cpus is not None and f / rec > compute * 1.05
    head = lead or f"DataLoader(..., num_workers={rec})."
    if timed:
        fix = (f"Load {what} in background worker processes. {head} This machine has {cpus} usable CPUs; each "
               f"batch takes {ms(f)} to produce and the model needs one every {ms(compute)}"
               + (f", so {step} should drop from {ms(wait + compute)} to about {ms(predicted)}." if predicted else "."))
    else:
        fix = (f"Load {what} in background worker processes. {head} This machine has {cpus} usable CPUs; building a "
               f"batch takes {f / max(compute, 1e-9):.1f}x the model's time per batch"
               + (f", so the loop should run about {(wait + compute) / predicted:.1f}x faster." if predicted else "."))
    if out["capped"]:
        fix += (f" Even {rec} worker{'s' if rec != 1 else ''} cannot keep up"
                + (f" ({ms(f / rec)} per batch)" if timed else "") + f": also make each batch cheaper ({cheaper}).")
    if on_cpu:
        fix += (f" The model runs on the CPU: workers share the {cpus} cores with its compute, so the gain is "
                f"smaller than predicted when compute already uses every core; compare the step time with "
                f"num_workers={num_workers} and {rec}, and keep the faster.")
    elif snippet and pin_word:
        # CUDA: the batches the workers build are pinned too (the pin-memory knob's word)
        snippet = snippet.replace(f"num_workers={rec}", f"num_workers={rec}, {pin_word}", 1)
    out["fix"] = fix
    out["snippet"] = snippet
    return out


def quartile_low(values: list[float]) -> float | None:
    """The 25th percentile (nearest rank) of ``values``: the share most steps reach at least."""
    v = sorted(values)
    if not v:
        return None
    return v[max(int(math.ceil(0.25 * len(v))) - 1, 0)]


def holds_as_error(shares: list[float], threshold: float, contention: dict | None) -> bool:
    """An ERROR must hold under load: three steps in four at or above the threshold (the run's own
    spread, not one median), and the host not contended (a busy machine inflates every wait)."""
    q = quartile_low(shares)
    return q is not None and q >= threshold and not (contention and contention.get("contended"))


__all__ = ["host_contention", "contention_words", "advice", "fetch_time", "recommended_workers", "quartile_low",
           "holds_as_error", "pct"]
