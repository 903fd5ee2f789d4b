"""Parallelism checks: nn.DataParallel, DistributedDataParallel with gradient accumulation, and
DDP's find_unused_parameters."""
from __future__ import annotations

from diag.checks.api import check, median, Severity

from ._perf import guide, short_file, training_sites
from ._framework import framework_entry, framework_of, knob
from ._util import loc, ms, pct

DP_DOCS = ("https://pytorch.org/docs/stable/notes/cuda.html"
           "#use-nn-parallel-distributeddataparallel-instead-of-multiprocessing-or-nn-dataparallel")
NO_SYNC_WARN_SHARE = 0.02   # avoidable all-reduce wait >= 2% of the step: warning (always with > 1 rank)


def _ddp_models(r) -> list:
    return [m for m in r.models if "DistributedDataParallel" in (m.wrappers or []) or m.ddp]


def _ddp_records(r) -> dict:
    """distributed.ddp.models (recorded by diag.probe.distributed), by model id."""
    d = (r.distributed or {}).get("ddp") or {}
    recs = d.get("models") or []
    return {rec.get("model"): rec for rec in recs if isinstance(rec, dict)}


NO_DDP = "No DistributedDataParallel model in this run (single-process training)."


@check(id="parallel.data-parallel", title="nn.DataParallel instead of DDP", severity="warning",
       needs=["ranks.models.wrappers", "ranks.extras.data_parallel", "environment.device_count"],
       tags=["parallel", "gpu"], docs=guide("use-efficient-data-parallel-backend"))
def parallel_data_parallel(ctx):
    """A model wrapped in single-process `nn.DataParallel`. Over two or more GPUs (warning) it
    replicates the model and scatters the batch every step from one Python thread per GPU (the GIL),
    and gathers outputs on GPU 0 (which holds more memory than the others); DistributedDataParallel
    runs one process per GPU and overlaps the gradient all-reduce with backward. Over one device or
    none (info) the wrapper only adds a layer. Passes when no model is wrapped."""
    ev = ctx.evidence
    r = ev.primary
    if not r.models:
        yield ctx.skip("No model forward was observed.")
        return
    dp = [m for m in r.models if "DataParallel" in (m.wrappers or [])]
    if not dp:
        yield ctx.passed("No model is wrapped in nn.DataParallel.", title="No nn.DataParallel")
        return
    m = dp[0]
    info = ((r.extras or {}).get("data_parallel") or {}).get(str(m.id)) or {}
    ids = info.get("device_ids")
    n = len(ids) if ids is not None else (ev.environment.device_count if ev.environment.cuda_available else 0)
    site = next((s for s in r.forwards if s.model == m.id and s.location), None)
    numbers = {"model": m.cls, "device_ids": ids, "devices": n, "world_size": r.world_size,
               "gpu_count": ev.environment.device_count}
    snippet = ("# torchrun --nproc_per_node=NUM_GPUS train.py\n"
               "dist.init_process_group(\"nccl\")\nlocal_rank = int(os.environ[\"LOCAL_RANK\"])\n"
               "torch.cuda.set_device(local_rank)\n"
               "model = DistributedDataParallel(model.to(local_rank), device_ids=[local_rank])\n"
               "sampler = DistributedSampler(dataset)  # each rank reads its own shard")
    if n >= 2:
        yield ctx.finding(
            severity=Severity.WARNING,
            message=f"{m.cls} is wrapped in nn.DataParallel over {n} GPUs"
                    + (f" ({short_file(site.location)})" if site else "")
                    + ": every step replicates the model, scatters the batch and gathers the outputs on GPU 0 "
                      "from a single process.",
            evidence=numbers,
            why="DataParallel drives all GPUs from one Python process (threads contend for the GIL), "
                "copies the weights to every GPU each step, and gathers outputs and loss on GPU 0, "
                "whose memory fills first. DistributedDataParallel uses a process per GPU and overlaps the "
                "gradient all-reduce with backward; PyTorch recommends it even on one machine.",
            fix="Launch one process per GPU with torchrun and wrap the model in DistributedDataParallel.",
            snippet=snippet, location=loc(site.location) if site else None,
        )
        return
    yield ctx.finding(
        severity=Severity.INFO,
        message=f"{m.cls} is wrapped in nn.DataParallel over "
                f"{'no GPU' if n == 0 else 'a single device'}: with fewer than two GPUs it "
                "runs the module unchanged and only adds a wrapper; when you scale out, use "
                "DistributedDataParallel rather than DataParallel.",
        evidence=numbers,
        why="DataParallel's single-process design (GIL, per-step replication, outputs gathered on GPU 0) "
            "scales worse than DistributedDataParallel on every multi-GPU machine.",
        fix="Drop the nn.DataParallel wrapper here; for several GPUs use torchrun + DistributedDataParallel.",
        snippet=snippet, location=loc(site.location) if site else None,
    )


