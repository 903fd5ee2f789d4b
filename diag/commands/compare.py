"""``diag compare``: two saved runs (or two scripts run N times each), side by side, noise-aware."""
from __future__ import annotations

import os
import sys

from diag.commands._common import positive_float, positive_int, write_report
from diag.errors import DiagError

DESCRIPTION = """\
Compare two runs: median step time and its phases (data, forward, backward, optimizer, other),
throughput, peak memory, MFU, time to first step, the data-wait share, and the findings (new, gone,
changed). Each side is a run directory, an evidence.json or a `diag check --format json` report
(several, comma-separated, for repeats), or a training script that is run --runs times. Two
evaluation-only runs (an evaluation or batch-inference script) are compared on their evaluation
steps; a training run and an evaluation run are refused.
A change is a regression only when its whole confidence interval lies beyond the threshold:
"+3%, within the measured noise of ±6%" is reported as not significant, never as a failure."""

EPILOG = """\
examples:
  diag compare base.json new.json
  diag compare base.json new.json --max-regression 5% --format markdown >> "$GITHUB_STEP_SUMMARY"
  diag compare base.json new.json --format html -o compare.html   one self-contained page with charts
  diag compare base.json new.json --max-regression step=5%,memory=10%,mfu=3%
  diag compare a1.json,a2.json,a3.json b1.json,b2.json,b3.json   three repeats per side
  diag compare --runs 3 --steps 60 main/train.py pr/train.py       run each script 3 times

thresholds: step, throughput, memory, mfu (set by a bare --max-regression, default 5%); data-wait,
first-step and the phases (data, forward, backward, optimizer, other) only when named.

fewer than 3 runs per side: timing changes are reported, not gated ("not enough runs to judge", exit 0); use --runs 3
(scripts) or several comma-separated files per side; --min-runs 1 gates single runs on a quiet machine.

exit codes: 0 no significant regression beyond a threshold · 1 a significant regression beyond one
            2 bad input, or runs that must not be compared (different scripts, batch sizes, world
              sizes or devices; --force compares them anyway) · 130 interrupted
"""


def add_arguments(p) -> None:
    p.add_argument("base", metavar="BASE", help="the baseline: run directory, evidence.json, JSON report, "
                   "or a script (several files comma-separated)")
    p.add_argument("new", metavar="NEW", help="the run to judge, in the same forms")
    g = p.add_argument_group("judging")
    g.add_argument("--max-regression", action="append", metavar="PCT|METRIC=PCT,...",
                   help="largest tolerated slowdown/growth: 5%% (every gated metric) or "
                        "step=5%%,memory=10%%,mfu=3%% (default: 5%%)")
    g.add_argument("--confidence", type=_confidence, default=0.95, metavar="LEVEL",
                   help="confidence level of the intervals (default 0.95)")
    g.add_argument("--seed", type=int, default=0, help="bootstrap seed (results are deterministic for a seed)")
    g.add_argument("--force", action="store_true",
                   help="compare even when run kinds, batch sizes, world sizes or devices differ "
                        "(two different scripts are compared with a note: a before/after)")
    g.add_argument("--min-runs", type=positive_int, default=3, metavar="N",
                   help="runs per side needed to gate timing metrics (default 3): with fewer, a step-time "
                        "change is reported, not gated, and the exit code is 0 (one run per side says "
                        "nothing of run-to-run noise; see README, CI). Memory is gated from one run")
    g.add_argument("--select", action="append", default=[], metavar="ID",
                   help="when a side is evidence, run only these checks for the findings diff")
    g.add_argument("--ignore", action="append", default=[], metavar="ID",
                   help="when a side is evidence, skip these checks for the findings diff")
    r = p.add_argument_group("running scripts (when BASE and NEW are .py files)")
    r.add_argument("--runs", type=positive_int, default=1, metavar="N",
                   help="run each script N times (default 1); repeats bring run-to-run noise in")
    r.add_argument("--steps", type=positive_int, default=100, metavar="N",
                   help="training steps per run (default 100)")
    r.add_argument("--max-time", type=positive_float, metavar="SECONDS", help="time limit per run")
    o = p.add_argument_group("reporting")
    o.add_argument("--format", choices=("text", "json", "markdown", "junit", "html"), default="text",
                   help="text (default), json (docs/compare.md), markdown (PR comment, "
                        "$GITHUB_STEP_SUMMARY), junit (one test case per metric), html (one self-contained "
                        "page with charts, written to -o FILE, or to stdout when it is not a terminal)")
    o.add_argument("--output", "-o", metavar="FILE",
                   help="also write the report to FILE (with --format html: write it only there)")
    o.add_argument("--annotations", choices=("auto", "always", "never"), default="auto",
                   help="GitHub Actions workflow commands (::error ...) on stderr: auto = when "
                        "GITHUB_ACTIONS=true (default)")


