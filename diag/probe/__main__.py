"""``python -m diag.probe SCRIPT [ARGS...]``: run SCRIPT as ``__main__`` under the probe.

Started by diag's runner in a child process (or in every rank under torchrun). Configured by
environment variables:

- ``DIAG_EVENTS``: the JSON-lines file to append events to (required). Under torchrun, a ``{rank}``
  placeholder in it is replaced by the rank.
- ``DIAG_MAX_STEPS``: stop the script after this many training steps.
- ``DIAG_DEFER_TRACEBACK``: when set (diag's runner sets it under torchrun), the user's traceback is
  recorded but not printed here; diag prints the first failing rank's traceback once.

Exit status: the script's own (0 when diag stopped it at a limit, 1 for an uncaught exception).
"""
from __future__ import annotations

import os
import io
import signal
import sys
import threading



def _in_import(frame, depth: int = 64) -> bool:
    """Whether ``frame`` runs inside an import statement (importlib's frames are on its stack)."""
    while frame is not None and depth > 0:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
        depth -= 1
    return False

def _show_uncaught(exc: BaseException, script: str, text) -> None:
    """Show the script's uncaught exception as a bare run does: through the script's own
    ``sys.excepthook`` where it installed one (rich's, pretty_errors'), with diag's frames taken out of
    the traceback; otherwise the traceback ``text()`` (the one Python's hook prints). Python sets
    ``sys.last_*`` first (a post-mortem debugger reads them)."""
    from diag.probe.frames import as_bare

    try:
        hook = sys.excepthook
        if hook is not sys.__excepthook__:
            as_bare(exc, script)
            sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, exc.__traceback__
            try:
                hook(type(exc), exc, exc.__traceback__)
                sys.stderr.flush()
                return
            except Exception:
                pass            # a hook that fails: the plain traceback, as Python falls back to it
        sys.stderr.write(text())
        sys.stderr.flush()
    except Exception:
        pass


def _run_main(path: str, argv0: str) -> None:
    """``runpy.run_path(path, run_name="__main__")``, with ``sys.argv[0]`` left as ``argv0``: run_path
    sets it to the path it runs, and ``python train.py`` has ``__file__`` absolute but ``argv[0]`` as
    typed (a script that saves its command line writes the same file under diag)."""
    import builtins
    import types
    from importlib.machinery import SourceFileLoader

    with io.open_code(path) as f:
        code = compile(f.read(), path, "exec")
    main = types.ModuleType("__main__")
    # the names Python's own __main__ has for `python script.py`: __builtins__ the module (exec would put
    # its dict there, and `__builtins__.profile = ...` would fail), a SourceFileLoader, __annotations__
    main.__dict__.update(__file__=path, __cached__=None, __doc__=None, __loader__=SourceFileLoader("__main__", path),
                         __package__=None, __spec__=None, __builtins__=builtins, __annotations__={})
    saved_main, saved_argv0 = sys.modules.get("__main__"), sys.argv[0] if sys.argv else None
    sys.modules["__main__"] = main
    sys.argv[0] = argv0
    try:
        exec(code, main.__dict__)
    finally:
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        if sys.argv and saved_argv0 is not None:
            sys.argv[0] = saved_argv0


def main() -> int:
    if len(sys.argv) < 2:
        print("usage: python -m diag.probe SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    script = os.path.abspath(sys.argv[1])
    args = sys.argv[2:]
    rank = int(os.environ.get("RANK", "0") or 0)
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    events = os.environ.get("DIAG_EVENTS")
    if not events:
        print("diag.probe: DIAG_EVENTS is not set", file=sys.stderr)
        return 2
    events = events.replace("{rank}", str(rank))
    max_steps = os.environ.get("DIAG_MAX_STEPS")

    from diag.probe import watchdog

    watchdog.restore_environment()
    watchdog.setup()    # dies with diag (or torchrun's launcher), taking the run's processes along

    from diag.probe.core import DiagStop, FileSink, Probe, is_oom
    from diag.probe.extensions import load_extensions

    sink = watchdog.TaggedSink(FileSink(events), events)
    probe = Probe(sink, max_steps=int(max_steps) if max_steps else None, rank=rank,
                  local_rank=local_rank, world_size=world, extensions=load_extensions(), script=script)

    terminated = []

    def on_term(signum, frame):
        # once: a second SIGTERM (torchrun forwards diag's) must not interrupt the clean-up
        if terminated:
            return
        if _in_import(frame):
            # raised inside an import (torch's, at start-up) the stop can surface inside a C++ callback
            # of the extension being loaded and abort the process (pybind11: terminate called after
            # error_already_set); it is delivered again until the import is over (diag kills the run
            # after its grace period whatever happens)
            t = threading.Timer(0.02, os.kill, (os.getpid(), signum))
            t.daemon = True
            t.start()
            return
        terminated.append(signum)
        raise DiagStop("terminated by diag" if world == 1 else "terminated by SIGTERM (from diag or torchrun)",
                       "stopped")

    signal.signal(signal.SIGTERM, on_term)

    # python script.py: __file__ absolute (_run_main), argv[0] as typed
    typed = os.environ.pop("DIAG_ARGV0", None)
    argv0 = typed if typed and os.path.abspath(typed) == script else script
    sys.argv = [argv0] + args
    watchdog.script_path(script)    # python script.py's sys.path: the script's directory, not the cwd
    code = 0
    try:
        probe.install()
        _run_main(script, argv0)
        probe.finish("completed", 0)
    except DiagStop as e:
        probe.finish(e.status, 0, reason=e.reason)
    except SystemExit as e:
        c = e.code
        if c is None or c == 0:
            probe.finish("completed", 0)
        else:
            code = c if isinstance(c, int) else 1
            if not isinstance(c, int):
                print(c, file=sys.stderr)
            probe.finish("failed", code, reason=f"the script called sys.exit({c!r})")
    except KeyboardInterrupt as e:
        code = 130
        probe.finish("interrupted", code, exception=e)
        if not terminated and not os.environ.get("DIAG_DEFER_TRACEBACK"):
            # the script's own KeyboardInterrupt (raised by it, or a SIGINT sent to it, not diag's stop):
            # Python prints its traceback in a bare run
            from diag.probe.frames import user_traceback

            _show_uncaught(e, script, lambda: user_traceback(e, script))
    except BaseException as e:  # the user's own error: show their traceback, record it
        from diag.probe.core import exception_info

        if terminated:
            # diag asked the script to stop and the stop surfaced as another exception: a half-done
            # import re-tried by an except clause ("cannot load module more than once per process"
            # when SIGTERM lands inside numpy's import), an `except Exception` around the loop that
            # raises something else. It is the stop, not a failure of the script.
            probe.finish("stopped", 0, reason=("terminated by diag" if world == 1 else
                                               "terminated by SIGTERM (from diag or torchrun)")
                         + f" (it surfaced as {type(e).__name__})")
        else:
            code = 1
            info = exception_info(e, probe.steps_done, script)
            # recorded first: a script that closed its stderr (fd 2) must not lose its own exception
            # from the evidence to the failing write of its traceback (issue 27, class 15)
            probe.finish("oom" if is_oom(e) else "failed", code, exception=e)
            if not os.environ.get("DIAG_DEFER_TRACEBACK"):   # under torchrun diag shows the first failure once
                _show_uncaught(e, script, lambda: info["traceback"])
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        probe.uninstall()
        sink.close()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    return code


if __name__ == "__main__":
    sys.exit(main())
