"""``diag check``: run a script under the probe (or load saved evidence), run the checks, report."""
from __future__ import annotations

import sys

from diag.commands._common import add_run_arguments, run_config, write_report
from diag.errors import DiagError, ExitCode, exit_code_for

DESCRIPTION = """\
Run a training script, unchanged, under diag's probe; gather evidence (step timing, data loading,
model forwards, memory, exceptions); run every check over it; report the findings.
The script's own output is shown as it runs (on stderr with --format json|sarif|junit|html, so that
stdout carries data only) and saved in the run directory's log.txt."""

EPILOG = """\
examples:
  diag check --script train.py -- --epochs 1 --lr 3e-4
  diag check --script train.py --steps 100 --format json > report.json
  diag check --script train.py --fail-on warning          CI: fail on warnings too
  diag check --from .diag/runs/<id>/evidence.json         re-judge a saved run; executes nothing
  diag check --script train.py --format html -o report.html   one self-contained HTML file with charts
  diag check --from .diag/runs/<id> --format json --html report.html   JSON on stdout, HTML to a file
  diag check --script train.py --select dataloader --ignore dataloader.pin-memory
  diag check --script train.py --steps 200 --baseline base.json   judge, and compare with a baseline
  srun diag check --script train.py --nnodes 4 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HEAD:29500
                                        Slurm, one task per node: one shared job directory, one report by
                                        the last task to finish (docs/distributed.md, "Under Slurm")
  srun --ntasks-per-node=8 diag check --script train.py   Slurm, one task per rank (no torchrun)

exit codes: 0 nothing at or above --fail-on · 1 findings at or above it · 2 usage or bad input
            3 the script failed (traceback shown, findings still reported) · 130 interrupted
            with --baseline: the worse of the check's code and the comparison's (1 = a significant
            regression beyond --max-regression); see docs/ci.md
"""


def add_arguments(p) -> None:
    add_run_arguments(p)
    p.add_argument("--from", dest="from_", metavar="EVIDENCE", action="append",
                   help="judge a saved evidence.json (or run directory) instead of running a script; "
                        "repeat to merge the files of several nodes")
    g = p.add_argument_group("reporting")
    g.add_argument("--format", choices=("text", "json", "sarif", "junit", "html"), default="text",
                   help="text for people (default); json/sarif/junit for machines (stdout is data only); "
                        "html: one self-contained page with charts, written to -o FILE (or to stdout when "
                        "it is not a terminal)")
    g.add_argument("--fail-on", choices=("error", "warning", "info", "never"), default="error",
                   help="exit 1 when a finding is at or above this severity (default: error); a "
                        "crashed check counts as an error")
    g.add_argument("--select", action="append", default=[], metavar="ID",
                   help="run only checks with this id or id prefix (repeatable, or comma-separated)")
    g.add_argument("--ignore", action="append", default=[], metavar="ID",
                   help="skip checks with this id or id prefix (repeatable, or comma-separated)")
    g.add_argument("--output", "-o", metavar="FILE",
                   help="also write the report to FILE (with --format html: write it only there)")
    g.add_argument("--html", metavar="FILE", dest="html",
                   help="also write the HTML report to FILE, beside the --format report")
    g.add_argument("--verbose", "-v", action="store_true", help="show passed and skipped checks in full")
    g.add_argument("--source-root", metavar="DIR",
                   help="SARIF: paths are made relative to DIR (default: the git checkout holding the "
                        "script, else its directory)")
    p.add_argument("--try", dest="try_", action="store_true",
                   help="then measure the fix of each finding that is a knob (diag try, docs/try.md): its "
                        "message gets the measured speed-up with its 95%% interval (runs the script again)")
    b = p.add_argument_group("comparing with a baseline (diag compare; docs/ci.md)")
    b.add_argument("--baseline", metavar="FILE",
                   help="compare this run with a saved one (JSON report, evidence.json or run directory)")
    b.add_argument("--max-regression", action="append", metavar="PCT|METRIC=PCT,...",
                   help="with --baseline: largest tolerated regression, 5%% or step=5%%,memory=10%% (default 5%%)")
    b.add_argument("--force", action="store_true",
                   help="with --baseline: compare even when run kind, batch, world size or device differ")
    b.add_argument("--min-runs", type=int, default=None, metavar="N",
                   help="with --baseline: gate timing metrics from one run per side with 1 (default: "
                        "reported, not gated: one run says nothing of run-to-run noise)")


