"""Options shared by the commands that run a script (check, tui, memory)."""
from __future__ import annotations

import argparse
import math


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


def add_run_arguments(p: argparse.ArgumentParser, script_required: bool = False) -> None:
    g = p.add_argument_group("running a script (its own arguments go after --)")
    g.add_argument("--script", metavar="PATH", required=script_required,
                   help="the training script to run, unchanged, under the probe")
    g.add_argument("--steps", type=positive_int, metavar="N",
                   help="stop the script after N training steps (default: run to its end)")
    g.add_argument("--max-time", type=positive_float, metavar="SECONDS",
                   help="stop the script after this many seconds (default: no limit)")
    g.add_argument("--run-dir", metavar="DIR",
                   help="where to write evidence.json, log.txt and the report "
                        "(default: .diag/runs/<timestamp-id>/)")
    g.add_argument("--simulate-gpus", type=gpu_scenario, metavar="SCENARIO",
                   help="use simulated GPUs instead of NVML (also DIAG_SIMULATE_GPUS); every report then "
                        "says 'simulated'. Scenarios: healthy-8, imbalance, lost, none, mig, throttling, "
                        "starved, container (diag gpus --list-scenarios)")
    g.add_argument("--gpu-interval", type=gpu_interval, default=1.0, metavar="SECONDS",
                   help="seconds between GPU samples while the script runs (default: 1; at least 0.1)")


def run_config(args, echo: str | None):
    from diag.runner import RunConfig

    cfg = RunConfig(script=args.script, args=list(getattr(args, "script_args", []) or []),
                    steps=args.steps, max_time=args.max_time, run_dir=args.run_dir, echo=echo,
                    simulate_gpus=getattr(args, "simulate_gpus", None),
                    gpu_interval=getattr(args, "gpu_interval", None) or 1.0)
    return cfg
