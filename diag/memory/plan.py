"""Memory planning: allowances for what the fake replay cannot see, the search for the largest batch
that fits (bisection), gradient accumulation, and the plan written to Evidence. Pure Python.

The replay (:mod:`diag.probe.replay`) measures what CUDA's caching allocator would report as
*allocated* for the tensors of one step. A real device holds more; these allowances are added
(every figure is documented in docs/memory.md with its source):

allocated level (counted by ``torch.cuda.max_memory_allocated``)
    ``cublas_workspace``  cuBLAS keeps one workspace per (handle, stream) and the autograd engine runs
                          the backward on its own thread (its own handle): 2 x 8.125 MiB before
                          Hopper (``:4096:2:16:8``), 2 x 32 MiB on Hopper and later (PyTorch's
                          ``CublasHandlePool.cpp`` defaults; ``CUBLAS_WORKSPACE_CONFIG`` changes them).
                          Only when the step runs matrix multiplications.
    ``cudnn_workspace``   convolution algorithms ask for scratch space (128 MiB assumed; it varies
                          with the algorithm cuDNN picks). Only when the step runs convolutions.
    ``ddp_buckets``       DistributedDataParallel copies gradients into its buckets unless
                          ``gradient_as_bucket_view=True``: one more gradient-sized buffer.
device level (what ``nvidia-smi`` shows, what runs out)
    ``allocator_cache``   the caching allocator reserves whole blocks (2 MiB / 20 MiB segments) and
                          keeps freed ones: reserved exceeds allocated at the peak, 5% assumed
                          (``expandable_segments:True`` reduces it).
    ``cuda_context``      the CUDA context and loaded kernels: 512 MiB assumed (300 MiB to 1 GiB
                          depending on GPU, driver and CUDA version; lazy module loading keeps it low).

A batch *fits* when the device-level estimate is at most ``(1 - headroom)`` of the device's memory
(10% headroom by default, the same 90% line the ``memory.headroom`` check draws).
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

MiB = 1 << 20
GiB = 1 << 30

HEADROOM = 0.10
CUDA_CONTEXT_BYTES = 512 * MiB
ALLOCATOR_CACHE_FRACTION = 0.05
CUDNN_WORKSPACE_BYTES = 128 * MiB
CUBLAS_WORKSPACE_PRE_HOPPER = 4096 * 1024 * 2 + 16 * 1024 * 8     # 8.125 MiB, PyTorch's default
CUBLAS_WORKSPACE_HOPPER = 4096 * 8 * 1024                          # 32 MiB (sm90+)
CUBLAS_THREADS = 2          # the forward's thread and the autograd engine's device thread

MAX_SEARCH_BATCH = 1 << 20
SEARCH_PRECISION = 1 / 64   # the largest batch is found to within 1.6% (a lower bound)
MAX_TABLE_ROWS = 10


def cublas_workspace(capability: list[int] | tuple[int, int] | None) -> int:
    """Per-handle cuBLAS workspace: 32 MiB on sm90+ (and when the GPU is unknown), else 8.125 MiB."""
    if capability and int(capability[0]) < 9:
        return CUBLAS_WORKSPACE_PRE_HOPPER
    return CUBLAS_WORKSPACE_HOPPER


def allowances(point: dict, facts: dict, capability=None) -> dict[str, int]:
    """The allowances for one replayed point (bytes, by name). ``facts``: ``matmul``, ``conv``
    (the step runs them), ``ddp_grad_bytes`` (gradient bytes DDP copies into buckets, 0 if none)."""
    out: dict[str, int] = {}
    train = point.get("mode", "train") == "train"
    if facts.get("matmul"):
        out["cublas_workspace"] = cublas_workspace(capability) * (CUBLAS_THREADS if train else 1)
    if facts.get("conv"):
        out["cudnn_workspace"] = CUDNN_WORKSPACE_BYTES
    if train and facts.get("ddp_grad_bytes"):
        out["ddp_buckets"] = int(facts["ddp_grad_bytes"])
    allocated = int(point["peak"]) + sum(out.values())
    out["allocator_cache"] = int(allocated * ALLOCATOR_CACHE_FRACTION)
    out["cuda_context"] = CUDA_CONTEXT_BYTES
    return out


def device_figures(point: dict, facts: dict, capability=None) -> dict[str, Any]:
    """``allocated`` (comparable with torch.cuda.max_memory_allocated) and ``device`` (comparable
    with the device's total memory) for a replayed point."""
    al = allowances(point, facts, capability)
    allocated = int(point["peak"]) + sum(v for k, v in al.items() if k not in ("allocator_cache", "cuda_context"))
    device = allocated + al["allocator_cache"] + al["cuda_context"]
    return {"allocated": allocated, "device": device, "allowances": al}


# ---------------------------------------------------------------------------------------------------
# the search

def largest_fitting(fits: Callable[[int], bool], start: int, limit: int = MAX_SEARCH_BATCH,
                    should_stop: Callable[[], bool] | None = None, precision: float = 0.0,
                    guess: int | None = None) -> dict[str, Any]:
    """The largest batch ``b`` with ``fits(b)``, assuming ``fits`` is monotone (true up to some
    batch, false beyond). Doubling (or halving) from ``start`` brackets it, bisection narrows the
    bracket: O(log b) trials, never a linear scan.

    ``guess`` (a predicted answer, e.g. from the peak's slope between two replays) starts the
    bracket there with a 5% step instead of 2x, so a good guess needs a handful of trials; a bad
    one only costs the doubling it would have cost anyway. ``precision`` stops the bisection when
    the bracket is narrower than that fraction of the batch (0: down to one sample); the answer
    is then a lower bound within that fraction.

    Returns ``{"max": b or 0, "first_fail": the smallest batch seen not to fit or None,
    "trials": [(batch, fits)], "complete": bool}``; ``max`` is 0 when not even batch 1 fits;
    ``first_fail`` is None when ``limit`` fits.
    """
    trials: list[tuple[int, bool]] = []
    complete = True

    def test(b: int) -> bool:
        ok = bool(fits(b))
        trials.append((b, ok))
        return ok

    def stop() -> bool:
        return bool(should_stop and should_stop())

    factor = 2.0
    if guess is not None and guess >= 1:
        start = int(guess)
        factor = 1.05
    start = max(1, min(int(start), limit))
    lo, hi = 0, None             # lo fits (0: nothing known to fit); hi does not fit
    if test(start):
        lo = b = start
        while b < limit:
            if stop():
                complete = False
                break
            b = min(max(b + 1, int(b * factor)), limit)
            factor = 2.0
            if test(b):
                lo = b
            else:
                hi = b
                break
    else:
        hi = b = start
        while b > 1:
            if stop():
                complete = False
                break
            b = max(1, min(b - 1, int(b / factor)))
            factor = 2.0
            if test(b):
                lo = b
                break
            hi = b
    if hi is not None:
        while hi - lo > max(1, int(lo * precision)):
            if stop():
                complete = False
                break
            mid = (lo + hi) // 2
            if test(mid):
                lo = mid
            else:
                hi = mid
    return {"max": lo, "first_fail": hi, "trials": trials, "complete": complete}


def predict_batch(points: list[dict], usable: int) -> int | None:
    """The batch at which the device figure reaches ``usable``, extrapolated linearly from two
    replayed points (peak memory is affine in the batch size: fixed state + per-sample
    activations); None when it cannot be predicted."""
    pts = sorted({p["batch"]: p for p in points if p.get("device") is not None}.values(), key=lambda p: p["batch"])
    if len(pts) < 2:
        return None
    a, b = pts[0], pts[-1]
    slope = (b["device"] - a["device"]) / (b["batch"] - a["batch"])
    if slope <= 0:
        return None
    x = a["batch"] + (usable - a["device"]) / slope
    if not math.isfinite(x) or x < 1:
        return None
    return int(min(x, MAX_SEARCH_BATCH))


def accumulation_plan(target: int, max_micro: int) -> dict[str, Any] | None:
    """Micro-batch and accumulation steps that keep the effective batch ``target`` with micro-batches
    of at most ``max_micro``: the fewest steps, preferring an exact split (micro x steps == target)
    when one exists within twice the fewest steps."""
    if max_micro <= 0 or target <= 0:
        return None
    if max_micro >= target:
        return {"micro_batch": target, "steps": 1, "effective_batch": target, "exact": True}
    k_min = math.ceil(target / max_micro)
    for k in range(k_min, min(target, 2 * k_min) + 1):
        if target % k == 0:
            return {"micro_batch": target // k, "steps": k, "effective_batch": target, "exact": True}
    micro = math.ceil(target / k_min)
    return {"micro_batch": micro, "steps": k_min, "effective_batch": target, "exact": False,
            "last_micro_batch": target - micro * (k_min - 1)}


def accumulation_snippet(plan: dict) -> str:
    micro, steps, eff = plan["micro_batch"], plan["steps"], plan["effective_batch"]
    lines = [
        f"accum_steps = {steps}                     # {micro} x {steps} = effective batch {eff}",
        f"loader = DataLoader(dataset, batch_size={micro}, shuffle=True)",
        "optimizer.zero_grad(set_to_none=True)",
        "for i, (x, y) in enumerate(loader):",
        "    loss = loss_fn(model(x), y) / accum_steps   # average over the micro-batches",
        "    loss.backward()                               # gradients add up in .grad",
        "    if (i + 1) % accum_steps == 0:",
        "        optimizer.step()",
        "        optimizer.zero_grad(set_to_none=True)",
    ]
    if not plan.get("exact"):
        lines.append(f"# {eff} is not a multiple of {steps}: the last micro-batch of each step has "
                     f"{plan.get('last_micro_batch')} samples")
    return "\n".join(lines)


def _pow2_upto(n: int) -> list[int]:
    out, b = [], 1
    while b <= n:
        out.append(b)
        b *= 2
    return out


def table_batches(observed: int, target: int, max_batch: int | None, limit_rows: int = MAX_TABLE_ROWS) -> list[int]:
    """Batch sizes for the table: powers of two around the interesting ones, plus the user's batch,
    the largest that fits and the first that does not."""
    top = max(target, observed, (max_batch or 0) + 1)
    top = max(top * 2 if not max_batch else top, 2)
    pows = _pow2_upto(top)
    if len(pows) > limit_rows - 3:
        step = math.ceil(len(pows) / (limit_rows - 3))
        pows = pows[::-1][::step][::-1]
        if 1 not in pows:
            pows.insert(0, 1)
    keep = set(pows) | {target, observed}
    if max_batch:
        keep |= {max_batch, max_batch + 1}
    return sorted(b for b in keep if 1 <= b <= MAX_SEARCH_BATCH)


# ---------------------------------------------------------------------------------------------------
# the plan (run in the probe, where the replay lives)

def make_plan(train: Callable[[int, int], dict], evaluate: Callable[[int], dict] | None, *,
              observed_batch: int, target_batch: int | None = None, eval_batch: int | None = None,
              capacity: int | None = None, headroom: float = HEADROOM, capability=None,
              facts: dict | None = None, budget_s: float = 120.0, search: bool = True,
              table: bool = True, precision: float = SEARCH_PRECISION) -> dict[str, Any]:
    """Replay at the batches the plan needs and assemble the ``memory.estimate`` record.

    ``train(batch, accumulation)`` and ``evaluate(batch)`` return replay points (see
    :meth:`diag.probe.replay.StepReplay.train`); they may raise, and the caller turns that into a
    ``skipped`` record. Without ``capacity`` only the table is made (no fit, no search).
    """
    t0 = time.perf_counter()
    facts = dict(facts or {})
    target = int(target_batch or observed_batch)
    usable = int(capacity * (1 - headroom)) if capacity else None
    cache: dict[tuple, dict] = {}
    notes: list[str] = []

    def over_budget() -> bool:
        return time.perf_counter() - t0 > budget_s

    failed: dict[tuple, str] = {}

    def fits(mode: str, batch: int, accumulation: int = 1) -> bool:
        """For the searches: a replay that fails at one batch size (a BatchNorm at batch 1, say)
        counts as not fitting, with a note."""
        key = (mode, batch, accumulation)
        if key in failed:
            return False
        try:
            return bool(point(mode, batch, accumulation)["fits"])
        except Exception as e:   # noqa: BLE001 - the replay's own error, reported as a note
            failed[key] = str(e)
            notes.append(f"the {mode} replay at batch {batch} failed ({e}); counted as not fitting")
            return False

    def point(mode: str, batch: int, accumulation: int = 1) -> dict:
        key = (mode, batch, accumulation)
        p = cache.get(key)
        if p is None:
            p = train(batch, accumulation) if mode == "train" else evaluate(batch)  # type: ignore[misc]
            p = {k: v for k, v in p.items() if k != "uses"}
            p.update(device_figures(p, facts, capability))
            if usable is not None:
                p["fits"] = p["device"] <= usable
            cache[key] = p
        return p

    def _guess(mode: str, b: int, accumulation: int) -> int | None:
        """Two replays (``b`` and ``2b`` or ``b/2``) give the slope; the search starts at the
        predicted batch."""
        if usable is None or over_budget():
            return None
        try:
            p1 = point(mode, b, accumulation)
            b2 = b * 2 if p1.get("fits") else max(1, b // 2)
            if b2 == b:
                return None
            p2 = point(mode, b2, accumulation)
        except Exception:   # noqa: BLE001 - the search reports failures itself
            return None
        return predict_batch([p1, p2], usable)

    at_target = point("train", target)
    out: dict[str, Any] = {
        "status": "ok", "observed_batch": int(observed_batch), "target_batch": target,
        "capacity": capacity, "headroom": headroom, "usable": usable, "capability": capability,
        "facts": facts, "at_target": at_target,
        "constants": {"cuda_context": CUDA_CONTEXT_BYTES, "allocator_cache_fraction": ALLOCATOR_CACHE_FRACTION,
                      "cudnn_workspace": CUDNN_WORKSPACE_BYTES, "cublas_workspace": cublas_workspace(capability),
                      "cublas_threads": CUBLAS_THREADS},
        "max_batch": None, "search": None, "accumulation": None, "eval": None,
    }
    if usable is not None and search:
        res = largest_fitting(lambda b: fits("train", b), target, should_stop=over_budget,
                              precision=precision, guess=_guess("train", target, 1))
        out["max_batch"] = res["max"]
        out["search"] = {"trials": len(res["trials"]), "first_fail": res["first_fail"],
                         "complete": res["complete"], "limit": MAX_SEARCH_BATCH, "precision": precision,
                         "method": "bisection from a bracket around the linear prediction"}
        if not res["complete"]:
            notes.append(f"the search stopped at its time budget ({budget_s:g} s); the largest batch is "
                         "a lower bound")
        if not at_target["fits"]:
            # micro-batches with accumulation keep gradients alive through the next forward
            acc = largest_fitting(lambda b: fits("train", b, 2), max(1, res["max"] or 1),
                                  limit=target, should_stop=over_budget, precision=precision,
                                  guess=_guess("train", max(1, res["max"] or 1), 2))
            if acc["max"] >= 1:
                plan = accumulation_plan(target, acc["max"])
                if plan is not None:
                    plan["max_micro_batch"] = acc["max"]
                    plan["at_micro"] = point("train", plan["micro_batch"], 2)
                    plan["snippet"] = accumulation_snippet(plan)
                    out["accumulation"] = plan
            else:
                out["accumulation"] = None
                notes.append("not even one sample per step fits: parameters, gradients and optimizer "
                             "state alone exceed the device")
    if evaluate is not None and not over_budget():
        start = int(eval_batch or target)
        ev: dict[str, Any] = {"batch": start, "at_batch": point("eval", start)}
        if usable is not None and search:
            res = largest_fitting(lambda b: fits("eval", b), start, should_stop=over_budget,
                                  precision=precision, guess=_guess("eval", start, 1))
            ev["max_batch"] = res["max"]
            ev["search"] = {"trials": len(res["trials"]), "first_fail": res["first_fail"],
                            "complete": res["complete"]}
        out["eval"] = ev
    shown: list[int] = []
    if table and not over_budget():
        for b in table_batches(observed_batch, target, out["max_batch"]):
            if over_budget():
                notes.append("the table was cut short by the time budget")
                break
            try:
                point("train", b)
                shown.append(b)
            except Exception as e:   # noqa: BLE001
                notes.append(f"the train replay at batch {b} failed ({e}); left out of the table")
    out["table"] = shown or sorted({p["batch"] for (m, _, a), p in cache.items() if m == "train" and a == 1})
    out["points"] = sorted((p for (m, _, a), p in cache.items() if m == "train" and a == 1),
                           key=lambda p: p["batch"])
    if out["eval"] is not None:
        out["eval"]["points"] = sorted((p for (m, _, _a), p in cache.items() if m == "eval"),
                                       key=lambda p: p["batch"])
    out["replays"] = len(cache)
    out["notes"] = notes
    out["seconds"] = round(time.perf_counter() - t0, 3)
    out["monotonic"] = _monotonic(out["points"])
    return out


def make_eval_plan(evaluate: Callable[[int], dict], *, observed_batch: int, eval_batch: int | None = None,
                   capacity: int | None = None, headroom: float = HEADROOM, capability=None,
                   facts: dict | None = None, budget_s: float = 120.0, search: bool = True,
                   precision: float = SEARCH_PRECISION) -> dict[str, Any]:
    """The ``memory.estimate`` record of an evaluation-only run (``mode: "eval"``): no training step to
    replay, so ``at_target`` is the evaluation forward at the observed batch and ``eval`` holds the
    largest evaluation batch that fits (bisection, as for training); the training fields are None."""
    t0 = time.perf_counter()
    facts = dict(facts or {})
    usable = int(capacity * (1 - headroom)) if capacity else None
    cache: dict[int, dict] = {}
    notes: list[str] = []

    def over_budget() -> bool:
        return time.perf_counter() - t0 > budget_s

    def point(batch: int) -> dict:
        p = cache.get(batch)
        if p is None:
            raw = evaluate(batch)
            facts.update({k: v or facts.get(k, False) for k, v in (raw.get("uses") or {}).items()})
            p = {k: v for k, v in raw.items() if k != "uses"}
            p.update(device_figures(p, facts, capability))
            if usable is not None:
                p["fits"] = p["device"] <= usable
            cache[batch] = p
        return p

    def fits(batch: int) -> bool:
        try:
            return bool(point(batch)["fits"])
        except Exception as e:   # noqa: BLE001 - the replay's own error, reported as a note
            notes.append(f"the eval replay at batch {batch} failed ({e}); counted as not fitting")
            return False

    start = int(eval_batch or observed_batch)
    at = point(start)
    ev: dict[str, Any] = {"batch": start, "at_batch": at, "max_batch": None, "search": None}
    if usable is not None and search:
        guess = None
        try:
            b2 = start * 2 if at.get("fits") else max(1, start // 2)
            if b2 != start:
                guess = predict_batch([at, point(b2)], usable)
        except Exception:   # noqa: BLE001
            guess = None
        res = largest_fitting(fits, start, should_stop=over_budget, precision=precision, guess=guess)
        ev["max_batch"] = res["max"]
        ev["search"] = {"trials": len(res["trials"]), "first_fail": res["first_fail"], "complete": res["complete"]}
        if not res["complete"]:
            notes.append(f"the search stopped at its time budget ({budget_s:g} s); the largest batch is a lower bound")
    ev["points"] = sorted(cache.values(), key=lambda p: p["batch"])
    return {
        "status": "ok", "mode": "eval", "observed_batch": int(observed_batch), "target_batch": start,
        "capacity": capacity, "headroom": headroom, "usable": usable, "capability": capability, "facts": facts,
        "at_target": at,
        "constants": {"cuda_context": CUDA_CONTEXT_BYTES, "allocator_cache_fraction": ALLOCATOR_CACHE_FRACTION,
                      "cudnn_workspace": CUDNN_WORKSPACE_BYTES, "cublas_workspace": cublas_workspace(capability),
                      "cublas_threads": CUBLAS_THREADS},
        "max_batch": None, "search": None, "accumulation": None, "eval": ev, "table": [], "points": [],
        "replays": len(cache), "notes": notes, "seconds": round(time.perf_counter() - t0, 3), "monotonic": True,
    }


def _monotonic(points: list[dict]) -> bool:
    peaks = [p["peak"] for p in points]
    return all(a <= b for a, b in zip(peaks, peaks[1:]))
