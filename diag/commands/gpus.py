"""``diag gpus``: the GPUs now, per device and per process, plus host CPU and RAM (like gpustat).

Never imports torch or textual: NVML (nvidia-ml-py), psutil and rich only, inside run().
"""
from __future__ import annotations

import argparse
import sys
import time

from diag.errors import DiagError, ExitCode

DESCRIPTION = """\
Show the GPUs now: per device utilisation, memory, temperature, power, clocks, PCIe traffic, fan and
throttle reasons; per process pid, user, GPU memory and command; plus the host's CPU and RAM.
Values the driver cannot give are shown as N/A. Simulated GPUs (--simulate-gpus or
DIAG_SIMULATE_GPUS) are labelled "simulated" everywhere."""

EPILOG = """\
examples:
  diag gpus                               one table, now
  diag gpus --json | jq '.devices[].gpu_util'
  diag gpus --watch 0.5                   refresh every 0.5 s until Ctrl-C
  diag gpus --watch --json --count 10     ten JSON documents, one per line (for logging)
  diag gpus --simulate-gpus imbalance     try it without a GPU (diag gpus --list-scenarios)
  CUDA_VISIBLE_DEVICES=2,3 diag gpus --visible-only

JSON schema: docs/gpus.md ("diag gpus --json"). Exit codes: 0 shown · 2 bad input, or no NVIDIA
driver/library (one sentence and a hint on stderr) · 130 interrupted (not with --watch: Ctrl-C ends it).
"""

JSON_SCHEMA = "diag.gpus/1"
SIM_START_S = 120.0     # a one-shot simulated view shows the steady state, 2 minutes into the scenario


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print a JSON document (schema in docs/gpus.md)")
    p.add_argument("--watch", nargs="?", const=1.0, default=None, type=float, metavar="INTERVAL",
                   help="refresh every INTERVAL seconds (default 1; at least 0.1) until Ctrl-C")
    p.add_argument("--count", type=int, metavar="N", help="with --watch: stop after N refreshes")
    p.add_argument("--simulate-gpus", metavar="SCENARIO",
                   help="show simulated GPUs (also DIAG_SIMULATE_GPUS); see --list-scenarios")
    p.add_argument("--list-scenarios", action="store_true", help="list the simulation scenarios and exit")
    p.add_argument("--visible-only", action="store_true",
                   help="only the GPUs CUDA_VISIBLE_DEVICES makes visible, numbered as CUDA numbers them")
    p.add_argument("--no-processes", action="store_true", help="do not list the processes on the GPUs")
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)   # simulated values: another seed


def run(args) -> int:
    from diag.gpu import check_interval, get_provider
    from diag.gpu.sampler import scenario_from_env
    from diag.gpu.simulated import SCENARIOS, get_scenario

    if args.list_scenarios:
        for name, sc in SCENARIOS.items():
            n = len(sc.devices)
            model = sc.model.name if sc.model else "no GPU"
            sys.stdout.write(f"{name:<12} {sc.description} ({n} x {model})\n" if n else
                             f"{name:<12} {sc.description}\n")
        return ExitCode.OK
    if args.count is not None and args.count <= 0:
        raise DiagError(f"--count must be a positive number of refreshes, not {args.count}")
    if args.count is not None and args.watch is None:
        raise DiagError("--count only makes sense with --watch")
    interval = check_interval(args.watch, "--watch") if args.watch is not None else None
    simulate = args.simulate_gpus
    if simulate is not None:
        simulate = get_scenario(simulate).name
    else:
        simulate = scenario_from_env()
    start = SIM_START_S if interval is None else 0.0
    from diag.gpu.provider import HostMonitor

    host = HostMonitor()
    try:
        provider = get_provider(simulate or "", strict=True, visible_only=args.visible_only, seed=args.seed,
                                start=start)
    except DiagError as e:
        if simulate:
            raise
        # no usable NVML: still the host's CPU and RAM the help promises, "No GPUs: why" (JSON: devices
        # [] and reason), the hint on stderr, and exit 2 (docs/gpus.md: NVML unusable)
        provider = get_provider("", strict=False, visible_only=args.visible_only)
        doc = document(provider, host.sample(prime_s=0.1), processes=False)
        doc["reason"] = e.message
        _emit(args, doc)
        if e.hint:
            sys.stderr.write(f"hint: {e.hint}\n")
        return e.code
    want_procs = not args.no_processes
    if interval is None:
        doc = document(provider, host.sample(prime_s=0.1), want_procs)
        _emit(args, doc)
        return ExitCode.OK
    return _watch(args, provider, host, interval, want_procs)


