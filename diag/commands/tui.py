"""``diag tui``: the Textual app. Runs a script under the probe and shows findings live, replays a
saved evidence file, or (with neither) watches the GPUs and estimates costs."""
from __future__ import annotations

import sys

from diag.commands._common import add_run_arguments, positive_float, run_config
from diag.errors import DiagError, ExitCode

DESCRIPTION = """\
Open diag's terminal app. With --script it runs the script, unchanged, under the probe and shows the
findings as evidence accumulates (tabs: Checks, Steps, GPUs, Memory, Cost, Log, Try). With --from it
replays a saved evidence.json (nothing is executed). With neither it is a GPU monitor with a cost
calculator. The Try tab, once the script has finished, runs diag try's trials on the knobs its
findings point to (t) and fills the table as each verdict arrives (escape cancels).
Keys: 1-7 tabs · p pause · s stop the script · t run the trials · w save · ? help · q quit (stops the
script, or the trials, and their descendants, then prints where the run directory is)."""

EPILOG = """\
examples:
  diag tui --script train.py -- --epochs 1           run train.py (with its own arguments) live
  diag tui --script train.py --steps 200 --simulate-gpus healthy-8
  diag tui --from .diag/runs/<id>/evidence.json      browse a saved run; executes nothing
  diag tui --attach 12345                            the live app on a job that is already running
  diag tui                                           GPU monitor + cost calculator
  diag tui --simulate-gpus throttling                try the GPU panes without a GPU
  diag tui --script train.py --baseline base.json    the Steps tab shows the deltas per phase

needs an interactive terminal; for CI and pipes use `diag check` (text, json, sarif, junit).
exit codes: 0 closed normally · 2 usage or bad input (or no terminal) · 3 the script failed
"""

NO_TTY = ("diag tui needs an interactive terminal (stdin and stdout must be a TTY); "
          "use `diag check --script train.py` for output that can be piped or saved")


def add_arguments(p) -> None:
    add_run_arguments(p)
    p.add_argument("--from", dest="from_", metavar="EVIDENCE",
                   help="replay a saved evidence.json (or run directory) instead of running a script")
    p.add_argument("--memory-plan", metavar="GPU",
                   help="also plan the batch size for this GPU (catalogue name, e.g. h100, a100-80gb): after "
                        "step 1 the step is replayed on fake tensors (no memory used) and the Memory tab shows "
                        "the largest batch that fits; that step is left out of the timing")
    p.add_argument("--attach", type=_pid, metavar="PID",
                   help="the live app on a training job that is already running: sample it with py-spy in "
                        "windows of 5 s (as diag attach), findings and a log line per window; the job is "
                        "never paused or stopped")
    p.add_argument("--baseline", metavar="FILE",
                   help="show a saved run (JSON report, evidence.json or run directory) beside this one in "
                        "the Steps tab: the median step and each phase, and their deltas")
    p.add_argument("--refresh", type=positive_float, metavar="SECONDS", default=0.5,
                   help="re-judge the evidence at most this often while the script runs (default: 0.5)")


def _pid(text: str) -> int:
    from diag.commands.attach import _pid as parse

    return parse(text)


def _interactive() -> bool:
    try:
        return sys.stdout.isatty() and sys.stdin.isatty()
    except (AttributeError, ValueError):
        return False


def build_gpu(args, *, run=None, replay_evidence=None):
    """The GPU feed the app shows: the run's own sampler (started with the script, recorded into its
    evidence), the telemetry recorded in a replayed evidence file, or a sampler of this machine."""
    from diag.tui.models.gpus import GpuFeed, RecordedGpu

    if run is not None:
        return GpuFeed(run.sampler, own=False) if run.sampler is not None else None
    if replay_evidence is not None and replay_evidence.gpu and not args.simulate_gpus:
        return RecordedGpu(replay_evidence.gpu)
    from diag.gpu.sampler import build_run_sampler, scenario_from_env

    simulate = args.simulate_gpus if args.simulate_gpus is not None else scenario_from_env()
    return GpuFeed(build_run_sampler(simulate or "", args.gpu_interval or 1.0), own=True)


def memory_plan_env(gpu: str) -> dict[str, str]:
    """The probe's settings for a batch-size plan on a catalogue GPU (as `diag memory --gpu` sets them)."""
    import argparse

    from diag.commands.memory import resolve_target

    target = resolve_target(argparse.Namespace(gpu=gpu, memory=None))
    env = {"DIAG_MEMORY_ESTIMATE": "plan", "DIAG_MEMORY_CAPACITY": str(target["memory"]),
           "DIAG_MEMORY_TARGET_NAME": target["name"]}
    if target.get("capability"):
        env["DIAG_MEMORY_CAPABILITY"] = ".".join(str(x) for x in target["capability"])
    return env


