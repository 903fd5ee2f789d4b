"""``python -m diag.probe.launch [TORCHRUN OPTIONS] -m diag.probe SCRIPT [ARGS...]``

torchrun (``torch.distributed.run.main``) itself, run by diag's runner for ``--nproc-per-node``, with
three differences that keep the user's terminal readable:

- torchrun's own log lines (the OMP_NUM_THREADS banner, "Sending process ... closing signal",
  "failed (exitcode: 1) local_rank: ...") go to ``DIAG_LAUNCHER_LOG`` (``launcher.log`` in the run
  directory) instead of stderr;
- when a rank fails, torchrun's ChildFailedError report goes to that file too, and what it knows
  about each failed rank (exit code, signal, pid, first observed failure) is appended to the rank's
  event file as ``distributed.launcher_exit`` (a rank killed by a signal writes nothing itself);
  diag then shows the failing rank's traceback once;
- a launcher that cannot start (a bad option, no CUDA for ``--nproc-per-node gpu``, a rendezvous
  that fails) says so in one line.

Exit status: torchrun's (0, or 1 when a rank failed), 2 for a launcher that cannot start, 128+N when
stopped by signal N.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import traceback
from diag.evidence import events as E


def _log_handler() -> logging.Handler:
    path = os.environ.get("DIAG_LAUNCHER_LOG")
    if path:
        try:
            h = logging.FileHandler(path, encoding="utf-8")
            h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            return h
        except OSError:
            pass
    return logging.NullHandler()


def _write_log(text: str) -> None:
    path = os.environ.get("DIAG_LAUNCHER_LOG")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(text if text.endswith("\n") else text + "\n")
    except OSError:
        pass


def _signal_name(code: int) -> str | None:
    if code is not None and code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            return f"signal {-code}"
    return None


def record_failures(err) -> None:
    """Append what torchrun knows about each failed rank to that rank's event file."""
    pattern = os.environ.get("DIAG_EVENTS")
    if not pattern:
        return
    try:
        first_rank, _ = err.get_first_failure()
    except Exception:
        first_rank = None
    for rank, failure in (getattr(err, "failures", None) or {}).items():
        event = {
            "kind": E.MERGE, "t": 0.0, "rank": int(rank), "path": "distributed",
            "run": os.environ.get("DIAG_RUN_ID"),
            "value": {"launcher_exit": {
                "exitcode": getattr(failure, "exitcode", None),
                "signal": _signal_name(getattr(failure, "exitcode", None)),
                "pid": getattr(failure, "pid", None),
                "local_rank": getattr(failure, "local_rank", None),
                "first_observed": rank == first_rank,
                "timestamp": getattr(failure, "timestamp", None),
            }},
        }
        path = pattern.replace("{rank}", str(rank))
        try:
            with open(path, "ab") as f:
                # a rank killed in the middle of a line must not corrupt this event
                if f.tell() > 0:
                    with open(path, "rb") as r:
                        r.seek(-1, os.SEEK_END)
                        if r.read(1) != b"\n":
                            f.write(b"\n")
                f.write((json.dumps(event, default=str) + "\n").encode("utf-8"))
        except OSError:
            pass


def _quiet_torch_logging() -> None:
    """Send torch.distributed's log records (torch._logging gives them stderr handlers on import)
    to launcher.log. This runs in the launcher process only, never in a rank."""
    handler = _log_handler()
    for name, lg in list(logging.root.manager.loggerDict.items()):
        if not isinstance(lg, logging.Logger):
            continue
        if name == "torch.distributed" or name.startswith("torch.distributed."):
            for h in list(lg.handlers):
                if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler):
                    lg.removeHandler(h)
                    if not lg.propagate or name == "torch.distributed":
                        lg.addHandler(handler)
    top = logging.getLogger("torch.distributed")
    if handler not in top.handlers:
        top.addHandler(handler)
    top.propagate = False


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _write_log(f"--- diag.probe.launch {time.strftime('%Y-%m-%d %H:%M:%S')}: torchrun {' '.join(argv)}")

    try:
        from torch.distributed import run as torchrun
        from torch.distributed.elastic.multiprocessing.api import SignalException
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    except Exception as e:   # torch without torch.distributed (some macOS/Windows builds)
        print(f"diag: torchrun is not available in this Python ({type(e).__name__}: {e}); "
              "--nproc-per-node needs a torch build with torch.distributed", file=sys.stderr)
        return 2

    _quiet_torch_logging()

    try:
        torchrun.main(argv)
    except ChildFailedError as e:
        _write_log(e.format_msg())
        record_failures(e)
        return 1
    except SignalException as e:
        _write_log(f"torchrun stopped by {e.sigval.name}")
        return 128 + int(e.sigval)
    except KeyboardInterrupt:
        return 130
    except ValueError as e:       # e.g. "Cuda is not available." for --nproc-per-node gpu
        _write_log(traceback.format_exc())
        print(f"diag: torchrun cannot start: {e}", file=sys.stderr)
        return 2
    except Exception as e:        # rendezvous failures and the like
        _write_log(traceback.format_exc())
        log = os.environ.get("DIAG_LAUNCHER_LOG")
        print(f"diag: torchrun failed: {type(e).__name__}: {e}" + (f" (details in {log})" if log else ""),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
