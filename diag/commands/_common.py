"""Options shared by the commands that run a script (check, tui, memory)."""
from __future__ import annotations

import argparse
import math

from diag.errors import DiagError


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {v}")
    return v


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return v


def gpu_interval(text: str) -> float:
    """--gpu-interval: seconds between GPU samples, at least 0.1."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(v) or v < 0.1:
        raise argparse.ArgumentTypeError(f"must be at least 0.1 s (got {text}); NVML refreshes most "
                                         "counters only a few times per second")
    return v


def gpu_scenario(text: str) -> str:
    """--simulate-gpus: a scenario name of diag.gpu.simulated."""
    from diag.gpu.simulated import SCENARIOS

    key = text.strip().lower()
    if key not in SCENARIOS:
        raise argparse.ArgumentTypeError(f"unknown scenario {text!r} (choose one of: {', '.join(SCENARIOS)})")
    return key


def add_run_arguments(p: argparse.ArgumentParser, script_required: bool = False, gpus: bool = True,
                      torchrun: bool = True) -> None:
    """The options of a command that runs a script. ``gpus``: GPU sampling (--simulate-gpus,
    --gpu-interval); ``torchrun``: the multi-process options. A command that runs one step of one
    process (diag memory) has neither."""
    g = p.add_argument_group("running a script (its own arguments go after --)")
    g.add_argument("--script", metavar="PATH", required=script_required,
                   help="the training script to run, unchanged, under the probe")
    g.add_argument("--steps", type=positive_int, metavar="N",
                   help="stop the script after N training steps (evaluation steps in a script that only "
                        "evaluates; default: run to its end)")
    g.add_argument("--max-time", type=positive_float, metavar="SECONDS",
                   help="stop the script after this many seconds (default: no limit)")
    g.add_argument("--run-dir", metavar="DIR",
                   help="where to write evidence.json, log.txt and the report "
                        "(default: .diag/runs/<timestamp-id>/; as a task of a Slurm step: the job's shared "
                        "directory, default $SLURM_SUBMIT_DIR/.diag/runs/slurm-<job>.<step>/)")
    if gpus:
        g.add_argument("--simulate-gpus", type=gpu_scenario, metavar="SCENARIO",
                       help="use simulated GPUs instead of NVML (also DIAG_SIMULATE_GPUS); every report then "
                            "says 'simulated'. Scenarios: healthy-8, imbalance, lost, none, mig, throttling, "
                            "starved, container (diag gpus --list-scenarios)")
        g.add_argument("--gpu-interval", type=gpu_interval, default=1.0, metavar="SECONDS",
                       help="seconds between GPU samples while the script runs (default: 1; at least 0.1)")
    if torchrun:
        add_torchrun_arguments(p)


def _argtype(parse):
    def convert(text):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    convert.__name__ = parse.__name__
    return convert


def _non_negative_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return v


def add_torchrun_arguments(p: argparse.ArgumentParser) -> None:
    """Multi-process runs: the script is launched through torch.distributed.run (torchrun) with
    the probe in every rank; these options are torchrun's own, passed through (docs/distributed.md)."""
    from diag.torchrun import parse_endpoint, parse_nnodes, parse_nproc, parse_port

    g = p.add_argument_group("multi-process runs (launched through torchrun, the probe in every rank)")
    g.add_argument("--nproc-per-node", type=_argtype(parse_nproc), metavar="N",
                   help="run the script under torchrun with N processes on this node "
                        "(a number, or cpu, gpu, auto, xpu as torchrun accepts)")
    g.add_argument("--nnodes", type=_argtype(lambda t: (parse_nnodes(t), t)[1]), metavar="N|MIN:MAX",
                   help="number of nodes (torchrun); run diag on every node, each writes its own run "
                        "directory; judge them together with diag check --from A --from B")
    g.add_argument("--node-rank", type=_non_negative_int, metavar="N", help="this node's rank (torchrun)")
    g.add_argument("--master-addr", metavar="HOST", help="address of the node with --node-rank 0 (torchrun)")
    g.add_argument("--master-port", type=_argtype(parse_port), metavar="PORT",
                   help="a free port on the master node (torchrun)")
    g.add_argument("--rdzv-endpoint", type=_argtype(parse_endpoint), metavar="HOST[:PORT]",
                   help="rendezvous endpoint (torchrun; with --rdzv-backend c10d)")
    g.add_argument("--rdzv-backend", metavar="NAME", help="rendezvous backend, e.g. c10d (torchrun)")
    g.add_argument("--rdzv-id", metavar="ID", help="job id shared by every node (torchrun)")
    g.add_argument("--rdzv-conf", metavar="K=V,...", help="rendezvous configuration (torchrun)")
    g.add_argument("--max-restarts", type=_non_negative_int, metavar="N",
                   help="restarts of the worker group after a failure (torchrun; default 0)")
    g.add_argument("--local-addr", metavar="ADDR", help="this node's address (torchrun)")
    g.add_argument("--standalone", action="store_true",
                   help="single-node job with a local rendezvous on a free port (torchrun)")
    g.add_argument("--torchrun-arg", action="append", default=[], metavar="ARG",
                   help="any other torchrun option, passed as is (repeatable), e.g. "
                        "--torchrun-arg=--monitor-interval=1")


def torchrun_config(args) -> tuple:
    """(nproc_per_node, torchrun_args) from the parsed options."""
    from diag.torchrun import TORCHRUN_OPTIONS

    out = []
    for dest, flag in TORCHRUN_OPTIONS.items():
        v = getattr(args, dest, None)
        if v is not None:
            out.append(f"{flag}={v}")
    if getattr(args, "standalone", False):
        out.append("--standalone")
    out.extend(getattr(args, "torchrun_arg", None) or [])
    return getattr(args, "nproc_per_node", None), out


def run_config(args, echo: str | None):
    from diag.runner import RunConfig

    cfg = RunConfig(script=args.script, args=list(getattr(args, "script_args", []) or []),
                    steps=args.steps, max_time=args.max_time, run_dir=args.run_dir, echo=echo,
                    simulate_gpus=getattr(args, "simulate_gpus", None),
                    gpu_interval=getattr(args, "gpu_interval", None) or 1.0)
    cfg.nproc_per_node, cfg.torchrun_args = torchrun_config(args)
    return cfg


def stdout_console(**kw):
    """A rich Console on stdout whose closed pipe (``diag check ... | head -1``) raises BrokenPipeError,
    which diag's entry point turns into a quiet exit 141 (rich alone would exit 1, silently)."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return _Console(**kw)


def write_report(path: str, text: str) -> None:
    """Write a report file (-o, --html); an OS error is one sentence, exit 2."""
    try:
        with open(path, "w", encoding="utf-8", errors="replace") as f:   # (a lone surrogate: U+FFFD)
            f.write(text)
    except OSError as e:
        raise DiagError(f"cannot write the report to {path!r}: {e.strerror}") from None
