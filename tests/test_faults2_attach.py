"""Issue 27, class 1: `diag attach` killed (SIGTERM, SIGHUP, SIGKILL) leaves no py-spy sampling the job
and no /tmp/diag-attach-* folder (after SIGKILL, the next attach removes it). A stand-in py-spy records
its pid and sleeps for the window as `py-spy record` does."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from faults_support import alive, env, wait_for

STANDIN = r'''#!{python}
import json, os, sys, time
cmd = sys.argv[1]
if cmd == "--version":
    print("py-spy 0.0-standin"); sys.exit(0)
if cmd == "dump":
    print("[]"); sys.exit(0)
if cmd == "record":
    out = sys.argv[sys.argv.index("--output") + 1]
    with open({pids!r}, "a") as f:
        f.write(f"{{os.getpid()}} {{out}}\n")
    time.sleep(float(sys.argv[sys.argv.index("--duration") + 1]))
    json.dump({{"shared": {{"frames": []}}, "profiles": []}}, open(out, "w"))
'''


@pytest.fixture
def setup(tmp_path):
    pids = tmp_path / "recorders"
    exe = tmp_path / "py-spy"
    exe.write_text(STANDIN.format(python=sys.executable, pids=str(pids)))
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    yield exe, pids, target
    target.kill()
    target.wait()


def recorders(pids: Path) -> list[tuple[int, str]]:
    try:
        return [(int(a), b) for a, b in (ln.split(" ", 1) for ln in pids.read_text().splitlines())]
    except (OSError, ValueError):
        return []


def start_attach(tmp_path, exe, target, tmpdir):
    e = env(DIAG_PYSPY=str(exe), TMPDIR=str(tmpdir))
    return subprocess.Popen([sys.executable, "-m", "diag", "attach", str(target.pid), "--any-process",
                             "--duration", "300", "--run-dir", str(tmp_path / "rd")],
                            cwd=tmp_path, env=e, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_killing_attach_ends_py_spy_and_its_folder(tmp_path, setup, sig):
    exe, pids, target = setup
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    p = start_attach(tmp_path, exe, target, tmpdir)
    (rec_pid, out), = wait_for(lambda: recorders(pids), timeout=120)
    assert alive([rec_pid])
    os.kill(p.pid, sig)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        raise
    wait_for(lambda: not alive([rec_pid]), timeout=30)     # py-spy does not outlive diag
    assert target.poll() is None                            # the job itself is untouched
    if sig != signal.SIGKILL:
        assert p.returncode == 130, err
        assert "Traceback" not in err
        assert not [n for n in os.listdir(tmpdir) if n.startswith("diag-attach-")]
    else:
        # the folder of a diag killed outright is removed by the next attach
        assert [n for n in os.listdir(tmpdir) if n.startswith("diag-attach-")]
        q = start_attach(tmp_path, exe, target, tmpdir)
        try:
            wait_for(lambda: len(recorders(pids)) == 2, timeout=120)
            left = [n for n in os.listdir(tmpdir) if n.startswith("diag-attach-")]
            assert left == [Path(recorders(pids)[1][1]).parent.name]
        finally:
            os.kill(q.pid, signal.SIGTERM)
            q.communicate(timeout=60)
        assert not [n for n in os.listdir(tmpdir) if n.startswith("diag-attach-")]
