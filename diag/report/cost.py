"""The text rendering of ``diag cost``: estimates, comparisons, phase plans, the catalogue, a measured run."""
from __future__ import annotations

from diag import units


def _qty(x: float | None) -> str:
    return units.fmt_count(x)


def _sci(x: float | None) -> str:
    return units.fmt_sci(x)


def _hours(h: float) -> str:
    return units.fmt_hours(h)


def _duration(hours: float) -> str:
    return units.fmt_wall_hours(hours)


def _money(x: float | None) -> str:
    if x is None:
        return "N/A (no price: pass --price)"
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}"


def _pct(x: float | None) -> str:
    return units.fmt_pct(x, style="cost")


def _tflops(x: float | None) -> str:
    return units.fmt_flops(x, per_second=True)


def render_estimate(e, out) -> None:
    w = out.write
    t = e.training
    unit = e.unit
    if e.basis == "formula":
        w(f"Training     {_qty(e.params)} params x {_qty(t.units)} tokens = {_sci(t.flops)} FLOPs ({e.flops_formula})\n")
        if e.recompute == "full":
            w(f"             with full recomputation the hardware executes {_sci(t.hardware_flops)} FLOPs "
              "(8·N·D: one more forward)\n")
    else:
        w(f"Training     {_qty(t.units)} {unit} x {_sci(t.flops / t.units)} FLOPs/{unit[:-1]} (measured) "
          f"= {_sci(t.flops)} FLOPs\n")
    dev = "GPU" if e.gpu not in ("cpu", "mps") else "device"
    peak = f"{e.precision} dense peak {_tflops(e.peak_flops)}/GPU" if e.peak_flops else f"{e.precision}, no catalogue peak"
    w(f"Hardware     {e.label}, {peak}\n")
    hfu = f", HFU {_pct(e.hfu)}" if e.hfu is not None and e.recompute == "full" else ""
    if e.mfu is None:
        w(f"Utilisation  {_tflops(e.rate_flops_per_s)} per {dev} {e.mfu_basis} (MFU N/A without a catalogue peak)\n")
    else:
        w(f"Utilisation  MFU {_pct(e.mfu)} ({e.mfu_basis}){hfu} -> {_tflops(e.rate_flops_per_s)} per {dev}\n")
    w(f"Time         {_hours(t.gpu_hours)} {dev}-hours = {_duration(t.wall_hours)} on {e.count} {dev}(s)\n")
    price = f" at ${e.price_per_gpu_hour:,.2f}/GPU-hour" if e.price_per_gpu_hour else ""
    w(f"Cost         {_money(t.cost)}{price}\n")
    if e.price_per_gpu_hour:
        w(f"Price        {e.price_basis}\n")
    if e.eval:
        v = e.eval
        w(f"Evaluation   {_qty(v.units)} {unit} = {_sci(v.flops)} FLOPs (forward only): {_hours(v.gpu_hours)} {dev}-hours = "
          f"{_duration(v.wall_hours)}, {_money(v.cost)}\n")
        w(f"Total        {_hours(e.gpu_hours)} {dev}-hours = {_duration(e.wall_hours)}, {_money(e.cost)}\n")
    if e.chinchilla_tokens and e.params and unit == "tokens":
        ratio = t.units / e.params
        w(f"Info         Chinchilla-optimal is ≈20 tokens/parameter ({_qty(e.chinchilla_tokens)} tokens for "
          f"{_qty(e.params)} parameters); this run has {ratio:,.3g} tokens/parameter\n")
    for n in e.notes:
        w(f"Note         {n}\n")


