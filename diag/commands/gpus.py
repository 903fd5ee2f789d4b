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
    provider = get_provider(simulate or "", strict=True, visible_only=args.visible_only, seed=args.seed,
                            start=start)
    from diag.gpu.provider import HostMonitor

    host = HostMonitor()
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

    console = Console(soft_wrap=False, highlight=False)
    console.print(render(doc, width=console.width))


def _watch(args, provider, host, interval: float, want_procs: bool) -> int:
    import json

    from rich.console import Console

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


# ---- text rendering ------------------------------------------------------------------------------

WIDE = 150   # below this many columns the devices are shown two lines each (gpustat-like)


def render(doc: dict, watch: float | None = None, width: int = 200):
    """The one-shot view as rich renderables (a header, the devices, a process table, host, notes).
    ``width``: the terminal's columns; narrow terminals get two lines per device."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from diag.gpu.provider import THROTTLE_DESCRIPTIONS, fmt

    sim = doc.get("simulated")
    head = Text()
    head.append(doc.get("hostname") or "", style="bold")
    head.append("  " + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(doc.get("time") or time.time())))
    drv = doc.get("driver") or {}
    if drv.get("driver_version"):
        head.append(f"  driver {drv['driver_version']}")
    if drv.get("cuda_driver_version"):
        head.append(f"  CUDA {drv['cuda_driver_version']}")
    if sim:
        head.append(f"  SIMULATED GPUs (scenario '{doc.get('scenario')}')", style="bold magenta")
    if watch:
        head.append(f"  every {watch:g} s, Ctrl-C to stop", style="dim")
    parts: list = [head]
    devices = doc.get("devices") or []
    if not devices:
        reason = doc.get("reason") or "no GPU found"
        parts.append(Text(f"No GPUs: {reason}" + (" (simulated)" if sim else ""), style="yellow"))
    elif width < WIDE:
        parts.append(_narrow_devices(devices, sim))
    else:
        title = "GPUs (simulated)" if sim else None
        t = Table(title=title, title_justify="left", box=None, pad_edge=False, header_style="bold",
                  show_edge=False, padding=(0, 1))
        for col, just in (("GPU", "right"), ("name", "left"), ("temp", "right"), ("util", "right"),
                          ("mem util", "right"), ("memory", "right"), ("power", "right"), ("SM clock", "right"),
                          ("PCIe rx / tx", "right"), ("fan", "right"), ("throttle", "left")):
            t.add_column(col, justify=just, no_wrap=(col != "throttle"))
        for d in devices:
            idx = str(d["index"])
            if d.get("lost"):
                t.add_row(idx, d.get("name") or "", Text("LOST", style="bold red"), "", "", "", "", "", "", "",
                          Text(d.get("error") or "GPU is lost", style="red"))
                continue
            total = d.get("memory_total")
            used = d.get("memory_used")
            mem = f"{fmt(used, 'B')} / {fmt(total, 'B')}"
            if d.get("memory_pct") is not None:
                mem += f" ({d['memory_pct']:.0f}%)"
            power = f"{fmt(d.get('power_w'), 'W')} / {fmt(d.get('power_limit_w'), 'W')}"
            pcie = f"{fmt(d.get('pcie_rx_bps'), 'B/s')} / {fmt(d.get('pcie_tx_bps'), 'B/s')}"
            thr = d.get("throttle")
            if thr is None:
                thr_text = Text("N/A", style="dim")
            else:
                active = [r for r in thr if r != "gpu_idle"]
                bad = [r for r in active if r in ("sw_thermal", "hw_thermal", "hw_slowdown", "hw_power_brake")]
                thr_text = Text(", ".join(active) if active else ("idle" if thr else "none"),
                                style="bold red" if bad else ("yellow" if active else "dim"))
            util = d.get("gpu_util")
            util_style = "green" if util is not None and util >= 70 else ("yellow" if util is not None and util >= 30
                                                                            else "red" if util is not None else "dim")
            temp = d.get("temperature")
            t.add_row(idx, (d.get("name") or "") + (" (simulated)" if sim else ""),
                      Text(fmt(temp, "C"), style="red" if temp is not None and temp >= 85 else ""),
                      Text(fmt(util, "%"), style=util_style), fmt(d.get("mem_util"), "%"), mem, power,
                      fmt(d.get("sm_clock_mhz"), "MHz"), pcie, fmt(d.get("fan_pct"), "%"), thr_text)
            for m in d.get("mig_devices") or []:
                t.add_row("", Text(f"└ MIG {m['index']} {m.get('name') or ''}", style="cyan"), "", "", "",
                          f"{fmt(m.get('memory_used'), 'B')} / {fmt(m.get('memory_total'), 'B')}", "", "", "", "", "")
        parts.append(t)
    if devices:
        rows = []
        for d in devices:
            for p in d.get("processes") or []:
                rows.append((str(d["index"]), p))
            for m in d.get("mig_devices") or []:
                for p in m.get("processes") or []:
                    rows.append((f"{d['index']}/MIG {m['index']}", p))
        if rows:
            pt = Table(box=None, pad_edge=False, header_style="bold", show_edge=False, padding=(0, 1),
                       title="processes" + (" (simulated)" if sim else ""), title_justify="left")
            for col, just in (("GPU", "right"), ("PID", "right"), ("user", "left"), ("GPU memory", "right"),
                              ("CPU", "right"), ("host memory", "right"), ("command", "left")):
                pt.add_column(col, justify=just, no_wrap=True, overflow="ellipsis",
                              min_width=len(col) if col != "command" else 10)
            for where, p in rows:
                if not p.get("visible", True):
                    pt.add_row(where, str(p["pid"]), Text("?", style="dim"), fmt(p.get("used_memory"), "B"), "", "",
                               Text("(in another PID namespace)", style="dim"))
                    continue
                pt.add_row(where, str(p["pid"]), p.get("user") or "", fmt(p.get("used_memory"), "B"),
                           fmt(p.get("cpu_percent"), "%"), fmt(p.get("host_memory"), "B"),
                           (p.get("command") or p.get("name") or "")[:120])
            parts.append(pt)
        throttled = sorted({r for d in devices for r in (d.get("throttle") or []) if r != "gpu_idle"})
        for r in throttled:
            parts.append(Text(f"  {r}: {THROTTLE_DESCRIPTIONS.get(r, r)}", style="dim"))
    h = doc.get("host") or {}
    if h:
        ht = Text("host: ")
        ht.append(f"CPU {fmt(h.get('cpu_percent'), '%')} of {fmt(h.get('cpu_count'))} cores")
        if h.get("load1") is not None:
            ht.append(f" · load {h['load1']:.2f}")
        ht.append(f" · RAM {fmt(h.get('mem_used'), 'B')} / {fmt(h.get('mem_total'), 'B')}")
        if h.get("mem_percent") is not None:
            ht.append(f" ({h['mem_percent']:.0f}%)")
        parts.append(ht)
    for n in doc.get("notes") or []:
        parts.append(Text(f"note: {n}", style="dim"))
    return Group(*parts)


def _narrow_devices(devices: list[dict], sim: bool):
    """Two lines per device, for terminals narrower than WIDE columns."""
    from rich.text import Text

    from diag.gpu.provider import fmt

    out = Text()
    if sim:
        out.append("GPUs (simulated)\n", style="bold")
    for d in devices:
        out.append(f"[{d['index']}] ", style="bold")
        out.append((d.get("name") or "") + (" (simulated)" if sim else ""))
        if d.get("lost"):
            out.append("  LOST", style="bold red")
            out.append(f"\n    {d.get('error') or 'GPU is lost'}\n", style="red")
            continue
        temp = d.get("temperature")
        util = d.get("gpu_util")
        out.append("  ")
        out.append(fmt(temp, "C"), style="red" if temp is not None and temp >= 85 else "")
        out.append("  ")
        out.append(fmt(util, "%"), style="green" if util is not None and util >= 70 else
                   ("yellow" if util is not None and util >= 30 else "red" if util is not None else "dim"))
        out.append("\n")
        mem = f"    memory {fmt(d.get('memory_used'), 'B')} / {fmt(d.get('memory_total'), 'B')}"
        if d.get("memory_pct") is not None:
            mem += f" ({d['memory_pct']:.0f}%)"
        out.append(mem + f" · power {fmt(d.get('power_w'), 'W')} / {fmt(d.get('power_limit_w'), 'W')}"
                   f" · SM {fmt(d.get('sm_clock_mhz'), 'MHz')}\n")
        thr = d.get("throttle")
        active = None if thr is None else [r for r in thr if r != "gpu_idle"]
        out.append(f"    mem util {fmt(d.get('mem_util'), '%')} · "
                   f"PCIe rx {fmt(d.get('pcie_rx_bps'), 'B/s')} tx {fmt(d.get('pcie_tx_bps'), 'B/s')} · "
                   f"fan {fmt(d.get('fan_pct'), '%')} · throttle ", style="dim")
        bad = bool(active) and any(r in ("sw_thermal", "hw_thermal", "hw_slowdown", "hw_power_brake") for r in active)
        out.append("N/A" if active is None else (", ".join(active) if active else ("idle" if thr else "none")),
                   style="bold red" if bad else ("yellow" if active else "dim"))
        out.append("\n")
        for m in d.get("mig_devices") or []:
            out.append(f"    └ MIG {m['index']} {m.get('name') or ''}  "
                       f"{fmt(m.get('memory_used'), 'B')} / {fmt(m.get('memory_total'), 'B')}\n", style="cyan")
    out.rstrip()
    return out
