"""The GPUs tab: one card per device (utilisation and memory bars with their history, temperature,
power, clocks, throttling, processes; MIG instances under their parent), the host's CPU and RAM, and
a clear empty state when there is no GPU. Simulated values are labelled on every card."""
from __future__ import annotations

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Container, VerticalScroll
from textual.widgets import Static

from diag.gpu.provider import SLOWDOWN_REASONS, THERMAL_REASONS, THROTTLE_DESCRIPTIONS, fmt as gfmt, is_na
from diag.sanitize import for_terminal as safe
from diag.tui import fmt
from diag.tui.models.gpus import DeviceView, GpuView
from diag.tui.widgets import Pane, UIState

SPARK = " ▁▂▃▄▅▆▇█"
MAX_PROCS = 3


def spark(values: list, width: int, top: float = 100.0) -> str:
    """A one-line history of 0..top values (None for a gap), the newest at the right."""
    if width <= 0:
        return ""
    vals = values[-width:]
    out = []
    for v in vals:
        if v is None:
            out.append("·")
        else:
            k = int(round(min(max(v / top, 0.0), 1.0) * (len(SPARK) - 1)))
            out.append(SPARK[max(k, 1) if v > 0 else 0])
    return "".join(out).rjust(width)


def level_style(pct: float | None, warn: float = 85, bad: float = 95) -> str:
    if pct is None:
        return "dim"
    if pct >= bad:
        return "red"
    if pct >= warn:
        return "yellow"
    return "green"


def _meter(t: Text, label: str, pct: float | None, value: str, hist: list, width: int,
           style: str | None = None) -> None:
    """label [bar] value  history — fitted to `width` cells."""
    value_w = 6
    rest = max(width - len(label) - value_w - 2, 8)
    bar_w = rest if rest < 24 else (rest + 1) // 2
    hist_w = rest - bar_w - 1 if rest >= 24 else 0
    st = style or level_style(pct)
    t.append(label, style="bold")
    t.append(fmt.bar(None if pct is None else pct / 100, bar_w), style=f"{st} on grey19")
    t.append(value.rjust(value_w), style=st if pct is not None else "dim")
    if hist_w > 0:
        t.append(" ")
        t.append(spark(hist, hist_w), style=st + " dim" if st != "dim" else "dim")
    t.append("\n")


class DeviceCard:
    """The body of one device's card (a rich renderable that fits any width)."""

    def __init__(self, dv: DeviceView):
        self.dv = dv

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield device_text(self.dv, options.max_width)


