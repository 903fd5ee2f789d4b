"""``diag memory``: where the memory of a training step goes and what batch fits on a GPU, estimated
without that GPU (a fake-tensor replay of one real step)."""
from __future__ import annotations

import json
import sys

from diag.commands._common import add_run_arguments, positive_float, positive_int, run_config
from diag.errors import DiagError, ExitCode

DESCRIPTION = """\
Run a training script, unchanged, for one step under diag's probe; capture the model, the optimizer
and the shapes of one input batch; replay the step (forward, backward, optimizer step) on fake
tensors at other batch sizes, without allocating their memory; print the peak by category
(parameters, gradients, optimizer state, activations, other), the largest batch that fits on the
target GPU with headroom (bisection), the micro-batch and gradient-accumulation steps that keep your
effective batch when it does not fit, and the largest evaluation batch under inference_mode.
Works on a laptop without the target GPU. The script's output goes to stderr."""

EPILOG = """\
examples:
  diag memory --script train.py --gpu a100-80gb                 plan for an A100 80GB (catalogue)
  diag memory --script train.py --memory 24GiB -- --batch-size 8
  diag memory --script train.py --gpu h100 --batch 512 -- --batch-size 4
                          run 1 step at batch 4 here, plan for batch 512 on an H100
  diag memory --script train.py --gpu l4 --format json > plan.json
  diag memory --from .diag/runs/<id>/evidence.json               print a saved plan again
  diag memory --script train.py --gpu h100 --shard fsdp --world 8
                          one rank of an 8-GPU FSDP (fully_shard) job: what it holds, the largest
                          batch per rank, the world size needed when one GPU is not enough
  diag memory --script train.py --gpu a100-80gb --shard zero3 --mixed-precision bf16
                          DeepSpeed ZeRO-3 in bf16, at the smallest world size that fits
  diag memory --from .diag/runs/<id> --shard zero2 --world 4      re-plan a saved run; runs nothing

exit codes: 0 the batch fits (or no device was given) · 1 it does not fit, or the step could not be
            replayed (the reason is printed) · 2 usage or bad input · 3 the script failed before a
            batch could be captured · 130 interrupted
"""

# compute capability by catalogue id prefix (for the cuBLAS workspace allowance)
_CAPABILITY = (("t4", [7, 5]), ("v100", [7, 0]), ("a100", [8, 0]), ("a10", [8, 6]), ("l40", [8, 9]),
               ("l4", [8, 9]), ("rtx-3090", [8, 6]), ("rtx-4090", [8, 9]), ("h100", [9, 0]), ("h200", [9, 0]),
               ("gh200", [9, 0]), ("b200", [10, 0]), ("b100", [10, 0]))


def add_arguments(p) -> None:
    # one step of one process, replayed on fake tensors: no GPU sampling, no torchrun options
    add_run_arguments(p, gpus=False, torchrun=False)
    for action in p._actions:
        if action.dest == "steps":
            action.help = "stop the script after N training steps (default here: 1; the replay runs after step 1)"
    t = p.add_argument_group("the target")
    t.add_argument("--gpu", metavar="NAME", help="a GPU from the catalogue (diag cost --list-gpus), e.g. a100-80gb, "
                   "h100, l4, rtx-4090")
    t.add_argument("--memory", metavar="SIZE", help="device memory instead of --gpu, e.g. 24GiB, 80GB, 16000MiB")
    t.add_argument("--batch", type=positive_int, metavar="N",
                   help="the training batch to plan for (default: the one the script used)")
    t.add_argument("--eval-batch", type=positive_int, metavar="N",
                   help="the evaluation batch to start the eval search from (default: the training batch)")
    t.add_argument("--headroom", type=_fraction, default=0.10, metavar="F",
                   help="memory kept free: 0.1 or 10%% (default 10%%, the memory.headroom check's line)")
    t.add_argument("--budget", type=positive_float, default=120.0, metavar="SECONDS",
                   help="time allowed for the replays (default 120)")
    s = p.add_argument_group("sharded training (FSDP, DeepSpeed ZeRO; docs/memory.md, 'Sharded training')")
    s.add_argument("--shard", metavar="STRATEGY", type=_strategy,
                   help="plan one rank of a sharded job: ddp, zero1, zero2, zero3, fsdp (FULL_SHARD, FSDP2 "
                        "fully_shard), shard-grad-op, hybrid. Run the script unsharded (one process); diag "
                        "divides what it holds as the strategy does")
    s.add_argument("--world", type=positive_int, metavar="N",
                   help="ranks of the sharded job (default: the smallest number that fits the target)")
    s.add_argument("--gpus-per-node", type=positive_int, default=8, metavar="N",
                   help="GPUs per node: the shard group of --shard hybrid (default 8)")
    s.add_argument("--mixed-precision", choices=("bf16", "fp16"), metavar="DTYPE",
                   help="bf16 or fp16: DeepSpeed's 16-bit mode (2-byte weights and gradients, an fp32 master "
                        "copy in the optimizer) or FSDP's MixedPrecisionPolicy(param_dtype=...) "
                        "(gathered copies in 16 bits)")
    s.add_argument("--unit-params", type=_count, metavar="N",
                   help="parameters of the largest FSDP unit (e.g. 85M: one transformer block), what "
                        "FSDP gathers at once (default: the model divided by its repeated blocks)")
    p.add_argument("--from", dest="from_", metavar="EVIDENCE",
                   help="print the plan saved in an evidence.json (or run directory); runs nothing")
    p.add_argument("--format", choices=("text", "json"), default="text")


