"""Fault injection: signals to diag, scripts that ignore stops, children that escape the process group.
Each case runs a real tiny script under `diag check` and asserts the exit code, the sentence, no
traceback from diag, and (with psutil) that nothing of the run is left running."""
from __future__ import annotations

import json
import os
import signal
import sys
import time

import pytest

from faults_support import (alive, assert_no_diag_traceback, assert_nothing_left, read_pids, script,
                            start_diag, steps_seen, wait_for)

pytestmark = [pytest.mark.slow,   # real scripts, signals and grace periods: the full suite only
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process supervision is tested on Linux")]

# a training loop that never ends and starts a helper the way telemetry helpers are started: in a
# session of its own (out of reach of a signal to the script's process group) and in a new group
FOREVER = """
    import os, subprocess, sys, time, torch
    pidfile = sys.argv[1]
    helpers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True),
               subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], process_group=0)]
    with open(pidfile, "w") as f:
        f.write(" ".join(str(p) for p in [os.getpid()] + [h.pid for h in helpers]))
    m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), 0.1)
    while True:
        loss = m(torch.randn(8, 4)).sum(); opt.zero_grad(); loss.backward(); opt.step()
        time.sleep(0.05)
"""


def _start_forever(tmp_path, *extra, source=FOREVER):
    s = script(tmp_path, "forever.py", source)
    run_dir = tmp_path / "run"
    pidfile = tmp_path / "pids"
    p = start_diag("check", "--script", str(s), "--run-dir", str(run_dir), "--format", "json", *extra,
                   "--", str(pidfile), cwd=tmp_path)
    pids = wait_for(lambda: len(read_pids(pidfile)) == 3 and read_pids(pidfile))
    wait_for(lambda: steps_seen(run_dir) > 0)
    return p, run_dir, pids


def test_sigkill_to_diag_leaves_nothing_running(tmp_path):
    p, run_dir, pids = _start_forever(tmp_path)
    os.kill(p.pid, signal.SIGKILL)
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL
    # the script (parent-death signal), its helpers in their own session and group (the guard), all gone
    assert_nothing_left(run_dir, pids, timeout=10)


def test_second_ctrl_c_kills_everything_at_once_and_exits_130(tmp_path):
    # the script ignores SIGTERM: only the escalation (or the second Ctrl-C) can end it
    src = FOREVER.replace("pidfile = sys.argv[1]", "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                                   "    pidfile = sys.argv[1]")
    p, run_dir, pids = _start_forever(tmp_path, source=src)
    os.kill(p.pid, signal.SIGINT)
    time.sleep(1.0)
    t0 = time.monotonic()
    os.kill(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert time.monotonic() - t0 < 4.5          # well inside the 5 s grace period it skipped
    assert p.returncode == 130, err
    assert_no_diag_traceback(err)
    assert_nothing_left(run_dir, pids, timeout=5)


def test_a_script_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path):
    src = FOREVER.replace("pidfile = sys.argv[1]", "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                                   "    pidfile = sys.argv[1]")
    s = script(tmp_path, "stubborn.py", src)
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    p = start_diag("check", "--script", str(s), "--run-dir", str(run_dir), "--format", "json",
                   "--max-time", "4", "--fail-on", "never", "--", str(tmp_path / "pids"), cwd=tmp_path)
    out, err = p.communicate(timeout=120)
    pids = read_pids(tmp_path / "pids")
    assert p.returncode == 0, err
    rep = json.loads(out)
    assert rep["run"]["status"] == "timeout" and "--max-time 4" in rep["run"]["stop_reason"]
    assert time.monotonic() - t0 < 4 + 5 + 40       # the limit, the grace period, start-up on a busy machine
    assert_no_diag_traceback(err)
    assert_nothing_left(run_dir, pids)


SWALLOW = """
    import time, torch
    m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), 0.1)
    while True:
        try:
            loss = m(torch.randn(8, 4)).sum(); opt.zero_grad(); loss.backward(); opt.step()
            time.sleep(0.02)
        except:      # noqa: E722  a bare except swallows diag's stop (and SIGTERM's)
            pass
"""


def test_a_stop_swallowed_by_a_bare_except_is_escalated(tmp_path):
    s = script(tmp_path, "swallow.py", SWALLOW)
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    p = start_diag("check", "--script", str(s), "--run-dir", str(run_dir), "--format", "json", "--steps", "3",
                   "--fail-on", "never", cwd=tmp_path)
    out, err = p.communicate(timeout=120)
    assert time.monotonic() - t0 < 2 * 5 + 60
    assert p.returncode == 0, err
    rep = json.loads(out)
    assert rep["run"]["status"] == "stopped"
    assert "--steps 3 reached; the script caught the stop and went on, so diag ended it" in rep["run"]["stop_reason"]
    assert_no_diag_traceback(err)
    assert_nothing_left(run_dir)


def test_children_in_a_new_session_or_group_die_with_the_run_and_do_not_delay_it(tmp_path):
    # the helpers inherit stdout/stderr: before, diag waited for those pipes until they died
    s = script(tmp_path, "spawner.py", """
        import subprocess, sys, torch
        hs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True),
              subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], process_group=0)]
        open(sys.argv[1], "w").write(" ".join(str(h.pid) for h in hs))
        m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), 0.1)
        for _ in range(3):
            loss = m(torch.randn(8, 4)).sum(); opt.zero_grad(); loss.backward(); opt.step()
        print("script done", flush=True)
        import os, time
        open(sys.argv[1] + ".end", "w").write(repr(time.time()))
        os._exit(0)     # ends here: what follows is diag's own clean-up, not the probe's end-of-run work
    """)
    run_dir = tmp_path / "run"
    p = start_diag("check", "--script", str(s), "--run-dir", str(run_dir), "--format", "json", "--fail-on", "never",
                   "--", str(tmp_path / "pids"), cwd=tmp_path)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    log = (run_dir / "log.txt").read_text()
    assert "script done" in log
    rep = json.loads(out)
    assert rep["run"]["status"] == "completed" and rep["summary"]["steps"] == 3
    # the run ended promptly after the script (the helpers' inherited pipes used to hold it ~10 s)
    ended_at = json.loads((run_dir / "evidence.json").read_text())["run"]["ended_at"]
    script_end = float((tmp_path / "pids.end").read_text())
    assert ended_at - script_end < 4.0
    pids = read_pids(tmp_path / "pids")
    assert len(pids) == 2
    assert alive(pids) == []
    assert_nothing_left(run_dir, pids)


TORCHRUN = """
    import os, sys, time, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with open(sys.argv[1] + f".{rank}", "w") as f:
        f.write(f"{os.getpid()} {os.getppid()}")
    m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), 0.1)
    while True:
        loss = m(torch.randn(8, 4)).sum(); opt.zero_grad(); loss.backward(); opt.step()
        time.sleep(0.05)
"""


def test_sigkill_to_diag_under_torchrun_leaves_no_launcher_and_no_rank(tmp_path):
    s = script(tmp_path, "ddp_forever.py", TORCHRUN)
    run_dir = tmp_path / "run"
    pidbase = tmp_path / "pids"
    p = start_diag("check", "--script", str(s), "--run-dir", str(run_dir), "--format", "json",
                   "--nproc-per-node", "2", "--", str(pidbase), cwd=tmp_path)
    try:
        ranks = wait_for(lambda: all(read_pids(tmp_path / f"pids.{r}") for r in (0, 1)) and
                         [read_pids(tmp_path / f"pids.{r}") for r in (0, 1)], timeout=180)
    except AssertionError:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(err[-3000:])
    rank_pids = [x[0] for x in ranks]
    launcher = ranks[0][1]
    assert launcher != p.pid            # the ranks' parent is torchrun's launcher
    wait_for(lambda: steps_seen(run_dir) > 0, timeout=60)
    os.kill(p.pid, signal.SIGKILL)
    p.communicate(timeout=30)
    assert_nothing_left(run_dir, rank_pids + [launcher], timeout=15)
    # the events files stop growing once everything is gone
    sizes = [f.stat().st_size for f in sorted(run_dir.glob("events.rank*.jsonl"))]
    time.sleep(1.0)
    assert [f.stat().st_size for f in sorted(run_dir.glob("events.rank*.jsonl"))] == sizes
