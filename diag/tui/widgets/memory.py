"""The Memory tab: where the memory goes (parameters / gradients / optimizer state / activations /
other), the device's allocator figures over the steps, the OOM diagnosis when the script ran out of
memory, and the batch-size plan when it was estimated (``diag memory``, or after a CUDA OOM).

Reads the rank's ``memory`` section and ``Evidence.memory_plan`` (shapes in docs/memory.md)."""
from __future__ import annotations

from rich.console import Group
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Sparkline, Static

from diag.findings import Severity
from diag.sanitize import for_terminal as safe
from diag.tui import fmt
from diag.tui.widgets import Pane, UIState

CATEGORIES = (("parameters", "parameters", "cyan"), ("gradients", "gradients", "blue"),
              ("optimizer_state", "optimizer state", "magenta"), ("activations", "activations", "yellow"),
              ("other", "other (batch, outputs, workspaces)", "grey62"))


def breakdown_source(rank) -> tuple[dict | None, str]:
    """(categories in bytes, what they are) from the best record the run has."""
    mem = rank.memory if isinstance(rank.memory, dict) else {}
    b = mem.get("breakdown")
    if isinstance(b, dict) and b.get("categories"):
        return b["categories"], (f"peak {fmt.nbytes(b.get('peak'))} allocated at step {b.get('step')}, "
                                 "measured by the CUDA caching allocator")
    est = mem.get("estimate")
    if isinstance(est, dict) and est.get("status") == "ok":
        at = est.get("at_target") or {}
        if at.get("categories"):
            return at["categories"], (f"estimated for batch {est.get('target_batch')} by replaying one step on "
                                      "fake tensors (no memory was used)")
    p = mem.get("persistent")
    if isinstance(p, dict) and any(p.get(k) for k in ("params", "grads", "optimizer_state")):
        cats = {"parameters": int(p.get("params") or 0) + int(p.get("buffers") or 0),
                "gradients": int(p.get("grads") or 0), "optimizer_state": int(p.get("optimizer_state") or 0)}
        where = p.get("device") or "any"
        return cats, (f"persistent state of the live model and optimizer (device: {where}); activations are "
                      "measured on CUDA runs only — `diag memory --script ...` estimates them")
    return None, ""


def breakdown_renderable(cats: dict, what: str, width: int):
    total = sum(int(cats.get(k) or 0) for k, _, _ in CATEGORIES)
    t = Table(box=None, pad_edge=False, padding=(0, 1), expand=True, show_edge=False)
    t.add_column("", no_wrap=True)
    t.add_column("bytes", justify="right", no_wrap=True)
    t.add_column("share", justify="right", no_wrap=True)
    t.add_column("", ratio=1, no_wrap=True)
    bar_w = max(10, width - 50)
    for key, label, style in CATEGORIES:
        if key not in cats:
            continue
        v = int(cats.get(key) or 0)
        share = v / total if total else 0.0
        t.add_row(Text(label, style=style), fmt.nbytes(v), fmt.pct(share),
                  Text(fmt.bar(share, bar_w), style=f"{style} on grey19"))
    t.add_row(Text("total", style="bold"), Text(fmt.nbytes(total), style="bold"), "", "")
    # one stacked bar
    stacked = Text(no_wrap=True)
    used = 0
    for key, _, style in CATEGORIES:
        v = int(cats.get(key) or 0)
        if not total or not v:
            continue
        n = max(1, round(v / total * width))
        n = min(n, width - used)
        stacked.append("█" * n, style=style)
        used += n
    return Group(Text(what, style="dim"), stacked, t)


def device_renderable(mem: dict) -> Text | None:
    steps = mem.get("steps") or []
    if not steps:
        return None
    last = steps[-1]
    t = Text()
    dev = mem.get("device") or {}
    name = dev.get("name") or "the GPU"
    total = dev.get("total") or dev.get("total_memory")
    t.append(f"{name}", style="bold")
    if total:
        t.append(f" · {fmt.nbytes(total)}")
    t.append(f" · step {last.get('step')}: allocated {fmt.nbytes(last.get('allocated'))}, reserved "
             f"{fmt.nbytes(last.get('reserved'))}, peak {fmt.nbytes(last.get('peak'))} "
             f"(reserved peak {fmt.nbytes(last.get('reserved_peak'))})")
    if last.get("retries"):
        t.append(f" · {last['retries']} allocation retries (the allocator freed its cache to fit: slow)",
                 style="yellow")
    if last.get("ooms"):
        t.append(f" · {last['ooms']} OOMs", style="red")
    return t


