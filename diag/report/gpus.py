"""The text rendering of ``diag gpus`` (the one-shot view and each refresh of ``--watch``)."""
from __future__ import annotations

import time

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
