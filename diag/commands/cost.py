"""``diag cost``: FLOPs, GPU-hours, wall-clock days and money for training and evaluation.

Pure arithmetic over the GPU catalogue (diag/cost/gpus.toml): this command never imports torch.
"""
from __future__ import annotations

import json
import sys

DESCRIPTION = ("Estimate FLOPs, GPU-hours, wall-clock time and cost of training (6·N·D) and evaluation (2·N·D) "
               "on the GPUs you can rent, from a formula or from what a measured run achieved.")
EPILOG = """\
examples:
  diag cost --params 175e9 --tokens 300e9 --gpu A100 --count 1024 --mfu 0.3     GPT-3: ~934,800 GPU-hours
  diag cost --params 7B --tokens 140B --gpu H100 --count 8 --eval-tokens 1B --price 2.10
  diag cost --params 7B --tokens 140B --compare H100x8,A100x16,L40Sx32
  diag cost --params 1B --tokens 20B --gpu H100 --count 8 --phases explore:0.1x4,tune:0.5x2,full:1
  diag cost --from .diag/runs/<id>/evidence.json --epochs 3                  extrapolate the measured run
  diag cost --from .diag/runs/<id>/evidence.json --tokens 2B --gpu H100 --count 8
  diag cost --list-gpus                                                      the catalogue, with sources

numbers accept suffixes: 7B = 7e9, 1.4T = 1.4e12, 500M, 20k. MFU accepts 0.4 or 40%.
The GPU catalogue is diag/cost/gpus.toml; your own ~/.config/diag/gpus.toml (or $DIAG_GPU_CATALOG,
or --catalog PATH) overrides or adds entries, prices included.
"""


def add_arguments(p) -> None:
    w = p.add_argument_group("the workload")
    w.add_argument("--params", metavar="N", help="model parameters (e.g. 7e9 or 7B)")
    w.add_argument("--tokens", metavar="D", help="training tokens (with --from: tokens to extrapolate to)")
    w.add_argument("--samples", metavar="S", help="with --from: training samples to extrapolate to")
    w.add_argument("--epochs", metavar="E", help="with --from: epochs over the run's dataset")
    w.add_argument("--eval-tokens", metavar="D", help="evaluation tokens (forward only, 2·N·D)")
    w.add_argument("--from", dest="from_path", metavar="EVIDENCE",
                   help="a measured run (evidence.json or its run directory): use its FLOPs and throughput")
    a = p.add_argument_group("architecture (optional: adds PaLM's attention term 12·L·H·Q·T per token)")
    a.add_argument("--layers", metavar="L")
    a.add_argument("--heads", metavar="H")
    a.add_argument("--head-dim", metavar="Q")
    a.add_argument("--seq-len", metavar="T")
    a.add_argument("--recompute", choices=("none", "full"), default="none",
                   help="full activation recomputation: hardware runs 8·N·D, HFU shown beside MFU")
    h = p.add_argument_group("hardware and price")
    h.add_argument("--gpu", metavar="NAME", help="a GPU from the catalogue (e.g. H100, A100-40GB, L4, MI300X)")
    h.add_argument("--count", metavar="N", help="number of GPUs (default 1; with --from: the run's world size)")
    h.add_argument("--mfu", metavar="F", help="model FLOPs utilisation in (0, 1] (default: measured with --from, "
                   "else 0.30, Epoch AI's assumption for language models)")
    h.add_argument("--price", metavar="USD", help="price per GPU-hour (default: the catalogue's indicative price)")
    h.add_argument("--precision", choices=("bf16", "fp16", "tf32", "fp32", "fp8"),
                   help="which dense peak to use (default: bf16, else the best the GPU has)")
    h.add_argument("--compare", metavar="GPU[xN],...", help="side-by-side table, e.g. H100x8,A100x16,L40Sx32")
    h.add_argument("--phases", nargs="?", const="", metavar="SPEC",
                   help="price a tiered plan: NAME:FRACTION[xRUNS][@GPU[xN]],... "
                        "(default explore:0.1x4,tune:0.5x2,full:1)")
    h.add_argument("--catalog", metavar="PATH", help="a GPU catalogue TOML that overrides or adds entries")
    h.add_argument("--list-gpus", action="store_true", help="print the GPU catalogue with its sources")
    p.add_argument("--format", choices=("text", "json"), default="text")