def _confidence(text: str) -> float:
    import argparse

    try:
        v = float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a level such as 0.95, got {text!r}") from None
    if not 0.5 <= v < 1:
        raise argparse.ArgumentTypeError(f"must be between 0.5 and 1 (e.g. 0.95), got {text}")
    return v


def _split(values: list[str]) -> list[str]:
    out = []
    for v in values:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def load_side(spec: str, args, label: str):
    """RunSamples for one side: files (comma-separated) or a script run --runs times."""
    from diag.compare import extract

    parts = [x.strip() for x in spec.split(",") if x.strip()]
    if not parts:
        raise DiagError(f"the {label} is empty")
    if len(parts) == 1 and parts[0].endswith(".py"):
        return [run_script(parts[0], args, i, label) for i in range(args.runs)]
    if any(x.endswith(".py") for x in parts):
        raise DiagError(f"the {label} mixes scripts and saved runs; give one script or saved files")
    return [extract.load(x, select=_split(args.select), ignore=_split(args.ignore)) for x in parts]


def _is_script(spec: str) -> bool:
    parts = [x.strip() for x in spec.split(",") if x.strip()]
    return len(parts) == 1 and parts[0].endswith(".py")


def run_interleaved(args):
    """Both sides are scripts: run them in turns (base, new, base, new, ...), so that a machine whose
    load drifts during the comparison slows both sides alike instead of posing as a change."""
    base, new = [], []
    for i in range(args.runs):
        base.append(run_script(args.base.strip(), args, i, "baseline"))
        new.append(run_script(args.new.strip(), args, i, "new run"))
    return base, new


def run_script(script: str, args, i: int, label: str):
    from diag.commands.check import execute_script
    from diag.compare import extract

    sys.stderr.write(f"diag: {label} {i + 1} of {args.runs}: {script}\n")
    sys.stderr.flush()
    evidence, findings = execute_script(script, list(getattr(args, "script_args", []) or []),
                                        steps=args.steps, max_time=args.max_time,
                                        select=_split(args.select), ignore=_split(args.ignore))
    if evidence.run.status == "interrupted":
        raise KeyboardInterrupt
    if evidence.run.status in ("failed", "oom", "killed"):
        raise DiagError(f"the {label} script {script!r} failed ({evidence.run.stop_reason or evidence.run.status}); "
                        f"its log is {evidence.run.log_path}")
    return extract.from_evidence(evidence, findings, evidence.run.run_dir or script)


def run(args) -> int:
    from diag.commands.check import check_outputs
    from diag.compare.core import compare, parse_thresholds

    thresholds = parse_thresholds(args.max_regression)
    check_outputs(args, example="diag compare base.json new.json --format html -o compare.html")   # before anything runs
    from pathlib import Path

    for spec, label in ((args.base, "baseline"), (args.new, "new run")):   # before anything runs
        for part in [x.strip() for x in spec.split(",") if x.strip()]:
            if not Path(part).exists():
                what = "script" if part.endswith(".py") else "file"
                raise DiagError(f"the {label} {what} {part!r} does not exist")
    if _is_script(args.base) and _is_script(args.new):
        base, new = run_interleaved(args)
    else:
        base = load_side(args.base, args, "baseline")
        new = load_side(args.new, args, "new run")
    c = compare(base, new, thresholds=thresholds, force=args.force, confidence=args.confidence,
                seed=args.seed, min_runs=args.min_runs)
    emit(c, args.format, args.output, args.annotations)
    return c.exit_code


def emit(c, fmt: str, output: str | None, annotations: str = "auto", stream=None) -> None:
    from diag.report import compare as rc

    stream = stream or sys.stdout
    if fmt == "text":
        from rich.console import Console

        console = Console(file=stream, soft_wrap=False)
        if not console.is_terminal:
            console = Console(file=stream, soft_wrap=False, width=120)
        rc.render_text(c, console)
        if output:
            rec = Console(record=True, file=open(os.devnull, "w"), width=110)
            rc.render_text(c, rec)
            write_report(output, rec.export_text())
    elif fmt == "html":
        from diag.report.compare_html import render_html

        text = render_html(c)
        if output:
            write_report(output, text)
            sys.stderr.write(f"diag: HTML comparison written to {output}\n")
        else:
            stream.write(text)
            stream.flush()
    else:
        text = {"json": rc.render_json, "markdown": rc.render_markdown, "junit": rc.render_junit}[fmt](c)
        stream.write(text + "\n")
        stream.flush()
        if output:
            write_report(output, text + "\n")
    if annotations == "always" or (annotations == "auto" and os.environ.get("GITHUB_ACTIONS") == "true"):
        sys.stderr.write(rc.render_annotations(c) + "\n")
        sys.stderr.flush()


__all__ = ["run", "add_arguments", "emit"]
