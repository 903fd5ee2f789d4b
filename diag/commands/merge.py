"""``diag merge DIR``: judge a Slurm job's shared run directory as one job (diag/slurm.py)."""
from __future__ import annotations

import sys

from diag.errors import DiagError, exit_code_for

DESCRIPTION = """\
Merge the parts of a Slurm job that `srun diag check ...` wrote into one shared run directory (one
part per task: per node with torchrun, or per rank), and report on the whole job, as the last task
to finish does by itself. Use it when that task was killed, or to judge the job again. Executes
nothing. The merged evidence is written to DIR/evidence.json and the report to DIR/report.json."""

EPILOG = """\
examples:
  diag merge .diag/runs/slurm-812345.0                 the job's report (text)
  diag merge .diag/runs/slurm-812345.0 --format json > report.json
  diag merge .diag/runs/slurm-812345.0 --partial       judge the parts that are there (a node died)
  diag check --from .diag/runs/slurm-812345.0          re-judge the merged evidence later

exit codes: 0 nothing at or above --fail-on · 1 findings at or above it · 2 usage, bad input, or an
            incomplete job (the message names the missing tasks and nodes) · 3 the job's script failed
"""


def add_arguments(p) -> None:
    p.add_argument("dir", metavar="DIR", help="the Slurm job directory (diag check's --run-dir under srun, "
                   "by default .diag/runs/slurm-<job id>.<step id>)")
    p.add_argument("--partial", action="store_true",
                   help="judge the parts that are there when some are missing (said in the report)")
    p.add_argument("--format", choices=("text", "json", "sarif", "junit", "html"), default="text")
    p.add_argument("--fail-on", choices=("error", "warning", "info", "never"), default="error")
    p.add_argument("--select", action="append", default=[], metavar="ID")
    p.add_argument("--ignore", action="append", default=[], metavar="ID")
    p.add_argument("--output", "-o", metavar="FILE", help="also write the report to FILE")
    p.add_argument("--verbose", "-v", action="store_true", help="show passed and skipped checks in full")


def run(args) -> int:
    import os

    from diag.commands.check import _emit, _split
    from diag.registry import Registry
    from diag.slurm import merge_dir

    if args.format == "html" and not args.output and sys.stdout.isatty():
        raise DiagError("--format html writes a web page, which a terminal cannot show: give -o FILE")
    registry = Registry.discover().select(_split(args.select), _split(args.ignore))
    evidence = merge_dir(args.dir, partial=args.partial)
    try:
        evidence.save(os.path.join(evidence.run.run_dir, "evidence.json"))
        os.chmod(os.path.join(evidence.run.run_dir, "evidence.json"), 0o600)
    except OSError as e:
        sys.stderr.write(f"diag: cannot write the merged evidence into {evidence.run.run_dir}: {e.strerror}\n")
    findings = registry.run(evidence)
    code = exit_code_for(evidence, findings, args.fail_on)
    args.from_ = None          # _emit writes report.json into the job directory, as the last task does
    args.html = None
    args.source_root = None
    _emit(args, evidence, findings, code)
    return code