def _split(values: list[str]) -> list[str]:
    out = []
    for v in values:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def refuse_report(path: str) -> None:
    """A JSON report given where evidence is expected (``--from report.json``) is one sentence naming
    the evidence it was made from, not a run judged as having 0 steps."""
    import json
    import os
    import re

    try:
        if not os.path.isfile(path):
            return
        with open(path, "rb") as f:
            head = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return
    if not re.search(r'"tool"\s*:\s*\{\s*"name"\s*:\s*"diag"', head):
        return
    m = re.search(r'"evidence"\s*:\s*("(?:[^"\\]|\\.)*")', head)
    hint = None
    if m:
        try:
            hint = f"diag check --from {json.loads(m.group(1))}"
        except ValueError:
            hint = None
    raise DiagError(f"{path!r} is a diag report, not evidence: --from judges an evidence.json (or its run "
                    "directory); the report names the evidence it was made from", hint=hint)


def load_from(paths: list[str]):
    from diag.evidence import load_evidence

    for p in paths:
        refuse_report(p)
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
    # bad selections are usage errors, found before anything runs (and so are bad -o/--html: run())
    registry = Registry.discover().select(_split(args.select), _split(args.ignore))
    machine = args.format != "text"
    if args.from_:
        evidence = load_from(args.from_)
        interrupted = False
    else:
        from diag.runner import Run
        from diag.slurm import CheckPart

        cfg = run_config(args, echo="stderr" if machine else echo_default)
        slurm = CheckPart.for_check(args, cfg)     # one task of a Slurm step (diag/slurm.py), or None
        run = Run(cfg)
        how = (f"under torchrun, {run.config.nproc_per_node} process(es) per node, the probe in every rank"
               if run.config.nproc_per_node else "under the probe")
        from diag.sanitize import for_terminal

        sys.stderr.write(f"diag: running {for_terminal(run.script)} {how} "
                         f"(run directory {for_terminal(run.run_dir)})\n")
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
        args._disk_error = run.disk_error
        if run.run_deleted:
            sys.stderr.write(f"diag: the script deleted its run directory {run.run_dir}; the report below "
                             "holds what was read before that (log.txt is lost)\n")
        if slurm is not None and not interrupted:
            merged, line = slurm.finish(evidence)
            if merged is None:
                args._slurm_part = line         # another task reports on the whole job
                return evidence, []
            evidence = merged
    findings = registry.run(evidence)   # probe or attach evidence alike: each check knows what it can judge
    return evidence, findings


def execute_script(script: str, script_args: list[str], *, steps=None, max_time=None, select=(), ignore=()):
    """Run one script under the probe, quietly (its output to the run's log), and judge it."""
    import argparse

    ns = argparse.Namespace(script=script, from_=None, select=list(select), ignore=list(ignore),
                            format="json", steps=steps, max_time=max_time, run_dir=None,
                            script_args=script_args, simulate_gpus=None, gpu_interval=1.0)
    return execute(ns)


def check_outputs(args, example: str = "diag check --script train.py --format html -o report.html") -> None:
    """Usage errors of the report options, found before anything runs: -o/--html must name a file in
    an existing, writable directory, never one of the run's inputs (the script, a file among its
    arguments, the evidence or baseline read, the run directory's own files) nor each other; HTML is
    never written to a terminal (``example`` is the hint). The paths are made absolute here, so that
    nothing that changes the current directory later moves where the report lands."""
    import os

    output = getattr(args, "output", None)
    if args.format == "html" and not output and sys.stdout.isatty():
        raise DiagError("--format html writes a web page, which a terminal cannot show: give -o FILE "
                        "(or redirect stdout to a file)", hint=example)
    inputs = protected_inputs(args)
    seen: dict[str, str] = {}
    for opt, dest in (("-o", "output"), ("--html", "html")):
        path = getattr(args, dest, None)
        if not path:
            continue
        parent = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            raise DiagError(f"{opt} {path!r} is a directory: give a file name, e.g. {os.path.join(path, 'report.html')!r}")
        if not os.path.isdir(parent):
            raise DiagError(f"cannot write the report to {path!r}: the directory {parent!r} does not exist")
        if not os.access(parent, os.W_OK):
            raise DiagError(f"cannot write the report to {path!r}: the directory {parent!r} is not writable")
        for what, other in inputs:
            if same_file(path, other):
                raise DiagError(f"{opt} {path!r} is {what}: diag never writes over an input of the run; "
                                "give another file name for the report")
        key = os.path.realpath(path)
        if key in seen:
            raise DiagError(f"{opt} and {seen[key]} both name {path!r}: give each report its own file")
        seen[key] = opt
        setattr(args, dest, os.path.abspath(path))


