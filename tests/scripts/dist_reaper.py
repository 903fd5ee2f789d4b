"""Run a command as a child subreaper and report what it left behind.

    python dist_reaper.py OUT.json [--sigint-after-steps N RUN_DIR RANKS] COMMAND [ARGS...]

PR_SET_CHILD_SUBREAPER makes every process orphaned below this one (a torchrun rank whose
launcher died, a DataLoader worker whose rank died) our child instead of init's, so
``psutil.Process().children(recursive=True)`` sees every descendant that survived COMMAND.
Writes {"code", "stdout", "stderr", "left": [[pid, cmdline], ...]} to OUT.json and kills the
survivors (so a failing test leaves nothing running either). Linux only.

With --sigint-after-steps, COMMAND gets SIGINT (a Ctrl-C) once each of RANKS ranks has written N
step events into RUN_DIR/events.rank<r>.jsonl: a stop in the middle of training, whatever the load.
"""
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

PR_SET_CHILD_SUBREAPER = 36


def main() -> int:
    out, cmd = sys.argv[1], sys.argv[2:]
    interrupt = None
    if cmd[0] == "--sigint-after-steps":
        interrupt = (int(cmd[1]), Path(cmd[2]), int(cmd[3]))
        cmd = cmd[4:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")
    with open(out + ".stdout", "w+") as fo, open(out + ".stderr", "w+") as fe:
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL)
        interrupted = False
        while p.poll() is None:
            if interrupt and not interrupted and _steps_done(*interrupt):
                p.send_signal(signal.SIGINT)
                interrupted = True
            time.sleep(0.1)
        fo.seek(0)
        fe.seek(0)
        p.stdout, p.stderr = fo.read(), fe.read()
    time.sleep(0.5)   # let orphans be re-parented
    left = []
    for c in psutil.Process().children(recursive=True):
        try:
            if c.status() == psutil.STATUS_ZOMBIE:
                continue
            left.append([c.pid, c.cmdline()])
            c.kill()
        except psutil.Error:
            pass
    while True:   # reap what we inherited
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            time.sleep(0.05)
            if not psutil.Process().children():
                break
    with open(out, "w") as f:
        json.dump({"code": p.returncode, "stdout": p.stdout, "stderr": p.stderr, "left": left}, f)
    return 0


def _steps_done(n: int, run_dir: Path, ranks: int) -> bool:
    for r in range(ranks):
        try:
            text = (run_dir / f"events.rank{r}.jsonl").read_text(errors="replace")
        except OSError:
            return False
        if text.count('"kind": "step"') < n:
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())