@check(id="ddp.no-sync-accumulation", title="Gradient accumulation all-reduces every micro-step",
       severity="warning", needs=["ranks.steps.n_backward", "ranks.steps.extra.ddp_sync", "ranks.distributed"],
       tags=["parallel", "distributed"],
       docs=guide("skip-unnecessary-all-reduce-if-training-with-distributeddataparallel-and-gradient-accumulation"))
def ddp_no_sync_accumulation(ctx):
    """Gradient accumulation (several backwards per optimizer step) under DistributedDataParallel
    without `no_sync()` on the first N-1 micro-steps: every micro-step all-reduces the gradients,
    N-1 times more communication than needed. Counted from DDP's require_backward_grad_sync at each
    training forward. The saving is sized with the measured gradient all-reduce wait per micro-step:
    warning with more than one rank or when the avoidable wait is >= 2% of the step; info for a
    single rank below that. Skipped in single-process runs without DDP."""
    ev = ctx.evidence
    r = ev.primary
    ddp = _ddp_models(r)
    if not ddp:
        yield ctx.skip(NO_DDP)
        return
    steps = r.timed_steps() or r.steps
    if not steps:
        yield ctx.skip("No training step was observed.")
        return
    backwards = [s.n_backward for s in steps]
    accum = [s for s in steps if s.n_backward > 1]
    if not accum:
        yield ctx.passed(f"Each optimizer step follows {int(median(backwards))} backward: no accumulation, "
                     "nothing to skip.", backwards_per_step=median(backwards), title="One backward per optimizer step")
        return
    recorded = [s for s in accum if isinstance(s.extra, dict) and "ddp_sync" in s.extra]
    if not recorded:
        yield ctx.skip("Gradient accumulation was seen, but DDP's sync state per forward was not "
                                  "recorded (the distributed probe extension did not run).",
                      accumulation_steps=len(accum))
        return
    avoid = [max(int(s.extra.get("ddp_sync", 0)) - 1, 0) for s in recorded]
    syncs = [int(s.extra.get("ddp_sync", 0)) for s in recorded]
    nosync = [int(s.extra.get("ddp_no_sync", 0)) for s in recorded]
    micro = median([s.n_backward for s in recorded])
    numbers = {"accumulation_steps": len(recorded), "backwards_per_step": micro,
               "allreduces_per_step": median(syncs), "no_sync_forwards_per_step": median(nosync),
               "avoidable_allreduces_per_step": median(avoid), "world_size": r.world_size}
    if sum(avoid) == 0:
        yield ctx.passed(f"{micro:g} backwards per optimizer step with one gradient all-reduce: the other "
                     "micro-steps ran under no_sync().", **numbers, title="no_sync() used for accumulation")
        return
    comm = (r.distributed or {}).get("comm") or {}
    fwd_sync = ((r.distributed or {}).get("ddp") or {}).get("forwards_sync")
    wait = comm.get("grad_sync_wait_s")
    per_allreduce = wait / fwd_sync if wait is not None and fwd_sync else None
    step_s = median([s.total_s for s in recorded])
    saving = per_allreduce * median(avoid) if per_allreduce is not None else None
    share = saving / step_s if saving is not None and step_s > 0 else None
    numbers.update(allreduce_wait_s=round(per_allreduce, 7) if per_allreduce is not None else None,
                   avoidable_wait_per_step_s=round(saving, 7) if saving is not None else None,
                   avoidable_share=round(share, 4) if share is not None else None, step_s=round(step_s, 6))
    multi = r.world_size > 1 or ev.multi_rank
    sev = Severity.WARNING if multi or share is None or share >= NO_SYNC_WARN_SHARE else Severity.INFO
    size = (f"; the measured all-reduce wait makes that {ms(saving)} per step ({pct(share)} of the step)"
            if share is not None else "")
    if not multi:
        size += "; with one rank the all-reduce is cheap, but with N ranks each one crosses the network"
    site = next((s for s in training_sites(r) if s.model in {m.id for m in ddp} and s.location), None)
    yield ctx.finding(
        severity=sev,
        message=f"Each optimizer step accumulates {micro:g} backwards and all-reduces the gradients "
                f"{median(syncs):g} times: {median(avoid):g} all-reduce(s) per step could be skipped with "
                f"no_sync(){size}.",
        evidence=numbers,
        why="DDP averages gradients across ranks after every backward unless the forward ran under "
            "no_sync(); with accumulation only the last micro-step's all-reduce is needed.",
        fix="Run the first N-1 micro-steps under model.no_sync(); the last one (outside it) all-reduces "
            "the accumulated gradients.",
        snippet=("for i, (x, y) in enumerate(loader):\n"
                 "    last = (i + 1) % accum == 0\n"
                 "    with (contextlib.nullcontext() if last else model.no_sync()):\n"
                 "        loss = loss_fn(model(x), y) / accum\n"
                 "        loss.backward()\n"
                 "    if last:\n        opt.step(); opt.zero_grad()"),
        location=loc(site.location) if site else None,
    )