# ---- formatting ---------------------------------------------------------------------------------------

def _qty(x: float | None) -> str:
    if x is None:
        return "N/A"
    for div, suf in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suf}"
    return f"{x:.3g}"


def _sci(x: float | None) -> str:
    if x is None:
        return "N/A"
    return f"{x:.3g}".replace("e+", "e")


def _hours(h: float) -> str:
    return f"{h:,.0f}" if h >= 100 else f"{h:,.2f}" if h >= 1 else f"{h:.3g}"


def _duration(hours: float) -> str:
    if hours >= 48:
        return f"{hours / 24:,.1f} days"
    if hours >= 1:
        return f"{hours:,.1f} hours"
    if hours >= 1 / 60:
        return f"{hours * 60:,.1f} minutes"
    return f"{hours * 3600:.3g} seconds"


def _money(x: float | None) -> str:
    if x is None:
        return "N/A (no price: pass --price)"
    return f"${x:,.0f}" if x >= 100 else f"${x:,.2f}"


def _pct(x: float | None) -> str:
    return "N/A" if x is None else f"{100 * x:.1f}%" if x < 0.1 else f"{100 * x:.0f}%"


def _tflops(x: float | None) -> str:
    return "N/A" if x is None else f"{x / 1e12:,.1f} TFLOPS"


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

def _int_arg(value, name: str):
    if value is None:
        return None
    from diag.cost.estimate import _count, parse_quantity

    return _count(name, parse_quantity(value, name))


def run(args) -> int:
    from diag.cost import (compare, estimate, estimate_measured, from_evidence, load_catalog, parse_target,
                           plan_phases)
    from diag.cost.estimate import CostError, parse_fraction, parse_quantity
    from diag.errors import DiagError

    cat = load_catalog(args.catalog)
    out = sys.stdout
    if args.list_gpus:
        if args.format == "json":
            json.dump(cat.to_dict(), out, indent=1)
            out.write("\n")
        else:
            render_catalog(cat, out)
        return 0

    mfu = parse_fraction(args.mfu) if args.mfu is not None else None
    price = parse_quantity(args.price, "price") if args.price is not None else None
    count = _int_arg(args.count, "GPU count")
    arch = {"n_layers": _int_arg(args.layers, "layers"), "n_heads": _int_arg(args.heads, "heads"),
            "head_dim": _int_arg(args.head_dim, "head dimension"), "seq_len": _int_arg(args.seq_len, "sequence length")}
    if args.compare is not None and args.phases is not None:
        raise DiagError("use --compare or --phases, not both")

    measured = None
    if args.from_path:
        from diag.evidence import load_evidence

        if args.params is not None:
            raise DiagError("--params comes from the measured run with --from; leave it out")
        if any(v is not None for v in arch.values()):
            raise DiagError("--layers/--heads/--head-dim/--seq-len do not apply with --from (the FLOPs are measured)")
        if args.recompute != "none":
            raise DiagError("--recompute does not apply with --from (recomputation is detected in the measured step)")
        measured = from_evidence(load_evidence(args.from_path))
    else:
        if args.params is None:
            raise DiagError("give --params and --tokens (or --from evidence.json to use a measured run)")
        if args.tokens is None:
            raise DiagError("give --tokens (the number of training tokens, e.g. 300e9)")
        for opt in ("samples", "epochs"):
            if getattr(args, opt) is not None:
                raise DiagError(f"--{opt} needs --from evidence.json (a measured run); use --tokens")
        if args.compare is None and args.gpu is None:
            raise DiagError("name a GPU with --gpu (e.g. --gpu H100), or several with --compare H100x8,A100x16")

    def one(gpu, n, price_):
        if measured is not None:
            return estimate_measured(measured, tokens=args.tokens, samples=args.samples, epochs=args.epochs,
                                     gpu=gpu, count=n, mfu=mfu, price=price_, eval_tokens=args.eval_tokens,
                                     precision=args.precision, catalog=cat)
        return estimate(args.params, args.tokens, gpu, n or 1, mfu, price_, catalog=cat, precision=args.precision,
                        eval_tokens=args.eval_tokens, recompute=args.recompute, **arch)

    result: dict
    if args.compare is not None:
        specs = [s for s in args.compare.split(",")]
        if not any(s.strip() for s in specs):
            raise CostError("--compare needs at least one GPU (e.g. H100x8,A100x16)")
        if measured is None:
            rows = compare(specs, args.params, args.tokens, count or 1, mfu, price, catalog=cat,
                           precision=args.precision, eval_tokens=args.eval_tokens, recompute=args.recompute, **arch)
        else:
            rows = []
            for s in specs:
                g, n = parse_target(s, count or measured.world_size)
                rows.append(one(g, n, price if len(specs) == 1 else None))
        result = {"kind": "compare", "rows": [r.to_dict() for r in rows]}
        _refuse_overflow(result)
        if measured is not None:
            result["measured"] = measured.to_dict()
        if args.format == "json":
            json.dump(result, out, indent=1, allow_nan=False)
            out.write("\n")
        else:
            render_compare(rows, out)
            for n in rows[0].notes if rows else []:
                out.write(f"note: {n}\n")
        return 0

    if args.phases is not None:
        if args.gpu is None and measured is None:
            raise DiagError("--phases needs --gpu (phases may name their own with @GPUxN)")
        if measured is not None:
            full = _full_units(measured, args)
            plan = plan_phases(args.phases, None, full, args.gpu, count or measured.world_size, mfu, price,
                               catalog=cat, measured=measured)
        else:
            plan = plan_phases(args.phases, args.params, args.tokens, args.gpu, count or 1, mfu, price, catalog=cat,
                               precision=args.precision, recompute=args.recompute, **arch)
        _refuse_overflow(plan.to_dict())
        if args.format == "json":
            json.dump({"kind": "phases", **plan.to_dict()}, out, indent=1, allow_nan=False)
            out.write("\n")
        else:
            render_phases(plan, out)
        return 0

    e = one(args.gpu, count, price)
    _refuse_overflow(e.to_dict())
    if args.format == "json":
        d = {"kind": "estimate", **e.to_dict()}
        if measured is not None:
            d["measured"] = measured.to_dict()
        json.dump(d, out, indent=1, allow_nan=False)
        out.write("\n")
    else:
        if measured is not None:
            _render_measured(measured, out)
        render_estimate(e, out)
    return 0


