"""``diag attach PID``: diagnose a training job that is already running, without restarting it."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from diag.commands._common import write_report
from diag.errors import DiagError

DESCRIPTION = """\
Sample a running training process from outside with py-spy (its stacks, its DataLoader workers) and
the GPUs with NVML for a window, then report as diag check does: where the time goes (data, forward,
backward, optimizer, evaluation, host syncs, collectives, checkpointing, logging), whether the
workers keep up, whether the job is stuck and where. The target is only read: never paused, never
signalled, never changed. Needs ptrace rights on the target (same user, or root, or CAP_SYS_PTRACE)."""

EPILOG = """\
examples:
  diag attach 12345                          sample for 10 s, then report (text)
  diag attach 12345 --duration 30 --format json > report.json
  diag attach --job 4321                     a torchrun/launcher PID: every rank under it, side by side
  diag attach --from .diag/runs/attach-1a2b3c4d/evidence.json     re-judge a saved window

exit codes: 0 nothing at or above --fail-on · 1 findings at or above it (a stuck job is an error)
            2 usage, a PID that is missing / not Python / not a training job, no ptrace rights
            130 interrupted
"""


def _pid(text: str) -> int:
    try:
        v = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a process id (a number), got {text!r}") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"a process id is a positive number, got {v}")
    return v


def _duration(text: str) -> float:
    from diag.commands._common import positive_float

    v = positive_float(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"sample for at least 1 second (got {text})")
    if v > 3600:
        raise argparse.ArgumentTypeError(f"sample for at most 3600 seconds (got {text})")
    return v


def _rate(text: str) -> int:
    from diag.commands._common import positive_int

    v = positive_int(text)
    if v > 1000:
        raise argparse.ArgumentTypeError(f"at most 1000 samples a second (got {v})")
    return v


def add_arguments(p) -> None:
    from diag.commands._common import gpu_interval, gpu_scenario

    p.add_argument("pid", nargs="?", type=_pid, metavar="PID", help="the training process to sample")
    p.add_argument("--job", type=_pid, metavar="PID",
                   help="a torchrun/launcher PID: sample every rank under it side by side")
    p.add_argument("--duration", type=_duration, default=10.0, metavar="SECONDS",
                   help="how long to sample (default: 10)")
    p.add_argument("--rate", type=_rate, default=None, metavar="HZ",
                   help="stack samples per second (default: 20; measured cost to the target in docs/attach.md)")
    p.add_argument("--from", dest="from_", metavar="EVIDENCE",
                   help="judge a saved attach evidence.json (or its directory) instead of sampling")
    p.add_argument("--run-dir", metavar="DIR",
                   help="where to save evidence.json and report.json (default: .diag/runs/attach-<id>/)")
    p.add_argument("--any-process", action="store_true",
                   help="sample even when PyTorch is not loaded in the target")
    p.add_argument("--simulate-gpus", type=gpu_scenario, metavar="SCENARIO",
                   help="use simulated GPUs instead of NVML (every report then says 'simulated')")
    p.add_argument("--gpu-interval", type=gpu_interval, default=1.0, metavar="SECONDS",
                   help="seconds between GPU samples (default: 1)")
    g = p.add_argument_group("reporting (as diag check)")
    g.add_argument("--format", choices=("text", "json"), default="text",
                   help="text for people (default); json for machines (stdout is data only)")
    g.add_argument("--fail-on", choices=("error", "warning", "info", "never"), default="error",
                   help="exit 1 when a finding is at or above this severity (default: error)")
    g.add_argument("--select", action="append", default=[], metavar="ID", help="report only these ids/prefixes")
    g.add_argument("--ignore", action="append", default=[], metavar="ID", help="leave out these ids/prefixes")
    g.add_argument("--output", "-o", metavar="FILE", help="also write the report to FILE")
    g.add_argument("--verbose", "-v", action="store_true", help="show passed and skipped checks in full")


def _split(values):
    out = []
    for v in values:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def gather(args):
    """Sample (or load) -> Evidence."""
    from diag.attach.evidence import is_attach, window_to_evidence
    from diag.attach.session import DEFAULT_RATE_HZ, sample

    given = [x for x in (args.pid is not None, args.job is not None, bool(args.from_)) if x]
    if len(given) > 1:
        raise DiagError("give one of PID, --job PID or --from EVIDENCE")
    if not given:
        raise DiagError("nothing to attach to: give the PID of a running training process (or --job PID, "
                        "or --from EVIDENCE)", hint="ps -ef | grep python lists the candidates")
    if args.from_:
        from diag.commands.check import refuse_report
        from diag.evidence import load_evidence
        refuse_report(args.from_)
        ev = load_evidence(args.from_)
        if not is_attach(ev):
            raise DiagError(f"{args.from_} was not written by diag attach; judge it with diag check --from")
        return ev
    if args.pid is not None and args.pid == os.getpid():
        raise DiagError("PID is diag's own process; give the training process's PID")
    if args.pid is not None:
        from diag.attach.target import describe, ranks_under

        t = describe(args.pid)
        if t.rank is None:
            ranks = ranks_under(args.pid)
            if ranks:
                sys.stderr.write(f"diag: PID {args.pid} is a launcher with {len(ranks)} rank(s) under it; sampling "
                                 f"them side by side (as --job {args.pid})\n")
                args.job, args.pid = args.pid, None
    rate = args.rate or DEFAULT_RATE_HZ
    machine = args.format != "text"
    what = f"the ranks under PID {args.job}" if args.job is not None else f"PID {args.pid}"

    def progress(_msg: str) -> None:
        sys.stderr.write(f"diag: sampling {what} for {args.duration:g} s at {rate} Hz (the target is not paused)\n")
        sys.stderr.flush()

    w = sample(pid=args.pid, job=args.job, duration=args.duration, rate=rate,
               simulate_gpus=args.simulate_gpus, gpu_interval=args.gpu_interval,
               require_torch=not args.any_process, on_progress=progress)
    ev = window_to_evidence(w)
    run_dir = Path(args.run_dir) if args.run_dir else Path(".diag") / "runs" / \
        f"{time.strftime('%Y%m%d-%H%M%S')}-{ev.run.id}"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        ev.run.run_dir = str(run_dir)
        ev.save(run_dir / "evidence.json")
    except OSError as e:
        ev.run.run_dir = None
        if not machine:
            sys.stderr.write(f"diag: could not save the evidence in {run_dir}: {e.strerror}\n")
    return ev


def run(args) -> int:
    from diag.commands.check import check_outputs, exit_code_for
    from diag.registry import Registry

    check_outputs(args, example="diag attach PID -o report.txt")   # never over the evidence it reads

    # the one registry, as diag check: checks that sampling cannot answer report themselves skipped;
    # a bad --select/--ignore is a usage error before any sampling
    registry = Registry.discover().select(_split(args.select), _split(args.ignore))
    ev = gather(args)
    findings = registry.run(ev)
    code = exit_code_for(ev, findings, args.fail_on)
    text_json = report_json(ev, findings, code)
    if ev.run.run_dir and not args.from_:
        try:
            (Path(ev.run.run_dir) / "report.json").write_text(text_json)
        except OSError:
            pass
    if args.format == "json":
        sys.stdout.write(text_json + "\n")
        sys.stdout.flush()
        if args.output:
            write_report(args.output, text_json + "\n")
    else:
        from rich.console import Console

        from diag.attach.report import render_text
        render_text(ev, findings, Console(soft_wrap=False), verbose=args.verbose)
        if args.output:
            rec = Console(record=True, file=open(os.devnull, "w"), width=120)
            render_text(ev, findings, rec, verbose=args.verbose)
            write_report(args.output, rec.export_text())
    return code


def report_json(ev, findings, code: int) -> str:
    """diag check's JSON report plus ``source: "attach"`` and what each process did (``attach``: one
    entry per sampled process, the shape of ``ranks[].extras.attach`` in docs/attach.md)."""
    import json

    from diag.attach.evidence import attach_section
    from diag.report.json import report_dict

    d = report_dict(ev, findings, code)
    d["source"] = "attach"
    d["attach"] = [dict(rank=r.rank, **attach_section(r)) for r in ev.ranks]
    return json.dumps(d, indent=1, default=str)