def oom_renderable(ev, rank, findings) -> Group | None:
    mem = rank.memory if isinstance(rank.memory, dict) else {}
    oom = mem.get("oom")
    exc = next((e for e in reversed(rank.exceptions) if e.is_oom), None)
    if not oom and exc is None and ev.run.status != "oom":
        return None
    parts: list = []
    head = Text()
    head.append(" OUT OF MEMORY ", style="bold white on red")
    step = (oom or {}).get("step") or (exc.step if exc else None)
    head.append(f" at step {step}" if step else "")
    if exc is not None and exc.location:
        head.append(f" · {exc.location.get('file', '')}:{exc.location.get('line')}", style="dim")
    parts.append(head)
    parsed = (oom or {}).get("parsed") or {}
    if parsed:
        t = Table(box=None, show_header=False, pad_edge=False, padding=(0, 1))
        t.add_column(style="dim")
        t.add_column(justify="right")
        for key, label in (("requested", "tried to allocate"), ("capacity", "device capacity"),
                           ("free", "free at that moment"), ("process_in_use", "in use by this process"),
                           ("allocated", "allocated by PyTorch"), ("reserved", "reserved by PyTorch"),
                           ("reserved_unallocated", "reserved but unallocated (fragmentation)")):
            if parsed.get(key) is not None:
                t.add_row(label, fmt.nbytes(parsed[key]))
        parts.append(t)
    elif exc is not None:
        parts.append(Text(safe(fmt.shorten(exc.message.strip().splitlines()[0] if exc.message.strip() else "", 200)),
                          style="red"))
    b = (oom or {}).get("breakdown")
    if isinstance(b, dict) and b.get("categories"):
        c = b["categories"]
        parts.append(Text("at the OOM: " + ", ".join(f"{label.split(' (')[0]} {fmt.nbytes(c.get(k, 0))}"
                                                       for k, label, _ in CATEGORIES if k in c), style="dim"))
    mine = [f for f in findings if f.id.startswith("memory") and f.severity.rank >= Severity.INFO.rank]
    for f in mine[:3]:
        parts.append(Text.assemble((f"{safe(f.id)}: ", "bold"), safe(f.message)))
        if f.fix:
            parts.append(Text.assemble(("fix ", "bold green"), f.fix))
        if f.snippet:
            parts.append(Syntax(f.snippet.rstrip(), "python", theme="ansi_dark", background_color="default"))
    return Group(*parts)


def plan_renderable(ev) -> Group | None:
    plan = ev.memory_plan if isinstance(ev.memory_plan, dict) and ev.memory_plan else None
    if plan is None:
        est = (ev.primary.memory or {}).get("estimate") if ev.ranks else None
        if not est:
            return None
        from diag.memory.verdict import build_memory_plan

        plan = build_memory_plan(ev)
    parts: list = []
    status = plan.get("status")
    if status != "ok":
        parts.append(Text.assemble(("no batch-size plan", "yellow"), f": {safe(plan.get('reason') or status)}"))
        return Group(*parts)
    v = plan.get("verdict") or {}
    est = plan.get("estimate") or {}
    tgt = plan.get("target") or {}
    head = Text()
    cap = est.get("capacity") or v.get("capacity")
    if cap:
        head.append(f"on {tgt.get('name') or est.get('capacity_source') or 'the device'} ({fmt.nbytes(cap)}, "
                    f"{fmt.nbytes(v.get('usable'))} usable): ", style="dim")
    tb = v.get("target_batch")
    if v.get("fits") is True:
        head.append(f"batch {tb} fits", style="bold green")
        head.append(f" (estimated {fmt.nbytes(v.get('peak_device'))})")
    elif v.get("fits") is False:
        head.append(f"batch {tb} does NOT fit", style="bold red")
        head.append(f" (estimated {fmt.nbytes(v.get('peak_device'))} > {fmt.nbytes(v.get('usable'))})")
    else:
        head.append(f"batch {tb}: estimated {fmt.nbytes(v.get('peak_allocated'))} allocated "
                    "(no target device: `diag memory --gpu NAME` finds the largest batch)")
    parts.append(head)
    if v.get("max_batch"):
        parts.append(Text.assemble(("largest training batch that fits: ", "bold"), f"{v['max_batch']:,}"))
    if v.get("max_eval_batch"):
        parts.append(Text.assemble(("largest evaluation batch (inference_mode): ", "bold"),
                                   f"{v['max_eval_batch']:,}"))
    acc = v.get("accumulation")
    if acc:
        parts.append(Text(f"keep the effective batch {acc.get('effective_batch')} with micro-batch "
                          f"{acc.get('micro_batch')} × {acc.get('steps')} accumulation steps:"))
        if acc.get("snippet"):
            parts.append(Syntax(acc["snippet"].rstrip(), "python", theme="ansi_dark", background_color="default"))
    points = est.get("points") or []
    if points:
        t = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False, header_style="bold")
        t.add_column("batch", justify="right")
        for _, label, _s in CATEGORIES:
            t.add_column(label.split(" (")[0].replace("optimizer state", "optimizer"), justify="right")
        t.add_column("device", justify="right")
        if cap:
            t.add_column("fits", justify="center")
        for p in points[:12]:
            c = p.get("categories") or {}
            row = [f"{p.get('batch'):,}" + (" *" if p.get("batch") == tb else "")]
            row += [fmt.nbytes(c.get(k, 0)) for k, _, _ in CATEGORIES]
            row.append(fmt.nbytes(p.get("device")))
            if cap:
                row.append(Text("yes", style="green") if p.get("fits") else Text("no", style="red"))
            t.add_row(*row)
        parts.append(t)
    return Group(*parts)