def _full_units(m, args) -> float:
    from diag.cost.estimate import CostError, parse_quantity

    given = [x for x in (args.tokens, args.samples, args.epochs) if x is not None]
    if len(given) != 1:
        raise CostError("give exactly one of --tokens, --samples or --epochs to extrapolate the measured run")
    if args.epochs is not None:
        if m.units_per_epoch is None:
            raise CostError(f"the run's dataset size is unknown: use --{m.unit} instead of --epochs")
        return parse_quantity(args.epochs, "epochs") * m.units_per_epoch
    if args.tokens is not None and m.unit != "tokens":
        raise CostError("the measured model takes no token ids: use --samples or --epochs")
    return parse_quantity(args.tokens if args.tokens is not None else args.samples, m.unit)


def _render_measured(m, out) -> None:
    dev = m.device_name or m.device
    out.write(f"Measured     step of {_qty(m.units_per_step)} {m.unit} = {_sci(m.model_flops_per_step)} model FLOPs "
              f"(FlopCounterMode) in {m.step_s * 1000:,.1f} ms median ({m.steps_timed} timed steps) on {dev}")
    if m.mfu is not None:
        out.write(f": MFU {_pct(m.mfu)} of {m.precision} peak")
    out.write("\n")


def _first_non_finite(obj, path: str = ""):
    import math

    if isinstance(obj, float) and not math.isfinite(obj):
        return path or "the result"
    if isinstance(obj, dict):
        for k, v in obj.items():
            hit = _first_non_finite(v, f"{path}.{k}" if path else str(k))
            if hit:
                return hit
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            hit = _first_non_finite(v, f"{path}[{i}]")
            if hit:
                return hit
    return None


def _refuse_overflow(result: dict) -> None:
    """Inputs so large that a figure overflows (inf GPU-hours, $inf) are refused, not printed."""
    from diag.errors import DiagError

    hit = _first_non_finite(result)
    if hit:
        raise DiagError(f"the inputs are too large to estimate: {hit} overflows (check --params, --tokens, "
                        "--count and --price)")