def run(args) -> int:
    if args.from_ and args.script:
        raise DiagError("give either --script (run a script) or --from (replay saved evidence), not both")
    if args.script_args and not args.script:
        raise DiagError("arguments after -- are for the script, but no --script was given")
    if args.memory_plan and not args.script:
        raise DiagError("--memory-plan needs a script to run (--script PATH)")
    if args.memory_plan:
        memory_plan_env(args.memory_plan)          # an unknown GPU is a usage error, before anything runs
    if args.attach is not None and (args.from_ or args.script):
        raise DiagError("--attach samples a running job; give it without --script or --from")
    evidence = None
    if args.from_:
        from diag.evidence import load_evidence

        evidence = load_evidence(args.from_)       # a bad file is reported as such, terminal or not
    baseline = None
    if getattr(args, "baseline", None):             # a bad baseline is a usage error, before anything runs
        from diag.compare import extract

        baseline = extract.load(args.baseline)
    if not _interactive():
        raise DiagError(NO_TTY)

    from diag.tui.live import ReplaySource, RunFeed, Source

    run = None
    attach = None
    if args.attach is not None:
        from diag.attach.live import AttachFeed
        from diag.attach.target import describe, require_python, require_training

        t = describe(args.attach)                  # a missing / non-Python / non-torch PID: one sentence, exit 2
        require_python(t)
        require_training(t)
        source = attach = AttachFeed(pid=args.attach, simulate_gpus=args.simulate_gpus,
                                     gpu_interval=args.gpu_interval or 1.0, run_dir=args.run_dir)
        gpu = build_gpu(args)
    elif args.from_:
        source = ReplaySource(evidence, path=args.from_)
        gpu = build_gpu(args, replay_evidence=evidence)
    elif args.script:
        from diag.runner import Run

        cfg = run_config(args, echo=None)          # the app shows the output; nothing goes to the terminal
        if args.memory_plan:
            cfg.env.update(memory_plan_env(args.memory_plan))
        run = Run(cfg)
        source = RunFeed(run)
        gpu = build_gpu(args, run=run)
    else:
        source = Source()
        gpu = build_gpu(args)

    from diag.tui.app import DiagApp

    trials = None
    if args.script:
        trials = TryFeed(args.script, list(args.script_args or []))
    elif args.from_:
        from diag.tui.models.try_ import ReplayFeed

        trials = ReplayFeed(getattr(evidence.run, "script", None))
    app = DiagApp(source, gpu, refresh_s=args.refresh, trials=trials)
    if baseline is not None:
        app.baseline = baseline                     # read by the Steps tab
    terminated: list[str] = []
    restore = _exit_app_on_termination(app, terminated)
    try:
        app.run()
    finally:
        restore()
        if trials is not None and trials.running:   # nothing the trials started outlives diag
            trials.cancel()
            trials.wait_ended(60)
        if run is not None:
            _finish(run, app)
        if attach is not None:
            attach.stop()
            attach.wait_ended(15)
    if attach is not None:
        sys.stderr.write(f"diag: sampled PID {args.attach} in {attach.windows} window(s); the job was not touched\n")
        if attach.error:
            sys.stderr.write(f"diag: {attach.error}\n")
    if terminated:      # the app has put the terminal back as it was; then the clean stop of Ctrl-C
        from diag.errors import Terminated

        raise Terminated(terminated[0])
    if run is not None:
        ev = run.evidence
        from diag.sanitize import for_terminal

        sys.stderr.write(f"diag: the script {ev.run.status}"
                         f"{' (' + for_terminal(ev.run.stop_reason) + ')' if ev.run.stop_reason else ''}; run directory: "
                         f"{run.run_dir} (evidence.json, log.txt, report.json)\n")
        if run.disk_error:
            raise DiagError(run.disk_error)
        if ev.run.status in ("failed", "oom", "killed"):
            return ExitCode.SCRIPT_FAILED
    return ExitCode.OK


def TryFeed(script: str, script_args: list[str]):
    """The Try tab's trial runner: ``diag try``'s engine on the live run's evidence and findings (no
    first run), the script run again in copies of the working directory. The TUI only shows it."""
    import os

    from diag.tui.models.try_ import TrialFeed

    class _Feed(TrialFeed):
        def _run(self, evidence, findings, knobs, *, progress, update, cancel):
            from diag.trial.engine import TryConfig, run_try

            cfg = TryConfig(script=os.path.abspath(script), args=list(script_args), knobs=list(knobs) or None,
                            budget_s=self.budget_s, evidence=evidence, findings=findings, progress=progress,
                            on_update=lambda res: update(res.to_dict()), cancel=cancel)
            return run_try(cfg).to_dict()

    return _Feed()


def _exit_app_on_termination(app, terminated: list):
    """SIGTERM and SIGHUP close the app the way 'q' does, so that Textual restores the terminal (the
    main screen, the cursor, mouse reporting off, the tty's modes); diag then stops as on Ctrl-C.
    Returns a function that restores the previous handlers."""
    import asyncio
    import signal

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if not terminated:
            terminated.append(name)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None:
            from diag.errors import Terminated

            raise Terminated(name)      # before the app runs or after it ended
        loop.call_soon_threadsafe(app.exit)

    from diag.errors import on_stop_signals

    return on_stop_signals(handler)


def _finish(run, app) -> None:
    """Leave nothing behind: stop the script and its descendants, write the final report."""
    from diag.runner import GRACE_S

    if run.proc is not None and run.running:
        run.stop("stopped: diag tui was closed", "stopped")
        try:
            run._done.wait(GRACE_S + 5)
        except KeyboardInterrupt:     # a second Ctrl-C: everything dies now
            run.kill_all()
            run._done.wait(5)
    try:
        from diag.report.json import render_json
        from diag.tui.live import default_checker

        findings = default_checker()(run.evidence)
        from diag.commands.check import write_private
        from diag.errors import exit_code_for

        code = exit_code_for(run.evidence, findings, "error")
        if run.run_dir.is_dir():
            write_private(run.run_dir / "report.json", render_json(run.evidence, findings, code) + "\n")
    except Exception as e:  # the report is a convenience; the evidence is already saved
        sys.stderr.write(f"diag: could not write report.json: {e}\n")