ATTACH_TEXT = Text.assemble(
    ("not observable by sampling", "bold yellow"),
    (" · this job is attached (diag attach): py-spy reads its Python stacks from outside, not PyTorch's "
     "allocator, so where the memory goes (parameters, gradients, optimizer state, activations) and the "
     "batch-size plan are not known here.\n", "dim"),
    ("The GPUs tab shows each GPU's memory during the window (and this process's own where NVML matches "
     "its PID). For the breakdown, run the script under diag: `diag check --script train.py`, or "
     "`diag memory --script train.py --gpu H100` for the largest batch that fits.", "dim"))


class MemoryPane(Pane):
    def compose(self) -> ComposeResult:
        with VerticalScroll(id="memory-scroll"):
            attach = Static(ATTACH_TEXT, id="memory-attach")
            attach.display = False                 # shown for attached jobs only (diag tui --attach)
            yield attach
            yield Static(id="memory-oom")
            yield Static(Text("where the memory goes", style="bold"), classes="section first")
            yield Static(id="memory-breakdown")
            yield Static(Text("the device over the steps", style="bold"), id="memory-device-title",
                         classes="section")
            yield Static(id="memory-device")
            yield Sparkline([], id="memory-spark")
            yield Static(Text("batch-size plan", style="bold"), classes="section")
            yield Static(id="memory-plan")

    def data_key(self, state: UIState):
        return (state.version, self.size.width)

    def refresh_data(self, state: UIState) -> None:
        ev = state.evidence
        oom = self.query_one("#memory-oom", Static)
        if ev is None or not ev.ranks:
            oom.display = False
            self.query_one("#memory-breakdown", Static).update(Text("waiting for the script…", style="dim"))
            for wid in ("#memory-device-title", "#memory-device", "#memory-spark"):
                self.query_one(wid).display = False
            self.query_one("#memory-plan", Static).update(Text(""))
            return
        attached = getattr(ev.run, "source", "probe") == "attach"
        scroll = self.query_one("#memory-scroll")
        if attached or self.query_one("#memory-attach").display:
            for child in scroll.children:
                child.display = (child.id == "memory-attach") == attached
        if attached:
            return
        r = ev.primary
        mem = r.memory if isinstance(r.memory, dict) else {}
        o = oom_renderable(ev, r, state.findings)
        oom.display = o is not None
        if o is not None:
            oom.update(o)
        cats, what = breakdown_source(r)
        width = max(self.size.width - 4, 60)
        self.query_one("#memory-breakdown", Static).update(
            breakdown_renderable(cats, what, width) if cats else
            Text("nothing measured yet: the breakdown comes after the first training step", style="dim"))
        dev = device_renderable(mem)
        for wid in ("#memory-device-title", "#memory-device", "#memory-spark"):
            self.query_one(wid).display = dev is not None
        if dev is not None:
            self.query_one("#memory-device", Static).update(dev)
            self.query_one("#memory-spark", Sparkline).data = [
                float(s.get("allocated") or 0) for s in (mem.get("steps") or [])[-240:]]
        p = plan_renderable(ev)
        self.query_one("#memory-plan", Static).update(p if p is not None else Text(
            "not estimated in this run: `diag memory --script train.py --gpu H100` replays one step on fake "
            "tensors and finds the largest batch that fits (a CUDA OOM triggers it automatically)",
            style="dim"))
