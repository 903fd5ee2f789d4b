"""The ``diag`` command line. Importing this module must stay cheap: no torch, no textual.

Each sub-command lives in ``diag/commands/<name>.py`` with ``add_arguments(parser)`` and
``run(args) -> int``; heavy imports happen inside ``run``.
"""
from __future__ import annotations

import argparse
import importlib
import shlex
import sys

from diag import __version__
from diag.errors import DiagError, ExitCode, Terminated, on_stop_signals

# name -> (module, one-line help). Order is the order in `diag --help`.
COMMANDS: dict[str, tuple[str, str]] = {
    "check": ("diag.commands.check", "run a training script under the probe and report findings (CI-friendly)"),
    "tui": ("diag.commands.tui", "the terminal app: findings live as a script runs, GPU panes, cost calculator"),
    "attach": ("diag.commands.attach", "diagnose a training job that is already running (PID), without restarting it"),
    "memory": ("diag.commands.memory", "what fits: peak memory by category, largest batch, gradient accumulation (no GPU needed)"),
    "cost": ("diag.commands.cost", "FLOPs, GPU-hours, days and money for training and evaluation (formula or measured run)"),
    "gpus": ("diag.commands.gpus", "the GPUs now, per device and per process, plus host CPU/RAM (--json, --watch)"),
    "compare": ("diag.commands.compare", "two runs side by side, noise-aware: step time and its phases, memory, MFU, findings (CI gate)"),
    "merge": ("diag.commands.merge", "judge a Slurm job's shared run directory (srun diag check ...) as one job"),
    "checks": ("diag.commands.checks", "list every check: id, severity, what it looks for and its source"),
    "try": ("diag.commands.try_", "measure a fix before making it: knobs applied from outside, speed-up with a 95%% interval"),
    "demo": ("diag.commands.demo", "run `diag check` on a bundled training script with planted problems"),
}

EPILOG = """\
examples:
  diag demo                                          see what diag finds in a script with planted problems
  diag check --script train.py -- --epochs 1         run train.py (with its own arguments) and report
  diag check --script train.py --steps 50 --format json > report.json
  diag check --from .diag/runs/<id>/evidence.json    re-judge a saved run; executes nothing
  diag tui --script train.py                         the same, live, in a terminal app
  diag memory --script train.py --gpu a100-80gb      what batch fits, without the GPU
  diag cost --params 7B --tokens 140B --gpu h100 --count 8
  diag attach 12345                                  a job already running: where its time goes, is it stuck
  diag gpus                                          the GPUs now (--simulate-gpus healthy-8 without one)
  diag compare base.json new.json --max-regression 5%   did this change make training slower?
  diag checks                                        the catalogue of checks
  diag COMMAND --help                                every option of a command, with examples

exit codes: 0 nothing at or above --fail-on · 1 findings at or above it · 2 usage or bad input
            3 the script failed (its traceback is shown, findings still come out) · 130 interrupted
"""


_ARGV: list[str] = []      # diag's own arguments (before any --), for a hint that rewrites them
_SCRIPT_ARGS: list[str] = []   # and the script's (after it)
_COMMANDS_BUILT: set[str] = set()   # the commands the parser knows
_TAKES_SCRIPT: set[str] = set()     # those of them with a --script option


def _script_hint(message: str) -> str | None:
    """`diag check train.py --epochs 3` (the script as `python` takes it): the same line with the
    script after --script and what followed it after --, or None when no unrecognized argument is a
    Python file or the command takes no --script."""
    if not message.startswith("unrecognized arguments: ") or not _ARGV or _ARGV[0] not in _TAKES_SCRIPT:
        return None
    rest = _ARGV[1:]
    unknown = message[len("unrecognized arguments: "):]
    at = next((i for i, a in enumerate(rest) if a.endswith(".py") and not a.startswith("-") and a in unknown), None)
    if at is None:
        return None
    own = [shlex.quote(a) for a in rest[:at]]
    theirs = [shlex.quote(a) for a in rest[at + 1:] + _SCRIPT_ARGS]
    line = " ".join(["diag", _ARGV[0], *own, "--script", shlex.quote(rest[at])] + (["--", *theirs] if theirs else []))
    return f"the script goes after --script, and its own arguments after --: {line}"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one sentence and where to look, exit 2
        sys.stderr.write(f"diag: error: {message}\n")
        hint = _script_hint(message)
        # (argparse reports a command's unrecognized arguments from the top parser: name the command)
        prog = f"diag {_ARGV[0]}" if self.prog == "diag" and _ARGV and _ARGV[0] in _COMMANDS_BUILT else self.prog
        sys.stderr.write(f"hint: {hint}\n" if hint else f"hint: '{prog} --help' lists the options\n")
        sys.exit(ExitCode.USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="diag", description="Find out why a PyTorch training job is slow or runs out of "
                     "memory, and what to change.", epilog=EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"diag {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, (modname, help_text) in COMMANDS.items():
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=help_text, description=getattr(mod, "DESCRIPTION", help_text),
                           epilog=getattr(mod, "EPILOG", None),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_module=mod)
        _COMMANDS_BUILT.add(name)
        if "--script" in p._option_string_actions:
            _TAKES_SCRIPT.add(name)
    return parser


