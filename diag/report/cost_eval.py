"""Text for the cost of evaluation (``diag cost --from RUN --eval-samples N``; diag/cost/eval.py)."""
from __future__ import annotations

from diag.report.cost import _money, _qty, _sci
from diag.units import fmt_seconds


def _dur(seconds: float) -> str:
    if seconds < 120:
        return fmt_seconds(seconds)
    if seconds < 2 * 3600:
        return f"{seconds / 60:,.1f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:,.1f} h"
    return f"{seconds / 86400:,.1f} days"


def render_eval(m, e, out) -> None:
    w = out.write
    dev = m.device_name or m.device
    u1 = m.unit[:-1]
    batch = f" of {m.batch:,.0f} {m.unit}" if m.batch else ""
    w(f"Measured     evaluation on {dev}: {m.units_per_s:,.1f} {m.unit}/s ({m.batches_per_s:,.1f} batches/s over "
      f"{m.steps} timed evaluation steps{batch})\n")
    if m.flops_per_unit:
        ratio = f", ratio {m.ratio_to_analytic:.2f}" if m.ratio_to_analytic else ""
        ana = f" vs 2·N = {_sci(m.analytic_per_unit)} (N = {m.params:,.0f} parameters){ratio}" if m.analytic_per_unit else ""
        w(f"FLOPs        {_sci(m.flops_per_unit)} FLOPs/{u1} measured ({m.flops_source}){ana}\n")
        if m.achieved_flops_per_s:
            w(f"Achieved     {_sci(m.achieved_flops_per_s)} FLOP/s in evaluation\n")
    elif m.analytic_per_unit:
        w(f"FLOPs        2·N = {_sci(m.analytic_per_unit)} FLOPs/{u1} (N = {m.params:,.0f} parameters; not measured)\n")
    if e is not None:
        fl = f" = {_sci(e.flops)} FLOPs" if e.flops else ""
        ana = f" (2·N·D: {_sci(e.analytic_flops)})" if e.analytic_flops else ""
        w(f"Evaluation   {_qty(e.units)} {e.unit}{fl}{ana}\n")
        w(f"Rate         {e.basis}\n")
        w(f"Time         {_dur(e.seconds)} on {e.label} ({e.device_hours:,.3g} device-hours)\n")
        price = f" at ${e.price_per_hour:,.2f}/hour" if e.price_per_hour else ""
        w(f"Cost         {_money(e.cost)}{price}\n")
        notes = e.notes
    else:
        notes = m.notes
    for n in notes:
        w(f"Note         {n}\n")


def render_frequency(f, out) -> None:
    w = out.write
    every = f"every {f.every:,.0f} training steps" if f.every else f"{f.passes} pass(es)"
    w(f"Eval share   {f.passes} evaluation pass(es) took {fmt_seconds(f.eval_s)} = {f.share:.1%} of training+"
      f"evaluation time ({every})\n")
    w(f"Interval     from the run's mean pass ({fmt_seconds(f.per_pass_s)}) and mean training step "
      f"({fmt_seconds(f.step_s)}), warm-up included:\n")
    money = f.price_per_hour is not None
    w(f"{'  evaluate every':<18}{'share':>8}{'eval time / 1,000 steps':>26}{'vs now':>14}"
      + (f"{'cost vs now':>14}" if money else "") + "\n")
    for r in f.rows:
        sign = "+" if r.delta_s_per_1000_steps > 0 else ("-" if r.delta_s_per_1000_steps < 0 else "")
        delta = "(now)" if r.current else f"{sign}{fmt_seconds(abs(r.delta_s_per_1000_steps))}"
        line = (f"  {r.every:>8,.0f} steps{r.share:>9.1%}{fmt_seconds(r.eval_s_per_1000_steps):>26}{delta:>14}")
        if money:
            c = r.delta_cost_per_1000_steps
            line += f"{('' if r.current or c is None else (('+' if c > 0 else '-') + _money(abs(c)))):>14}"
        w(line + "\n")