def protected_inputs(args) -> list[tuple[str, str]]:
    """(what it is, path) for every file a command reads or owns that a report must never replace."""
    import os

    out: list[tuple[str, str]] = []
    script = getattr(args, "script", None)
    if script:
        out.append(("the training script", script))
    for a in getattr(args, "script_args", None) or []:
        for part in (a, a.split("=", 1)[-1]):
            if part and os.path.isfile(part):
                out.append(("a file among the script's arguments", part))
    froms = getattr(args, "from_", None) or []
    for f in [froms] if isinstance(froms, str) else froms:
        out.append(("the evidence read by --from", f))
        out.append(("the evidence read by --from", os.path.join(f, "evidence.json")))
    for dest, what in (("baseline", "the baseline read by --baseline"), ("base", "the baseline compared"),
                       ("new", "the run compared")):
        spec = getattr(args, dest, None)
        if isinstance(spec, str) and spec:
            parts = [x.strip() for x in spec.split(",") if x.strip()] if dest != "baseline" else [spec]
            for part in parts:
                out.append((what, part))
                out.append((what, os.path.join(part, "evidence.json")))
    run_dir = getattr(args, "run_dir", None)
    if run_dir:
        from diag.runner import RUN_FILES

        for name in RUN_FILES:
            if "*" not in name:
                out.append(("a file diag writes in --run-dir", os.path.join(run_dir, name)))
        out.append(("a file diag writes in --run-dir", os.path.join(run_dir, "events.rank0.jsonl")))
    return out


def same_file(a: str, b: str) -> bool:
    """The same file: one inode (hard links, symlinks), or the same resolved path."""
    import os

    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
        return os.path.realpath(a) == os.path.realpath(b)
    except OSError:
        return False


def run(args) -> int:
    check_outputs(args)
    if getattr(args, "source_root", None):
        from pathlib import Path

        if not Path(args.source_root).is_dir():
            raise DiagError(f"--source-root {args.source_root!r} is not a directory")
    baseline = None
    thresholds = None
    if getattr(args, "baseline", None):
        from diag.compare import extract
        from diag.compare.core import parse_thresholds

        if args.format == "sarif":
            raise DiagError("--baseline reports in text, json, junit or html; SARIF holds findings only")
        thresholds = parse_thresholds(args.max_regression)
        baseline = extract.load(args.baseline, select=_split(args.select), ignore=_split(args.ignore))
    elif getattr(args, "max_regression", None) or getattr(args, "force", False) or getattr(args, "min_runs", None):
        raise DiagError("--max-regression and --force only apply with --baseline FILE")
    evidence, findings = execute(args)
    part = getattr(args, "_slurm_part", None)
    if part:    # a Slurm task that is not the last to finish: one line, no report
        out = sys.stdout if args.format == "text" else sys.stderr    # machine formats: stdout is data only
        out.write(f"diag: {part}\n")
        out.flush()
        if getattr(args, "_disk_error", None):
            raise DiagError(args._disk_error)
        return ExitCode.SCRIPT_FAILED if evidence.run.status in ("failed", "oom", "killed") else ExitCode.OK
    if getattr(args, "try_", False):
        _measure(args, evidence, findings)
    code = exit_code_for(evidence, findings, args.fail_on)
    comparison = None
    if baseline is not None:
        comparison, code = _compare(args, baseline, evidence, findings, code, thresholds)
    disk = getattr(args, "_disk_error", None)
    if disk:
        code = ExitCode.USAGE
    _emit(args, evidence, findings, code, comparison)
    if disk:   # the report above holds what was observed; say why the run ended, last, in one sentence
        raise DiagError(disk)
    return code


def _measure(args, evidence, findings) -> None:
    """--try: each finding that is a knob gets its measured effect (diag/trial/annotate.py)."""
    if args.from_ or not args.script:
        raise DiagError("--try runs the script again with each fix applied: give --script, not --from",
                        hint="diag try --from EVIDENCE --script train.py takes the knobs from a saved run")
    if evidence.run.status in ("failed", "oom", "killed", "interrupted"):
        sys.stderr.write("diag: --try skipped: the script did not finish its run on its own\n")
        return
    from diag.trial.annotate import annotate

    annotate(evidence, findings, evidence.run.script or args.script, list(getattr(args, "script_args", []) or []),
             steps=args.steps, progress=lambda s: (sys.stderr.write(f"diag try: {s}\n"), sys.stderr.flush()))


