"""The Cost tab: a form (parameters, tokens or samples, GPU type and count, MFU, price), prefilled from
the measured run when there is one; the results update as the user types: training vs evaluation,
a project plan (explore / tune / full runs), and the same workload on every GPU of the catalogue."""
from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Input, Label, Select, Static

from diag import units
from diag.tui import fmt
from diag.tui.models.cost import (FIELDS, FORMULA, MEASURED, SAME_DEVICE, CostInputs, CostResult, Prefill,
                               catalog, compute, prefill)
from diag.tui.widgets import Pane, UIState

LABELS = {
    "basis": "based on", "params": "parameters", "work": "train on", "eval": "evaluate on",
    "gpu": "GPU", "count": "GPUs", "mfu": "MFU", "price": "$ / GPU-hour",
}
PLACEHOLDERS = {
    "params": "7B", "work": "140B tokens, or 3 epochs", "eval": "blank: no evaluation",
    "count": "8", "mfu": "blank: measured, else 30% assumed", "price": "blank: catalogue price",
}


def _money(v) -> str:
    if v is None:
        return "N/A (no price)"
    if 0 < v < 0.01:
        return "<$0.01"
    if v >= 1e6:
        return f"${v / 1e6:,.2f}M"
    return fmt.money(v)


def short_gpu(label: str) -> str:
    for prefix in ("NVIDIA GeForce ", "NVIDIA ", "AMD Instinct ", "AMD "):
        if label.startswith(prefix):
            return label[len(prefix):]
    return label


def units_text(v: float) -> str:
    for suffix, size in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if v >= size:
            return f"{v / size:.3g}{suffix}"
    return f"{v:.3g}"


def price_text(e) -> str:
    if e.price_per_gpu_hour is None:
        return "price: none in the catalogue for this GPU; type one in the form"
    if e.price_basis == "given":
        return f"price: ${e.price_per_gpu_hour:.2f} per GPU-hour (yours)"
    g = catalog().gpus.get(e.gpu)
    p = g.price if g is not None else None
    extra = ""
    if p is not None:
        extra = f", as of {p.as_of}" + (f"; providers charge ${p.range[0]:.2f}-{p.range[1]:.2f}" if p.range else "")
    return f"price: ${e.price_per_gpu_hour:.2f} per GPU-hour (indicative catalogue price{extra})"


_FORM_WORDS = (("pass --mfu", "type one in the MFU field"), ("pass --price", "type one in the price field"),
               ("lower --mfu", "lower the MFU"), ("with --gpu", "in the GPU field"),
               ("estimate with --params instead", "choose the formula basis instead"))


def form_words(text: str) -> str:
    """An engine sentence in the form's words: fields, not the command line's options."""
    for cli, form in _FORM_WORDS:
        text = text.replace(cli, form)
    return text


def _hours(h: float) -> str:
    return units.fmt_hours(h, style="compact")


