"""``diag demo``: `diag check` on a bundled script with planted problems."""
from __future__ import annotations

from diag.commands import check as check_cmd

DESCRIPTION = """\
Run `diag check` on a training script bundled with diag that has planted problems (a DataLoader that
starves the model, evaluation without no_grad, gradients zeroed instead of freed, anomaly detection
left on, fp16 autocast without a GradScaler), or on its clean twin with --clean. Exits 0 unless diag itself fails (the planted findings
are the point), unless you pass --fail-on."""
EPILOG = """\
examples:
  diag demo                     the planted problems
  diag demo --clean             the clean twin: nothing at warning level or above
  diag demo --format json
  diag demo -- --epochs 1       arguments for the demo script itself
"""


def add_arguments(p) -> None:
    p.add_argument("--clean", action="store_true", help="run the clean twin instead")
    p.add_argument("--name", default=None, help="run another bundled demo by name")
    p.add_argument("--steps", type=int, default=None, help="stop after N training steps")
    p.add_argument("--max-time", type=float, default=None, help="stop after this many seconds")
    p.add_argument("--run-dir", default=None, help="where to write the run's files")
    p.add_argument("--format", choices=("text", "json", "sarif", "junit"), default="text")
    p.add_argument("--fail-on", choices=("error", "warning", "info", "never"), default="never")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="show passed and skipped checks' messages in full")


def run(args) -> int:
    from diag.demo import demo_path

    name = args.name or ("clean" if args.clean else "planted")
    args.script = str(demo_path(name))
    args.from_ = None
    args.select, args.ignore, args.output = [], [], None
    return check_cmd.run(args)