def _compare(args, baseline, evidence, findings, code, thresholds):
    """(Comparison or None, the worse exit code of the check and the comparison)."""
    from diag.compare import extract
    from diag.compare.core import compare

    new = extract.from_evidence(evidence, findings, evidence.run.run_dir or "this run")
    try:
        kw = {"min_runs": args.min_runs} if getattr(args, "min_runs", None) else {}
        comparison = compare([baseline], [new], thresholds=thresholds, force=args.force, **kw)
    except DiagError as e:
        sys.stderr.write(f"diag: cannot compare with the baseline: {e.message}\n")
        return None, _worse(code, ExitCode.USAGE)
    return comparison, _worse(code, comparison.exit_code)


def _worse(a: int, b: int) -> int:
    """The worse of two exit codes: interrupted > script failed > bad input > findings > ok."""
    order = {ExitCode.OK: 0, ExitCode.FINDINGS: 1, ExitCode.USAGE: 2, ExitCode.SCRIPT_FAILED: 3,
             ExitCode.INTERRUPTED: 4}
    return max(a, b, key=lambda c: order.get(c, 2))


def _emit(args, evidence, findings, code: int, comparison=None) -> None:
    from pathlib import Path

    from diag.report import render
    from diag.report.json import render_json

    run_dir = evidence.run.run_dir if not args.from_ else None
    if run_dir and Path(run_dir).is_dir():
        try:
            write_private(Path(run_dir) / "report.json", render_json(evidence, findings, code, comparison))
        except OSError:
            pass
    if args.format == "text":
        from rich.console import Console

        if evidence.run.status in ("failed", "oom"):
            sys.stdout.flush()
        from diag.commands._common import stdout_console

        console = stdout_console(soft_wrap=False)
        from diag.report.console import render_console

        render_console(evidence, findings, console, verbose=args.verbose)
        if comparison is not None:
            from diag.report.compare import render_text
            console.print()
            render_text(comparison, console)
        if args.output:
            rec = Console(record=True, file=open("/dev/null", "w"), width=100)
            render_console(evidence, findings, rec, verbose=args.verbose)
            if comparison is not None:
                from diag.report.compare import render_text
                render_text(comparison, rec)
            write_report(args.output, rec.export_text())
    elif args.format == "html":
        text = render("html", evidence, findings, code, comparison=comparison)
        if args.output:
            write_report(args.output, text)
            sys.stderr.write(f"diag: HTML report written to {args.output}\n")
        else:
            sys.stdout.write(text)
            sys.stdout.flush()
    else:
        kw = {"fail_on": args.fail_on} if args.format == "junit" else {}
        if args.format == "sarif":
            kw = {"source_root": getattr(args, "source_root", None)}
        if args.format == "json":
            text = render_json(evidence, findings, code, comparison)
        elif args.format == "junit" and comparison is not None:
            text = _junit_with_comparison(render(args.format, evidence, findings, code, **kw), comparison)
        else:
            text = render(args.format, evidence, findings, code, **kw)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        if args.output:
            write_report(args.output, text + "\n")
    html_path = getattr(args, "html", None)
    if html_path:
        write_report(html_path, render("html", evidence, findings, code, comparison=comparison))
        sys.stderr.write(f"diag: HTML report written to {html_path}\n")
    if comparison is not None:
        import os

        if os.environ.get("GITHUB_ACTIONS") == "true":
            from diag.report.compare import render_annotations
            sys.stderr.write(render_annotations(comparison) + "\n")


def _junit_with_comparison(check_xml: str, comparison) -> str:
    """The check's <testsuite> and the comparison's, under one <testsuites>."""
    from xml.etree import ElementTree as ET

    from diag.report.compare import render_junit

    root = ET.fromstring(render_junit(comparison))
    check = ET.fromstring(check_xml)
    if check.tag == "testsuites":
        suites = list(check)
    else:
        suites = [check]
    for i, s in enumerate(suites):
        root.insert(i, s)
    for attr in ("tests", "failures", "errors"):
        root.set(attr, str(sum(int(s.get(attr, "0")) for s in root)))
    return ET.tostring(root, encoding="unicode")


def write_private(path, text: str) -> None:
    """Write a file of the run directory readable by its owner only (0600), like the rest of it."""
    import os

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(path, 0o600)