def main_renderable(res: CostResult, unit_hint: str, freq=None, cpu: bool = False):
    """The estimate. ``cpu``: a CPU run on its own device with no price typed: wall clock only (no
    GPU-hours, no money; typing a price brings them back)."""
    if res.error:
        return Text.assemble(("✘ ", "bold red"), (form_words(res.error), "red"))
    e = res.main
    t = Table(box=None, pad_edge=False, padding=(0, 1), expand=False, show_edge=False)
    t.add_column("", no_wrap=True, style="bold")
    t.add_column(e.unit, justify="right", no_wrap=True)
    t.add_column("FLOPs", justify="right", no_wrap=True)
    if not cpu:
        t.add_column("GPU-hours", justify="right", no_wrap=True)
    t.add_column("wall clock", justify="right", no_wrap=True)
    if not cpu:
        t.add_column("cost", justify="right", no_wrap=True)
    for name, part in (("training", e.training), ("evaluation", e.eval)):
        if part is None:
            continue
        cells = [name, units_text(part.units), f"{part.flops:.3g}", _hours(part.gpu_hours),
                 fmt.duration(part.wall_hours * 3600), _money(part.cost)]
        t.add_row(*(cells[:3] + cells[4:5] if cpu else cells))
    if e.eval is not None:
        cells = [Text("total", style="bold"), "", "", _hours(e.gpu_hours), fmt.duration(e.wall_hours * 3600),
                 Text(_money(e.cost), style="bold green")]
        t.add_row(*(cells[:3] + cells[4:5] if cpu else cells))
    head = Text()
    head.append(f"{e.label}", style="bold")
    head.append(f" · {e.precision}")
    if e.peak_flops:
        head.append(f" · peak {fmt.si(e.peak_flops)}FLOP/s")
    head.append("\n")
    head.append("total ", style="bold")
    if cpu:
        head.append(f"{fmt.duration(e.wall_hours * 3600)} on this CPU", style="bold green")
        if e.count != 1:
            head.append(f" × {e.count} processes", style="bold")
    else:
        head.append(_money(e.cost), style="bold green")
        head.append(f" · {fmt.duration(e.wall_hours * 3600)} on {e.count} GPU{'s' if e.count != 1 else ''}"
                    f" · {_hours(e.gpu_hours)} GPU-hours", style="bold")
    basis = Text(style="dim")
    basis.append(f"MFU {fmt.pct(e.mfu) if e.mfu else 'N/A'}: {form_words(e.mfu_basis)}\n")
    if cpu:
        basis.append("a CPU run: wall clock only (type a price per hour to price it; pick a GPU "
                     "to see it there)\n")
    else:
        basis.append(price_text(e) + "\n")
    if e.basis == "formula":
        basis.append("training 6·N·D, evaluation 2·N·D FLOPs (Kaplan et al. 2020)")
        if e.chinchilla_tokens:
            basis.append(f" · Chinchilla-optimal: {units_text(e.chinchilla_tokens)} tokens")
        basis.append("\n")
    for n in e.notes:
        basis.append(f"• {form_words(n)}\n")
    from rich.console import Group

    parts = [head, Text(""), t, Text(""), basis]
    ev_text = eval_renderable(res, freq, cpu=cpu)
    if ev_text is not None:
        parts += [Text(""), ev_text]
    return Group(*parts)


def eval_renderable(res: CostResult, freq=None, cpu: bool = False) -> Text | None:
    """'evaluate on' priced at the run's measured evaluation throughput, and a training run's
    evaluation share with what other intervals would save."""
    x = res.eval_measured
    if x is None and freq is None:
        return None
    t = Text()
    if x is not None:
        t.append("evaluation at the measured rate", style="bold bright_cyan")
        t.append(f" · {units_text(x.units)} {x.unit} in {fmt.duration(x.seconds)} on {x.label}"
                 + ("" if cpu else f" · {_money(x.cost)}") + "\n", style="bold")
        t.append(f"{x.basis}", style="dim")
        if x.flops and x.analytic_flops:
            t.append(f" · {x.flops:.3g} FLOPs measured vs 2·N·D {x.analytic_flops:.3g}", style="dim")
        t.append("\n")
    if freq is not None:
        t.append(f"evaluation took {fmt.pct(freq.share)} of training+evaluation time", style="bold")
        if freq.every:
            t.append(f" (every {freq.every:.0f} steps)")
        r = saving_row(freq)
        if r is not None:
            t.append(f"; every {r.every:.0f} steps would save {fmt.duration(-r.delta_s_per_1000_steps)} per 1,000 "
                     "training steps", style="dim")
            if r.delta_cost_per_1000_steps is not None and not cpu:
                t.append(f" ({_money(-r.delta_cost_per_1000_steps)})", style="dim")
        t.append("\n")
    return t


def saving_row(freq):
    """The sparser evaluation interval that saves time (twice the run's interval when there is one):
    never a row that costs more, never a saving of nothing."""
    rows = [r for r in freq.rows if not r.current and r.delta_s_per_1000_steps < 0
            and r.every > (freq.every or 0)]
    return min(rows, key=lambda r: r.every) if rows else None