def _fraction(text: str) -> float:
    import argparse

    s = text.strip()
    try:
        v = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction like 0.1 or 10%, got {text!r}") from None
    if not 0 <= v < 0.9:
        raise argparse.ArgumentTypeError(f"must be between 0 and 90%, got {text}")
    return v


def _strategy(text: str) -> str:
    import argparse

    from diag.memory.sharded import normalise_strategy

    try:
        return normalise_strategy(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _count(text: str) -> int:
    """A parameter count: 85000000, 85M, 1.5B, 350k."""
    import argparse

    t = text.strip().replace("_", "").replace(",", "")
    mult = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}.get(t[-1:].lower(), 1)
    try:
        v = float(t[:-1] if mult != 1 else t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of parameters like 85M or 1.5B, got {text!r}") from None
    if not v >= 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 parameter, got {text}")
    return int(v)


def shard_spec(args) -> dict | None:
    """The --shard options as build_memory_plan takes them; None without --shard."""
    strategy = getattr(args, "shard", None)
    extra = [f for f, d in (("--world", "world"), ("--mixed-precision", "mixed_precision"),
                            ("--unit-params", "unit_params")) if getattr(args, d, None)]
    if strategy is None:
        if extra:
            raise DiagError(f"{', '.join(extra)} describe a sharded job: give --shard STRATEGY too "
                            "(fsdp, zero1, zero2, zero3, shard-grad-op, hybrid, ddp)")
        return None
    return {"strategy": strategy, "world": getattr(args, "world", None),
            "gpus_per_node": getattr(args, "gpus_per_node", 8), "mixed": getattr(args, "mixed_precision", None),
            "unit_params": getattr(args, "unit_params", None)}


def resolve_target(args) -> dict | None:
    """{name, memory, source, capability} for --gpu / --memory; None when neither is given."""
    from diag.memory.units import fmt_bytes, parse_size

    if args.gpu and args.memory:
        raise DiagError("give either --gpu NAME or --memory SIZE, not both")
    if args.memory:
        n = parse_size(args.memory)
        return {"name": f"a {fmt_bytes(n)} device", "memory": n, "source": "--memory", "capability": None}
    if args.gpu:
        from diag.cost.catalog import load_catalog

        gpu = load_catalog().get(args.gpu)
        if not gpu.memory_gb:
            raise DiagError(f"the catalogue has no memory size for {gpu.name}; give --memory SIZE instead")
        per = max(1, int(gpu.devices_per_card or 1))
        n = int(gpu.memory_gb * 1e9 / per)
        cap = next((c for prefix, c in _CAPABILITY if gpu.id.startswith(prefix)), None)
        return {"name": gpu.name, "id": gpu.id, "memory": n,
                "source": f"catalogue: {gpu.memory_gb:g} GB" + (f" per card / {per} devices" if per > 1 else ""),
                "capability": cap}
    return None


def run(args) -> int:
    if args.from_ and args.script:
        raise DiagError("give either --script (run a script) or --from (a saved plan), not both")
    if not args.from_ and not args.script:
        raise DiagError("nothing to plan: give --script PATH (and --gpu NAME or --memory SIZE)",
                        hint="diag memory --help shows the options")
    target = resolve_target(args)
    shard = shard_spec(args)
    if shard and not shard.get("world") and target is None and not args.from_:
        raise DiagError("--shard needs --world N, or a target device (--gpu NAME or --memory SIZE) to find "
                        "the world size that fits")
    if args.from_ and target is not None:
        raise DiagError("--from prints the plan saved in a run; to plan for another device, run "
                        "diag memory --script again with --gpu or --memory")
    if args.from_:
        from diag.evidence import load_evidence
        from diag.memory.verdict import build_memory_plan

        ev = load_evidence(args.from_)
        if shard is not None:
            from diag.memory.verdict import add_sharded

            plan = dict(ev.memory_plan) if ev.memory_plan else build_memory_plan(ev, target)
            add_sharded(plan, ev, shard)
        else:
            plan = ev.memory_plan or build_memory_plan(ev, target)
        return _emit(args, ev, plan)
    return _run_script(args, target, shard)


def _run_script(args, target: dict | None, shard: dict | None = None) -> int:
    import os

    from diag.memory.verdict import build_memory_plan
    from diag.runner import Run

    cfg = run_config(args, echo="stderr")
    if cfg.steps is None:
        cfg.steps = 1
    env = {"DIAG_MEMORY_ESTIMATE": "plan", "DIAG_MEMORY_HEADROOM": str(args.headroom),
           "DIAG_MEMORY_BUDGET_S": str(args.budget)}
    disabled = [x for x in os.environ.get("DIAG_PROBE_DISABLE", "").split(",") if x.strip()]
    env["DIAG_PROBE_DISABLE"] = ",".join(disabled + ["flopcounter"])   # no FLOP counting in this step
    if target:
        env["DIAG_MEMORY_CAPACITY"] = str(target["memory"])
        env["DIAG_MEMORY_TARGET_NAME"] = target["name"]
        if target.get("capability"):
            env["DIAG_MEMORY_CAPABILITY"] = ".".join(str(x) for x in target["capability"])
    if args.batch:
        env["DIAG_MEMORY_BATCH"] = str(args.batch)
    if args.eval_batch:
        env["DIAG_MEMORY_EVAL_BATCH"] = str(args.eval_batch)
    cfg.env.update(env)
    run = Run(cfg)
    from diag.sanitize import for_terminal

    sys.stderr.write(f"diag: running {for_terminal(run.script)} for {cfg.steps} step(s) under the probe "
                     f"(run directory {run.run_dir})\n")
    sys.stderr.flush()
    run.start()
    try:
        run.wait()
    except KeyboardInterrupt:
        ev = run.evidence
        ev.run.status = "interrupted"
        run.save()
        return ExitCode.INTERRUPTED
    ev = run.evidence
    if target is None:
        dev = (ev.primary.memory or {}).get("device") if ev.ranks else None
        if dev:
            target = {"name": dev.get("name"), "memory": dev.get("total"), "source": "the GPU the script ran on",
                      "capability": dev.get("capability")}
    plan = build_memory_plan(ev, target, shard)
    with run.lock:
        ev.memory_plan = plan
    run.save()
    code = _emit(args, ev, plan)
    if run.disk_error:       # what was observed is shown above; why the run ended, in one sentence
        raise DiagError(run.disk_error)
    return code


def exit_code(ev, plan: dict) -> int:
    sh = plan.get("sharded") or {}
    if plan["status"] == "ok" and sh.get("asked"):
        # asked for a sharded plan: its verdict is the one that counts (one rank of the job)
        if sh.get("status") != "ok":
            return ExitCode.FINDINGS
        return ExitCode.FINDINGS if sh.get("fits") is False else ExitCode.OK
    if plan["status"] == "ok":
        return ExitCode.FINDINGS if plan["verdict"].get("fits") is False else ExitCode.OK
    if ev.run.status in ("failed", "oom", "killed"):
        return ExitCode.SCRIPT_FAILED      # the script failed before a batch could be replayed
    return ExitCode.FINDINGS


def _emit(args, ev, plan: dict) -> int:
    code = exit_code(ev, plan)
    if args.format == "json":
        out = {"schema_version": 1, "tool": "diag memory",
               "run": {"id": ev.run.id, "script": ev.run.script, "status": ev.run.status,
                       "run_dir": ev.run.run_dir},
               "exit_code": code, "plan": plan}
        sys.stdout.write(json.dumps(out, indent=2, default=str) + "\n")
    else:
        from diag.commands._common import stdout_console
        from diag.report.memory import render_plan

        render_plan(plan, stdout_console(soft_wrap=False), script=ev.run.script)
        if ev.run.status in ("failed", "oom") and plan["status"] != "ok":
            sys.stderr.write(f"diag: the script {ev.run.status}; its output is in {ev.run.log_path}\n")
    return code
