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
  diag cost --from .diag/runs/<id>/evidence.json --eval-samples 1M          an evaluation set, at the measured rate
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
    w.add_argument("--eval-tokens", metavar="D", help="evaluation tokens (forward only, 2·N·D; with --from an "
                   "evaluation run: priced at its measured evaluation throughput)")
    w.add_argument("--eval-samples", metavar="N", help="with --from: evaluation samples, priced at the run's "
                   "measured evaluation throughput")
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
    from diag.report.cost import (render_catalog, render_compare, render_estimate, render_measured,
                                  render_phases)

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

    if args.eval_samples is not None and not args.from_path:
        raise DiagError("--eval-samples needs --from evidence.json (a run that evaluated); without one use "
                        "--params with --eval-tokens")
    measured = None
    if args.from_path:
        from diag.evidence import load_evidence

        evidence = load_evidence(args.from_path)
        no_training_target = all(getattr(args, o) is None for o in ("tokens", "samples", "epochs"))
        if args.eval_samples is not None or (args.eval_tokens is not None and no_training_target) or (
                no_training_target and evidence.run_kind() == "evaluation"):
            return _run_eval(args, evidence, cat, mfu, price, count)

        if args.params is not None:
            raise DiagError("--params comes from the measured run with --from; leave it out")
        if any(v is not None for v in arch.values()):
            raise DiagError("--layers/--heads/--head-dim/--seq-len do not apply with --from (the FLOPs are measured)")
        if args.recompute != "none":
            raise DiagError("--recompute does not apply with --from (recomputation is detected in the measured step)")
        measured = from_evidence(evidence)
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
            from diag.cost.eval import eval_frequency

            freq = eval_frequency(evidence, price=price, gpu=args.gpu, count=count, catalog=cat)
            if freq is not None:
                d["eval_frequency"] = freq.to_dict()
        json.dump(d, out, indent=1, allow_nan=False)
        out.write("\n")
    else:
        if measured is not None:
            render_measured(measured, out)
        render_estimate(e, out)
        if measured is not None:
            from diag.cost.eval import eval_frequency
            from diag.report.cost_eval import render_frequency

            freq = eval_frequency(evidence, price=price, gpu=args.gpu, count=count, catalog=cat)
            if freq is not None:
                render_frequency(freq, out)
    return 0


def _run_eval(args, evidence, cat, mfu, price, count) -> int:
    """``diag cost --from RUN --eval-samples N | --eval-tokens N``: an evaluation set priced at the run's
    measured evaluation throughput, with the evaluation-frequency table for a training run."""
    from diag.cost.estimate import CostError
    from diag.cost.eval import estimate_eval, eval_frequency, eval_from_evidence
    from diag.report.cost_eval import render_eval, render_frequency

    if args.params is not None:
        raise CostError("--params comes from the measured run with --from; leave it out")
    if args.compare is not None or args.phases is not None:
        raise CostError("--compare and --phases price training; for evaluation use --gpu/--count")
    if args.eval_samples is not None and args.eval_tokens is not None:
        raise CostError("give --eval-samples or --eval-tokens, not both")
    m = eval_from_evidence(evidence, catalog=cat)
    est = None
    if args.eval_samples is None and args.eval_tokens is None:
        if evidence.run_kind() == "evaluation":
            raise CostError(f"this is an evaluation run: give --eval-{m.unit} N to price an evaluation set "
                            f"(measured: {m.units_per_s:,.1f} {m.unit}/s)")
    else:
        unit = "samples" if args.eval_samples is not None else "tokens"
        est = estimate_eval(m, args.eval_samples if unit == "samples" else args.eval_tokens, unit=unit,
                            gpu=args.gpu, count=count, mfu=mfu, price=price, precision=args.precision, catalog=cat)
    freq = eval_frequency(evidence, price=price, gpu=args.gpu, count=count, catalog=cat)
    out = sys.stdout
    if args.format == "json":
        d = {"kind": "eval", "measured": m.to_dict(), "estimate": est.to_dict() if est else None,
             "frequency": freq.to_dict() if freq else None}
        _refuse_overflow(d)
        json.dump(d, out, indent=1, allow_nan=False)
        out.write("\n")
        return 0
    render_eval(m, est, out)
    if freq is not None:
        render_frequency(freq, out)
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