def device_text(dv: DeviceView, width: int) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    st, s = dv.static, dv.sample
    if s is None:
        t.append("waiting for the first sample…", style="dim")
        return t
    if s.lost:
        t.append("LOST", style="bold white on red")
        t.append(" " + (s.error or "the GPU stopped answering"), style="red")
        t.append("\nEvery value is N/A from here; the run on it has most likely failed.", style="dim")
        return t
    util = None if is_na(s.gpu_util) else float(s.gpu_util)
    mem_pct = None if is_na(s.memory_pct) else float(s.memory_pct)
    util_note = "N/A" if util is None else f"{util:.0f}%"
    _meter(t, "util ", util, util_note, dv.util_hist, width, style="green" if util is not None else "dim")
    _meter(t, "mem  ", mem_pct, "N/A" if mem_pct is None else f"{mem_pct:.0f}%", dv.mem_hist, width)
    if util is None and st.mig_mode is True:
        t.append("(MIG mode: NVML gives no utilisation for the whole GPU)\n", style="dim")
    # values line
    t.append(f"{gfmt(s.memory_used, 'B')} / {gfmt(s.memory_total, 'B')}", style="bold")
    t.append(" · ")
    temp_style = "red" if not is_na(s.temperature) and s.temperature >= 85 else ""
    t.append(gfmt(s.temperature, "C"), style=temp_style)
    t.append(" · ")
    t.append(f"{gfmt(s.power_w, 'W')} / {gfmt(s.power_limit_w, 'W')}")
    t.append("\n")
    t.append(f"SM {gfmt(s.sm_clock_mhz, 'MHz')} · mem {gfmt(s.mem_clock_mhz, 'MHz')}")
    t.append(f" · PCIe rx {gfmt(s.pcie_rx_bps, 'B/s')} tx {gfmt(s.pcie_tx_bps, 'B/s')}", style="dim")
    if not is_na(s.fan_pct):
        t.append(f" · fan {gfmt(s.fan_pct, '%')}", style="dim")
    t.append("\n")
    # throttling
    if is_na(s.throttle):
        t.append("throttling: N/A", style="dim")
    else:
        bad = [r for r in s.throttle if r in SLOWDOWN_REASONS]
        if bad:
            hot = any(r in THERMAL_REASONS for r in bad)
            t.append("⚠ THROTTLED: ", style="bold red" if hot else "bold yellow")
            t.append("; ".join(THROTTLE_DESCRIPTIONS.get(r, r) for r in bad), style="red" if hot else "yellow")
        elif "gpu_idle" in s.throttle:
            t.append("idle (clocks down, nothing running)", style="dim")
        else:
            t.append("no throttling", style="green")
    # processes
    _procs(t, dv.processes, width, indent="")
    # MIG instances, under their parent
    for k, mv in enumerate(dv.mig):
        ms = mv.sample
        used = ms.memory_used if ms else None
        total = ms.memory_total if ms else mv.static.memory_total
        pct = None if (used is None or is_na(used) or is_na(total) or not total) else 100 * used / total
        t.append("\n")
        branch = "└" if k == len(dv.mig) - 1 else "├"
        t.append(f"{branch} MIG {mv.static.index} {mv.static.name:<8}", style="bold cyan")
        bar_w = max(min(width - 40, 24), 6)
        t.append(fmt.bar(None if pct is None else pct / 100, bar_w), style=f"{level_style(pct)} on grey19")
        t.append(f" {gfmt(used, 'B')} / {gfmt(total, 'B')}")
        _procs(t, mv.processes, width, indent="  ")
    return t


def _procs(t: Text, procs: list, width: int, indent: str) -> None:
    if not procs:
        return
    procs = sorted(procs, key=lambda p: -(0 if is_na(p.used_memory) else p.used_memory))
    for p in procs[:MAX_PROCS]:
        t.append("\n" + indent)
        t.append(f"{p.pid:>7} ", style="bold")
        t.append(f"{gfmt(p.used_memory, 'B'):>9} ", style="cyan")
        if p.visible:
            who = f"{p.user} " if p.user else ""
            t.append(safe(f"{who}{p.command or p.name}"), style="dim")
        else:
            t.append("(another container: not visible here)", style="dim italic")
    if len(procs) > MAX_PROCS:
        t.append(f"\n{indent}        … {len(procs) - MAX_PROCS} more processes", style="dim")