def plan_renderable(res: CostResult, cpu: bool = False):
    if res.error or res.plan is None:
        return Text("")
    t = Table(box=None, pad_edge=False, padding=(0, 1), show_edge=False)
    t.add_column("phase", no_wrap=True)
    t.add_column("share", justify="right", no_wrap=True)
    t.add_column("runs", justify="right", no_wrap=True)
    if not cpu:
        t.add_column("GPU-hours", justify="right", no_wrap=True)
    t.add_column("wall clock", justify="right", no_wrap=True)
    if not cpu:
        t.add_column("cost", justify="right", no_wrap=True)

    def row(*cells):
        t.add_row(*(cells[:3] + cells[4:5] if cpu else cells))

    for ph, e in res.plan.phases:
        row(ph.name, fmt.pct(ph.fraction), str(ph.runs), _hours(e.gpu_hours * ph.runs),
            fmt.duration(e.wall_hours * ph.runs * 3600), _money(None if e.cost is None else e.cost * ph.runs))
    row(Text("project", style="bold"), "", "", _hours(res.plan.gpu_hours),
        fmt.duration(res.plan.wall_hours * 3600), Text(_money(res.plan.cost), style="bold green"))
    return t


class CostPane(Pane):
    def __init__(self, defaults: dict | None = None, **kw) -> None:
        super().__init__(**kw)
        self._defaults = defaults or {}
        self._prefill: Prefill | None = None
        self._touched = False
        self._setting = False
        self._set_values: dict[str, str] = {}     # what the prefill put in each field
        self.result: CostResult | None = None
        self.computations = 0

    def compose(self) -> ComposeResult:
        pre = prefill(None, self._defaults.get("device_names"))
        self._prefill = pre
        inp = pre.inputs
        self._set_values = inp.as_dict()
        gpu_options = [(g.name, g.id) for g in catalog()]
        with Horizontal(id="cost-body"):
            with Vertical(id="cost-form"):
                yield Static(id="cost-note")
                with Grid(id="cost-grid"):
                    yield Label(LABELS["basis"])
                    yield Select([("formula (6·N·D)", FORMULA)], value=FORMULA, allow_blank=False,
                                 compact=True, id="cost-basis")
                    for name in ("params", "work", "eval"):
                        yield Label(LABELS[name])
                        yield Input(getattr(inp, name), placeholder=PLACEHOLDERS[name], compact=True,
                                    id=f"cost-{name}")
                    yield Label(LABELS["gpu"])
                    yield Select(gpu_options, value=inp.gpu, allow_blank=False, compact=True, id="cost-gpu")
                    for name in ("count", "mfu", "price"):
                        yield Label(LABELS[name])
                        yield Input(getattr(inp, name), placeholder=PLACEHOLDERS[name], compact=True,
                                    id=f"cost-{name}")
            with VerticalScroll(id="cost-results"):
                yield Static(id="cost-main")
                yield Static(Text("a project: explore (10% × 4), tune (50% × 2), one full run", style="bold"),
                             id="cost-plan-title", classes="section")
                yield Static(id="cost-plan")
                yield Static(Text("the same workload on every GPU in the catalogue, at the same MFU "
                                  "(cheapest first)", style="bold"), classes="section")
                table = DataTable(id="cost-compare", cursor_type="none", zebra_stripes=True)
                for col in ("GPU", "peak", "GPU-hours", "wall clock", "$/h", "cost"):
                    table.add_column(col, key=col)
                yield table

    def on_mount(self) -> None:
        self._show_note()
        self._recompute()

    # ---- data from the run ------------------------------------------------------------------------
    def refresh_data(self, state: UIState) -> None:
        """Prefill from the evidence (until the user edits the form)."""
        if self._touched:
            return
        names = list(self._defaults.get("device_names") or [])
        if state.gpu is not None and not names:
            try:
                names = [d.static.name for d in state.gpu.view().devices]
            except Exception:
                names = []
        pre = prefill(state.evidence, names)
        old = self._prefill
        if old is not None and old.inputs == pre.inputs and (old.measured is None) == (pre.measured is None):
            self._prefill = pre
            return
        self._prefill = pre
        self._apply(pre)

    def data_key(self, state: UIState):
        # the measurement arrives once; after that only the step count changes the prefill
        ev = state.evidence
        steps = ev.primary.step_stats.count if ev is not None and ev.ranks else 0
        return (state.version if steps < 50 else 50, self._touched)

    def _apply(self, pre: Prefill) -> None:
        self._setting = True
        try:
            basis = self.query_one("#cost-basis", Select)
            options = [("formula (6·N·D)", FORMULA)]
            if pre.measured is not None:
                options.insert(0, ("the measured run", MEASURED))
            basis.set_options(options)
            basis.value = pre.inputs.basis
            gpu = self.query_one("#cost-gpu", Select)
            gopts = [(g.name, g.id) for g in catalog()]
            if pre.measured is not None:
                m = pre.measured
                gopts.insert(0, (f"as measured ({m.device_name or m.device})", SAME_DEVICE))
            gpu.set_options(gopts)
            gpu.value = pre.inputs.gpu
            self._set_values = pre.inputs.as_dict()
            for name in ("params", "work", "eval", "count", "mfu", "price"):
                self.query_one(f"#cost-{name}", Input).value = getattr(pre.inputs, name)
        finally:
            self._setting = False
        self._show_note()
        self._recompute()

    def _show_note(self) -> None:
        pre = self._prefill
        t = Text(style="dim")
        if pre is not None:
            t.append("\n".join(pre.notes))
        if self._touched:
            t = Text("your values (prefill stopped when you edited the form)", style="dim")
        self.query_one("#cost-note", Static).update(t)

    # ---- the form ----------------------------------------------------------------------------------
    def inputs(self) -> CostInputs:
        vals = {}
        for name in FIELDS:
            w = self.query_one(f"#cost-{name}")
            v = w.value
            vals[name] = "" if v is Select.BLANK or v is None else str(v)
        return CostInputs(**vals)

    def _changed(self, widget_id: str | None, value) -> None:
        name = (widget_id or "").removeprefix("cost-")
        # a change the prefill made (its events arrive after the values were set, intermediate ones
        # included) is not the user's: compare the field's value now with what the prefill put there
        try:
            now = self.query_one(f"#{widget_id}").value
        except Exception:
            now = value
        if not self._setting and str(now) != self._set_values.get(name):
            if not self._touched:
                self._touched = True
                self._show_note()
        self._recompute()

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self._changed(event.input.id, event.value)

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        self._changed(event.select.id, event.value)

    def _recompute(self) -> None:
        inp = self.inputs()
        pre = self._prefill
        measured = pre.measured if pre is not None else None
        res = compute(inp, measured, eval_measured=pre.eval_measured if pre is not None else None)
        self.result = res
        self.computations += 1
        unit = measured.unit if (measured is not None and inp.basis == MEASURED) else "tokens"
        cpu = (not res.error and measured is not None and inp.basis == MEASURED and inp.gpu == SAME_DEVICE
               and measured.device == "cpu" and not inp.price.strip())
        self.query_one("#cost-main", Static).update(
            main_renderable(res, unit, pre.frequency if pre is not None else None, cpu=cpu))
        self.query_one("#cost-plan", Static).update(plan_renderable(res, cpu=cpu))
        table = self.query_one("#cost-compare", DataTable)
        table.clear()
        if res.error:
            return
        chosen = res.main.gpu
        for e in res.compare:
            style = "bold" if e.gpu == chosen else ""
            table.add_row(Text(short_gpu(e.label), style=style), fmt.si(e.peak_flops) if e.peak_flops else "N/A",
                          _hours(e.gpu_hours),
                          fmt.duration(e.wall_hours * 3600),
                          f"{e.price_per_gpu_hour:.2f}" if e.price_per_gpu_hour is not None else "N/A",
                          Text(_money(e.cost), style=style + (" green" if e.gpu == chosen else "")))
