"""``diag try``: measure a fix before making it (docs/try.md)."""
from __future__ import annotations

import argparse
import re
import sys

from diag.errors import DiagError, ExitCode

DESCRIPTION = """\
Apply performance knobs to a training script from outside (no edit to the script: DataLoader workers,
bf16 autocast, TF32, fused optimizers, torch.compile, ...), run it with and without each, and measure
the speed-up with a 95% interval. Switch knobs (autocast, TF32, cudnn.benchmark, set_to_none, anomaly
detection off) alternate in blocks of steps of one process; knobs set when an object is built
(DataLoader keywords, a fused optimizer, compile) get short runs of their own, alternated A B C A B C
with the baseline's. The knobs that helped are then combined as one last trial. A knob whose run
crashes, runs out of memory, or whose loss turns NaN or leaves the baseline's curve is 'broke'.
Each run works in its own copy of the working directory, with W&B, MLflow, Neptune and Comet set to
offline or disabled."""

EPILOG = """\
examples:
  diag try --script train.py -- --epochs 5               the knobs the script's findings point to
  diag try --script train.py --knob dataloader.workers=4 --knob amp.bf16
  diag try --script train.py --budget 10m --steps 60     more time, longer runs
  diag try --from .diag/runs/<id>/evidence.json --script train.py   knobs from a saved run's findings
  diag try --list                                        every knob and how diag applies it
  diag try --script train.py --format json -o try.json
  diag try --script train.py --format html -o try.html   one page: the table, each trial's step times

verdicts: faster / slower (the 95% interval excludes 1x and the change is at least 3%) · no change
          broke (crashed, out of memory, NaN/inf loss, or a loss curve beyond 10% of the baseline's)
          not applicable (with why) · left out (the budget)
exit codes: 0 trials reported · 2 usage or bad input · 3 the script failed without any knob
            130 interrupted
"""


def duration(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h)?\s*", text or "")
    if not m:
        raise argparse.ArgumentTypeError(f"expected a duration such as 90s, 5m or 1h, got {text!r}")
    v = float(m.group(1)) * {"s": 1, "sec": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive duration, got {text!r}")
    return v


def add_arguments(p) -> None:
    from diag.commands._common import positive_int

    g = p.add_argument_group("the script (its own arguments go after --)")
    g.add_argument("--script", metavar="PATH", help="the training script to try knobs on, run unchanged")
    g.add_argument("--from", dest="from_", metavar="EVIDENCE", action="append",
                   help="take the findings (the default knobs) from a saved evidence.json or run directory "
                        "instead of a first run")
    t = p.add_argument_group("trials")
    t.add_argument("--knob", action="append", default=[], metavar="ID[=N]",
                   help="a knob to try (repeatable or comma-separated), e.g. amp.bf16, dataloader.workers=4; "
                        "default: the knobs the script's findings point to (--list shows them all)")
    t.add_argument("--steps", type=positive_int, metavar="N",
                   help="training steps of each run (default 40; the switch knobs' run takes as many as its "
                        "blocks need)")
    t.add_argument("--budget", type=duration, default=300.0, metavar="TIME",
                   help="time for all the trials together, e.g. 90s, 5m (default 5m); what does not fit is "
                        "reported as left out")
    t.add_argument("--rounds", type=positive_int, default=None, metavar="N",
                   help="at most N runs of each restart knob (and of the baseline), alternated (default: as "
                        "many as the budget allows, 2 to 8)")
    t.add_argument("--block", type=positive_int, default=5, metavar="N",
                   help="steps per block of the switch knobs' alternation (default 5; the first of each "
                        "block is not judged)")
    t.add_argument("--list", action="store_true", help="list every knob and how diag applies it, then exit")
    r = p.add_argument_group("reporting")
    r.add_argument("--format", choices=("text", "json", "markdown", "html"), default="text",
                   help="text for people (default); json (schema in docs/try.md), markdown, or html (one "
                        "self-contained page with each trial's step-time distribution beside its baseline's, "
                        "written to -o FILE only)")
    r.add_argument("--output", "-o", metavar="FILE", help="also write the report to FILE (with --format html: "
                                                            "write it only there)")


def run(args) -> int:
    from diag.report.try_ import render, render_list
    from diag.trial.engine import TryConfig, list_knobs, run_try
    from diag.trial.plan import from_specs

    if args.list:
        if args.format == "json":
            import json

            sys.stdout.write(json.dumps(list_knobs(), indent=2) + "\n")
        else:
            sys.stdout.write(render_list(list_knobs()))
        return ExitCode.OK
    if not args.script:
        raise DiagError("nothing to try: give --script PATH (the training script)",
                        hint="diag try --list shows the knobs; diag try --help the options")
    if args.from_ and len(args.from_) > 1:
        raise DiagError("diag try takes one --from (the evidence of one run)")
    if args.rounds is not None and args.rounds < 2:
        raise DiagError("--rounds must be at least 2: one run of each side says nothing of run-to-run noise")
    if args.block < 3:
        raise DiagError("--block must be at least 3 steps (the first step of each block is not judged)")
    try:
        from_specs(args.knob)        # a bad id is a usage error before anything runs
    except ValueError as e:
        raise DiagError(str(e)) from None
    from diag.runner import validate_script

    validate_script(args.script)
    if args.output:
        import os

        parent = os.path.dirname(os.path.abspath(args.output)) or "."
        if os.path.isdir(args.output) or not os.path.isdir(parent):
            raise DiagError(f"cannot write the report to {args.output!r}: give a file in an existing directory")
    if args.format == "html" and not args.output and sys.stdout.isatty():
        raise DiagError("--format html writes a web page, which a terminal cannot show: give -o FILE",
                        hint="diag try --script train.py --format html -o try.html")
    import os

    cfg = TryConfig(script=os.path.abspath(args.script), args=list(getattr(args, "script_args", []) or []),
                    knobs=args.knob or None, steps=args.steps, budget_s=args.budget,
                    from_evidence=args.from_, rounds=args.rounds, block=args.block,
                    progress=lambda s: (sys.stderr.write(f"diag try: {s}\n"), sys.stderr.flush()))
    result = run_try(cfg)
    text = render(result, args.format)
    if args.format == "html" and args.output:    # the page goes to the file; the terminal gets the text
        sys.stdout.write(render(result, "text"))
        sys.stderr.write(f"diag try: the HTML report is in {args.output}\n")
    else:
        sys.stdout.write(text)
    sys.stdout.flush()
    if args.output:
        from diag.commands._common import write_report

        write_report(args.output, text)
    return ExitCode.INTERRUPTED if result.interrupted else ExitCode.OK