def render_compare(rows, out) -> None:
    head = ["configuration", "precision", "MFU", "GPU-hours", "wall-clock", "$/GPU-h", "cost"]
    table = [head]
    for e in rows:
        table.append([e.label, e.precision, _pct(e.mfu), _hours(e.gpu_hours), _duration(e.wall_hours),
                      f"{e.price_per_gpu_hour:.2f}" if e.price_per_gpu_hour else "N/A",
                      _money(e.cost) if e.cost is not None else "N/A"])
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for i, r in enumerate(table):
        out.write("  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j]) for j, c in enumerate(r)).rstrip()
                  + "\n")
        if i == 0:
            out.write("  ".join("-" * x for x in widths) + "\n")
    if rows:
        e = rows[0]
        out.write(f"\n{_sci(e.training.flops)} training FLOPs"
                  + (f" + {_sci(e.eval.flops)} evaluation FLOPs" if e.eval else "")
                  + f"; MFU {e.mfu_basis}; prices are indicative (catalogue as_of/source: diag cost --list-gpus)\n")
        cheapest = min((r for r in rows if r.cost is not None), key=lambda r: r.cost, default=None)
        fastest = min(rows, key=lambda r: r.wall_hours)
        if cheapest is not None:
            out.write(f"cheapest: {cheapest.label} ({_money(cheapest.cost)}); "
                      f"fastest: {fastest.label} ({_duration(fastest.wall_hours)})\n")


def render_phases(plan, out) -> None:
    head = ["phase", "fraction", "runs", "configuration", "GPU-hours", "wall-clock", "cost"]
    table = [head]
    for ph, e in plan.phases:
        table.append([ph.name, f"{ph.fraction:.0%}", str(ph.runs), e.label.split(": ", 1)[-1],
                      _hours(e.gpu_hours * ph.runs), _duration(e.wall_hours * ph.runs),
                      _money(None if e.cost is None else e.cost * ph.runs) if e.cost is not None else "N/A"])
    table.append(["total", "", "", "", _hours(plan.gpu_hours), _duration(plan.wall_hours),
                  _money(plan.cost) if plan.cost is not None else "N/A"])
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for i, r in enumerate(table):
        if i == len(table) - 1:
            out.write("  ".join("-" * x for x in widths) + "\n")
        out.write("  ".join(c.ljust(widths[j]) if j in (0, 3) else c.rjust(widths[j]) for j, c in enumerate(r)).rstrip()
                  + "\n")
        if i == 0:
            out.write("  ".join("-" * x for x in widths) + "\n")
    if plan.phases:
        e = plan.phases[0][1]
        out.write(f"\nphases run one after another; MFU {e.mfu_basis}\n")


def render_catalog(cat, out) -> None:
    head = ["id", "name", "mem GB", "TB/s", "fp32", "tf32", "bf16", "fp16", "fp8", "$/GPU-h", "as of"]
    table = [head]
    for g in cat:
        tf = [f"{g.tflops[k]:g}" if k in g.tflops else "N/A" for k in ("fp32", "tf32", "bf16", "fp16", "fp8")]
        table.append([g.id, g.name, f"{g.memory_gb:g}" if g.memory_gb else "N/A",
                      f"{g.bandwidth_tbs:g}" if g.bandwidth_tbs else "N/A", *tf,
                      f"{g.price.usd_per_hour:.2f}" if g.price else "N/A", g.price.as_of if g.price else ""])
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for i, r in enumerate(table):
        out.write("  ".join(c.ljust(widths[j]) if j < 2 else c.rjust(widths[j]) for j, c in enumerate(r)).rstrip()
                  + "\n")
        if i == 0:
            out.write("  ".join("-" * x for x in widths) + "\n")
    out.write("\nDense peak TFLOPS (vendors' 'with sparsity' figures are 2x these). Prices are indicative "
              "on-demand figures; sources:\n")
    for g in cat:
        src = g.price.source if g.price else "no public on-demand price"
        out.write(f"  {g.id}: specs {g.source or 'N/A'}; price {src}"
                  + (f" [{g.origin}]" if g.origin != "builtin" else "") + "\n")
    out.write("Catalogue files: " + ", ".join(cat.sources) + "\n")


# ---- run ------------------------------------------------------------------------------------------------


def render_measured(m, out) -> None:
    dev = m.device_name or m.device
    out.write(f"Measured     step of {_qty(m.units_per_step)} {m.unit} = {_sci(m.model_flops_per_step)} model FLOPs "
              f"(FlopCounterMode) in {m.step_s * 1000:,.1f} ms median ({m.steps_timed} timed steps) on {dev}")
    if m.mfu is not None:
        out.write(f": MFU {_pct(m.mfu)} of {m.precision} peak")
    out.write("\n")