@check(id="ddp.find-unused-parameters", title="find_unused_parameters=True with no unused parameter",
       severity="warning", needs=["ranks.models.ddp", "ranks.distributed.ddp.models"],
       tags=["parallel", "distributed"],
       docs=guide("match-the-order-of-layers-in-constructors-and-during-the-execution-if-using-"
                  "distributeddataparallel-find-unused-parameters-true"))
def ddp_find_unused_parameters(ctx):
    """DistributedDataParallel built with `find_unused_parameters=True` while every trainable
    parameter received a gradient in the checked forwards (the autograd graph of the first training
    forwards reached all of them): DDP then walks the graph every iteration for nothing and builds
    buckets in constructor order, which can expose the all-reduce. Passes when some parameter was
    really unused. Skipped without DDP."""
    ev = ctx.evidence
    r = ev.primary
    ddp = _ddp_models(r)
    if not ddp:
        yield ctx.skip(NO_DDP)
        return
    recs = _ddp_records(r)
    flagged = []
    for m in ddp:
        rec = recs.get(m.id) or {}
        fup = rec.get("find_unused_parameters", (m.ddp or {}).get("find_unused_parameters"))
        flagged.append((m, rec, bool(fup)))
    on = [(m, rec) for m, rec, fup in flagged if fup]
    if not on:
        yield ctx.passed("DDP runs with find_unused_parameters=False.", title="find_unused_parameters off")
        return
    m, rec = on[0]
    if not rec or not rec.get("forwards_checked"):
        yield ctx.skip("DDP runs with find_unused_parameters=True, but which parameters got a "
                                  "gradient was not recorded (the distributed probe extension did not run "
                                  "or no training forward was checked).")
        return
    unused = rec.get("unused_params")
    numbers = {"model": m.cls, "params": rec.get("params"), "unused_params": unused,
               "forwards_checked": rec.get("forwards_checked"), "unused_names": rec.get("unused_names", [])}
    if unused:
        yield ctx.passed(f"{unused} parameter(s) of {m.cls} got no gradient in the checked forwards "
                     f"(e.g. {', '.join(rec.get('unused_names', [])[:3])}): find_unused_parameters=True is "
                     "required.", **numbers, title="find_unused_parameters is needed")
        return
    site = next((s for s in r.forwards if s.model == m.id and s.location), None)
    spoken = knob(framework_of(ev), "find_unused_parameters")
    yield ctx.finding(
        severity=Severity.WARNING,
        message=f"DDP wraps {m.cls} with find_unused_parameters=True, but all {rec.get('params')} trainable "
                f"parameters received a gradient in the {rec.get('forwards_checked')} checked forward(s).",
        evidence=numbers,
        why="With find_unused_parameters=True DDP traverses the autograd graph after every forward to mark "
            "unused parameters, and forms buckets from the constructor order rather than the backward "
            "order, which can delay the all-reduce.",
        fix=(spoken[0] + " If some iterations skip parameters (conditional branches), keep it on.") if spoken else
            "Construct DDP with find_unused_parameters=False (the default). If some iterations skip "
            "parameters (conditional branches), keep it on, or use static_graph=True when the set is fixed.",
        snippet=spoken[1] if spoken else
            "model = DistributedDataParallel(model, device_ids=[local_rank])  # find_unused_parameters=False",
        location=loc(site.location) if site else loc(framework_entry(ev)),
    )