def host_text(v: GpuView, width: int) -> Text:
    t = Text(no_wrap=True, overflow="ellipsis")
    h = v.host
    half = max((width - 3) // 2, 30) if width >= 100 else width
    if h is not None:
        cpu = None if is_na(h.cpu_percent) else float(h.cpu_percent)
        mem = None if is_na(h.mem_used) or is_na(h.mem_total) or not h.mem_total else 100 * h.mem_used / h.mem_total
        line = Text(no_wrap=True)
        _meter(line, "CPU  ", cpu, "N/A" if cpu is None else f"{cpu:.0f}%", v.host_cpu_hist, half)
        line.rstrip()
        t.append_text(line)
        if width >= 100:
            t.append("   ")
        else:
            t.append("\n")
        line = Text(no_wrap=True)
        _meter(line, "RAM  ", mem, "N/A" if mem is None else f"{mem:.0f}%", v.host_mem_hist, half)
        line.rstrip()
        t.append_text(line)
        t.append("\n")
        t.append("host" + (" (simulated)" if v.host_simulated else "") + f": {gfmt(h.cpu_count)} CPUs",
                 style="dim")
        if not is_na(h.load1):
            t.append(f", load {h.load1:.1f}", style="dim")
        t.append(f" · RAM {gfmt(h.mem_used, 'B')} / {gfmt(h.mem_total, 'B')}", style="dim")
    else:
        t.append("host: waiting for the first sample…", style="dim")
    r = v.run
    if r is not None and r.nproc:
        t.append("\n")
        t.append("this run: ", style="bold")
        t.append(f"{r.nproc} process{'es' if r.nproc != 1 else ''} · CPU {gfmt(r.cpu_percent, '%')} · "
                 f"RSS {gfmt(r.rss, 'B')}")
        gm = sum(r.gpu_memory.values()) if r.gpu_memory else 0
        if gm:
            t.append(f" · GPU memory {gfmt(gm, 'B')}")
    drv = v.driver or {}
    bits = []
    if drv.get("driver_version"):
        bits.append(f"driver {drv['driver_version']}")
    if drv.get("cuda_driver_version"):
        bits.append(f"CUDA {drv['cuda_driver_version']}")
    if v.recorded:
        bits.append(f"recorded during the run ({v.samples} samples; the last one is shown)")
    elif v.interval_s:
        bits.append(f"sampled every {v.interval_s:g} s")
    if bits:
        t.append("\n" + " · ".join(bits), style="dim")
    return t


def empty_text(v: GpuView) -> Text:
    t = Text(justify="center")
    t.append("No GPU\n\n", style="bold")
    t.append((v.reason or "no GPU was found") + "\n", style="yellow")
    if v.hint:
        t.append(v.hint + "\n", style="dim")
    if v.simulated:
        t.append(f"(simulated scenario '{v.simulated}')\n", style="magenta")
    t.append("\nThe checks still run; the GPU checks say they were skipped and why.", style="dim")
    if not v.hint and not v.simulated:
        t.append("\nSimulated GPUs: diag tui --simulate-gpus healthy-8 (or DIAG_SIMULATE_GPUS).", style="dim")
    return t


class GpuCard(Static):
    def set_device(self, dv: DeviceView, simulated: str | None) -> None:
        st = dv.static
        title = f"GPU {st.index} · {st.name or 'unknown'}"
        self.border_title = title
        sub = []
        if simulated:
            sub.append("simulated")
        if dv.used_by_run is True:
            sub.append("used by this run")
        if dv.sample is not None and dv.sample.lost:
            sub.append("LOST")
        self.border_subtitle = " · ".join(sub)
        self.set_class(bool(dv.sample and dv.sample.lost), "-lost")
        self.set_class(bool(simulated), "-simulated")
        self.update(DeviceCard(dv))


class GpusPane(Pane):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._indices: list[int] | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="gpu-scroll"):
            yield Static(id="gpu-host")
            yield Static(id="gpu-empty")
            yield Container(id="gpu-grid")

    def data_key(self, state: UIState):
        return (state.gpu_version, self.size.width)

    def on_resize(self) -> None:
        app = self.app
        if getattr(app, "active_tab", None) == "gpus" and hasattr(app, "view"):
            self.maybe_refresh(app.view)

    def refresh_data(self, state: UIState) -> None:
        gpu = state.gpu
        if gpu is None:
            v = GpuView(reason="GPU telemetry is off for this session")
        else:
            v = gpu.view()
        width = max(self.size.width - 2, 40)
        self.query_one("#gpu-host", Static).update(host_text(v, width))
        empty = self.query_one("#gpu-empty", Static)
        grid = self.query_one("#gpu-grid", Container)
        if not v.devices:
            empty.display = True
            grid.display = False
            empty.update(empty_text(v))
            return
        empty.display = False
        grid.display = True
        indices = [d.static.index for d in v.devices]
        if indices != self._indices:
            grid.remove_children()
            grid.mount_all([GpuCard(id=f"gpu-{i}", classes="gpu-card") for i in indices])
            self._indices = indices
            grid.set_class(len(indices) == 1, "-single")
            # the new cards are composed after this call: fill them once they exist
            self.call_after_refresh(self._fill, v)
            return
        self._fill(v)

    def _fill(self, v: GpuView) -> None:
        for dv in v.devices:
            try:
                card = self.query_one(f"#gpu-{dv.static.index}", GpuCard)
            except Exception:
                continue
            card.set_device(dv, v.simulated)