def split_script_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """Everything after the first ``--`` belongs to the user's script."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def _stop_like_ctrl_c() -> None:
    """SIGTERM and SIGHUP raise :class:`Terminated` in the main thread, at any moment (while the
    script runs, while checks run, while a large --from file loads): what Ctrl-C ends cleanly, they
    end cleanly (processes ended, temporary files removed, one line, exit 130)."""
    import signal

    def handler(signum, frame):
        raise Terminated(signal.Signals(signum).name)

    on_stop_signals(handler, only_if_default=True)


# what a terminal that cannot show them gets instead (a non-UTF-8 locale, PYTHONIOENCODING=ascii)
_ASCII = {"—": "-", "–": "-", "≈": "~", "×": "x", "…": "...", "µ": "u", "≥": ">=", "≤": "<=", "→": "->",
          "←": "<-", "·": "-", "•": "*", "✓": "v", "✗": "x", "│": "|", "─": "-", "▶": ">", "‘": "'", "’": "'",
          "“": '"', "”": '"', "±": "+/-", "°": "deg", "Δ": "delta "}


def _plain(err: UnicodeError):
    if not isinstance(err, UnicodeEncodeError):
        raise err
    text = err.object[err.start:err.end]
    out = "".join(_ASCII.get(c, c.encode("ascii", "backslashreplace").decode("ascii")) for c in text)
    return out, err.end


def _encodable_streams() -> None:
    """stdout and stderr never raise UnicodeEncodeError: a character the locale's encoding cannot
    hold is written in plain ASCII (— as -, ≈ as ~) or escaped (a lone surrogate as \\ud800)."""
    import codecs

    try:
        codecs.lookup_error("diag-plain")
    except LookupError:
        codecs.register_error("diag-plain", _plain)
    for stream in (sys.stdout, sys.stderr):   # (under UTF-8 only a lone surrogate needs it)
        try:
            stream.reconfigure(errors="diag-plain")
        except (AttributeError, ValueError, OSError):
            pass


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _encodable_streams()
    own, script_args = split_script_args(argv)
    _ARGV[:], _SCRIPT_ARGS[:] = own, script_args
    parser = build_parser()
    args = parser.parse_args(own)
    args.script_args = script_args
    if not getattr(args, "command", None):
        parser.print_help()
        return ExitCode.USAGE
    _stop_like_ctrl_c()           # (while its app runs, the TUI closes it first: diag/commands/tui.py)
    try:
        _cwd_exists()
        return int(args._module.run(args))
    except DiagError as e:
        sys.stderr.write(f"diag: error: {e.message}\n")
        if e.hint:
            sys.stderr.write(f"hint: {e.hint}\n")
        return e.code
    except KeyboardInterrupt as e:
        how = f" by {e.name}" if isinstance(e, Terminated) else ""
        _quiet_write(f"diag: interrupted{how}\n")
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        return _closed_stdout()
    except OSError as e:
        import errno

        if e.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG):
            raise
        # the report does not fit where it goes (> /dev/full, a full disk, a dead terminal)
        where = f"to {e.filename!r}" if e.filename else "to stdout"
        if not e.filename:
            _closed_stdout()
        _quiet_write(f"diag: error: cannot write the report {where}: {e.strerror or e}\n")
        return ExitCode.USAGE


def _cwd_exists() -> None:
    import os

    try:
        os.getcwd()
    except OSError:
        raise DiagError("the current directory no longer exists (it was deleted or moved): "
                        "cd to an existing directory and run diag again") from None


def _quiet_write(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _closed_stdout() -> int:
    """stdout was a pipe and its reader went away (``diag check ... | head -1``): end quietly, the
    conventional way: no traceback, no "Exception ignored" at exit, the status of a process ended by
    SIGPIPE (128 + 13)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 141


def entry() -> None:
    code = main()
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        code = _closed_stdout()
    except OSError as e:   # the last buffered bytes of the report did not fit (> /dev/full)
        _closed_stdout()
        _quiet_write(f"diag: error: cannot write the report to stdout: {e.strerror or e}\n")
        code = ExitCode.USAGE
    sys.exit(code)


if __name__ == "__main__":
    entry()
