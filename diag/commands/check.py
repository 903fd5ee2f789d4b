"""``diag check``: run a script under the probe (or load saved evidence), run the checks, report."""
from __future__ import annotations

import sys

from diag.commands._common import add_run_arguments, run_config
from diag.errors import DiagError, exit_code_for

DESCRIPTION = """\
Run a training script, unchanged, under diag's probe; gather evidence (step timing, data loading,
model forwards, memory, exceptions); run every check over it; report the findings.
The script's own output is shown as it runs (on stderr with --format json|sarif|junit, so that
stdout carries data only) and saved in the run directory's log.txt."""

EPILOG = """\
examples:
  diag check --script train.py -- --epochs 1 --lr 3e-4
  diag check --script train.py --steps 100 --format json > report.json
  diag check --script train.py --fail-on warning          CI: fail on warnings too
  diag check --from .diag/runs/<id>/evidence.json         re-judge a saved run; executes nothing
  diag check --script train.py --select dataloader --ignore dataloader.pin-memory

exit codes: 0 nothing at or above --fail-on · 1 findings at or above it · 2 usage or bad input
            3 the script failed (traceback shown, findings still reported) · 130 interrupted
"""


def add_arguments(p) -> None:
    add_run_arguments(p)
    p.add_argument("--from", dest="from_", metavar="EVIDENCE", action="append",
                   help="judge a saved evidence.json (or run directory) instead of running a script; "
                        "repeat to merge the files of several nodes")
    g = p.add_argument_group("reporting")
    g.add_argument("--format", choices=("text", "json", "sarif", "junit"), default="text",
                   help="text for people (default); json/sarif/junit for machines (stdout is data only)")
    g.add_argument("--fail-on", choices=("error", "warning", "info", "never"), default="error",
                   help="exit 1 when a finding is at or above this severity (default: error); a "
                        "crashed check counts as an error")
    g.add_argument("--select", action="append", default=[], metavar="ID",
                   help="run only checks with this id or id prefix (repeatable, or comma-separated)")
    g.add_argument("--ignore", action="append", default=[], metavar="ID",
                   help="skip checks with this id or id prefix (repeatable, or comma-separated)")
    g.add_argument("--output", "-o", metavar="FILE", help="also write the report to FILE")
    g.add_argument("--verbose", "-v", action="store_true", help="show passed and skipped checks in full")


def _split(values: list[str]) -> list[str]:
    out = []
    for v in values:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def load_from(paths: list[str]):
    from diag.evidence import load_evidence

    if len(paths) == 1:
        return load_evidence(paths[0])
    try:
        from diag.merge import merge_evidence
    except ImportError:
        raise DiagError("merging several evidence files is not supported by this diag version") from None
    return merge_evidence([load_evidence(p) for p in paths], sources=paths)


def execute(args, echo_default: str = "stdout"):
    """Run (or load) and judge. Returns (evidence, findings, registry)."""
    from diag.registry import Registry

    if args.from_ and args.script:
        raise DiagError("give either --script (run a script) or --from (judge saved evidence), not both")
    if args.from_ and getattr(args, "nproc_per_node", None):
        raise DiagError("--nproc-per-node runs a script; --from judges saved evidence without running anything")
    if not args.from_ and not args.script:
        raise DiagError("nothing to check: give --script PATH (or --from EVIDENCE)",
                        hint="diag demo runs a bundled example; diag check --help shows the options")
    # bad selections are usage errors, found before anything runs
    registry = Registry.discover().select(_split(args.select), _split(args.ignore))
    machine = args.format != "text"
    if args.from_:
        evidence = load_from(args.from_)
        interrupted = False
    else:
        from diag.runner import Run

        run = Run(run_config(args, echo="stderr" if machine else echo_default))
        how = (f"under torchrun, {run.config.nproc_per_node} process(es) per node, the probe in every rank"
               if run.config.nproc_per_node else "under the probe")
        sys.stderr.write(f"diag: running {run.script} {how} (run directory {run.run_dir})\n")
        sys.stderr.flush()
        run.start()
        interrupted = False
        try:
            run.wait()
        except KeyboardInterrupt:
            interrupted = True
        evidence = run.evidence
        if interrupted:
            evidence.run.status = "interrupted"
            evidence.run.stop_reason = f"interrupted by {run._signal}" if run._signal else "interrupted by Ctrl-C"
            run.save()
    if getattr(evidence.run, "source", "probe") == "attach":   # sampled by diag attach: its judgement
        from diag.attach.judge import judge
        findings = judge(evidence, _split(args.select), _split(args.ignore))
    else:
        findings = registry.run(evidence)
    return evidence, findings


def run(args) -> int:
    evidence, findings = execute(args)
    code = exit_code_for(evidence, findings, args.fail_on)
    _emit(args, evidence, findings, code)
    return code


def _emit(args, evidence, findings, code: int) -> None:
    from pathlib import Path

    from diag.report import render
    from diag.report.json import render_json

    run_dir = evidence.run.run_dir if not args.from_ else None
    if run_dir and Path(run_dir).is_dir():
        try:
            (Path(run_dir) / "report.json").write_text(render_json(evidence, findings, code))
        except OSError:
            pass
    if args.format == "text":
        from rich.console import Console

        if evidence.run.status in ("failed", "oom"):
            sys.stdout.flush()
        console = Console(soft_wrap=False)
        from diag.report.console import render_console

        render_console(evidence, findings, console, verbose=args.verbose)
        if args.output:
            rec = Console(record=True, file=open("/dev/null", "w"), width=100)
            render_console(evidence, findings, rec, verbose=args.verbose)
            _write(args.output, rec.export_text())
    else:
        kw = {"fail_on": args.fail_on} if args.format == "junit" else {}
        text = render(args.format, evidence, findings, code, **kw)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        if args.output:
            _write(args.output, text + "\n")


def _write(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise DiagError(f"cannot write the report to {path!r}: {e.strerror}") from None