def document(provider, host_sample, processes: bool = True, samples=None, procs=None) -> dict:
    """The ``diag gpus --json`` document (schema "diag.gpus/1", docs/gpus.md)."""
    import socket

    from diag.gpu.provider import to_jsonable

    statics = provider.devices()
    samples = provider.sample() if samples is None else samples
    procs = (provider.processes() if processes else []) if procs is None else procs
    by_index = {s.index: s for s in samples}
    devices = []
    for st in statics:
        d = to_jsonable(st)
        s = by_index.get(st.index)
        sd = to_jsonable(s) if s is not None else {}
        mig_samples = {m["index"]: m for m in sd.pop("mig", []) or []}
        for k in ("index", "t", "memory_total", "power_limit_w"):
            sd.pop(k, None)
        d.update(sd)
        d.setdefault("lost", False)
        d["memory_pct"] = None if s is None else to_jsonable(s.memory_pct)
        if d["memory_pct"] is not None:
            d["memory_pct"] = round(d["memory_pct"], 1)
        mine = [p for p in procs if p.device == st.index]
        for m in d["mig_devices"]:
            ms = mig_samples.get(m["index"], {})
            m["memory_used"] = ms.get("memory_used")
            m["processes"] = [_proc(p) for p in mine if p.mig == m["index"]]
        d["processes"] = [_proc(p) for p in mine if p.mig is None]
        devices.append(d)
    try:
        notes = list(provider.notes())
    except Exception:
        notes = []
    return {
        "schema": JSON_SCHEMA,
        "time": round(time.time(), 3),
        "hostname": socket.gethostname(),
        "provider": provider.name if statics or provider.name == "simulated" else "none",
        "simulated": bool(provider.simulated),
        "scenario": provider.scenario,
        "reason": None if statics else provider.reason,
        "driver": provider.driver(),
        "devices": devices,
        "host": to_jsonable(host_sample) if host_sample is not None else None,
        "notes": notes,
    }


def _proc(p) -> dict:
    from diag.gpu.provider import to_jsonable

    d = to_jsonable(p)
    d.pop("device", None)
    d.pop("mig", None)
    return d


def _emit(args, doc: dict) -> None:
    if args.json:
        import json

        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        sys.stdout.flush()
        return
    from rich.console import Console

    from diag.report.gpus import render

    console = Console(soft_wrap=False, highlight=False)
    console.print(render(doc, width=console.width))


def _watch(args, provider, host, interval: float, want_procs: bool) -> int:
    import json

    from rich.console import Console

    from diag.report.gpus import render

    host.sample()   # prime the CPU counter
    count = 0
    console = Console(highlight=False)
    live = None
    if not args.json and console.is_terminal:
        from rich.live import Live

        live = Live(console=console, auto_refresh=False, transient=False, screen=False)
        live.start()
    try:
        next_t = time.monotonic()
        while True:
            doc = document(provider, host.sample(), want_procs)
            if args.json:
                sys.stdout.write(json.dumps(doc) + "\n")
                sys.stdout.flush()
            elif live is not None:
                live.update(render(doc, watch=interval, width=console.width), refresh=True)
            else:
                if count:
                    console.print()
                console.print(render(doc, watch=interval, width=console.width))
            count += 1
            if args.count and count >= args.count:
                break
            next_t += interval
            time.sleep(max(0.0, next_t - time.monotonic()))
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()
    return ExitCode.OK
