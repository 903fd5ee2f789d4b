"""Fault injection on files and directories: a full disk (at start and mid-run, on a small tmpfs),
two runs on one run directory, foreign events, a script that deletes its run directory, files in the
current directory that shadow modules, -o into a missing directory, secrets in argv and permissions."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from conftest import run_diag
from faults_support import (assert_no_diag_traceback, assert_nothing_left, script, start_diag, steps_seen,
                            wait_for)

# each test runs a real script under diag (a full disk, a deleted run directory, ...): the full suite only
pytestmark = pytest.mark.slow

TINY = textwrap.dedent("""
    import sys, time, torch
    m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), 0.1)
    for _ in range(5):
        loss = m(torch.randn(8, 4)).sum(); opt.zero_grad(); loss.backward(); opt.step()
    print("trained", flush=True)
""")

FOREVER = """
    import time, torch
    m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), 0.1)
    while True:
        loss = m(torch.randn(8, 4)).sum(); opt.zero_grad(); loss.backward(); opt.step()
        time.sleep(0.05)
"""


# ---- a full disk ----------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs (root only: the test is skipped where it cannot mount one)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m,mode=0755", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _fill(mnt: Path) -> None:
    fd = os.open(mnt / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (65536, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)


def test_a_full_disk_at_start_is_one_sentence_and_exit_2(tmp_path, small_disk):
    s = script(tmp_path, "tiny.py", TINY + "\nopen(sys.argv[1], 'w').write('ran')\n")
    marker = tmp_path / "ran"
    (small_disk / "runs").mkdir()
    _fill(small_disk)
    r = run_diag("check", "--script", str(s), "--run-dir", str(small_disk / "runs" / "r"), "--", str(marker),
                 cwd=tmp_path, timeout=120)
    assert r.code == 2, r.stderr
    assert "diag: error: the disk is full: diag cannot write to" in r.stderr
    assert r.stderr.count("the disk is full") == 1
    assert_no_diag_traceback(r.stderr)
    assert not marker.exists()          # nothing was started
    assert_nothing_left(small_disk / "runs" / "r")


def test_a_disk_that_fills_mid_run_ends_the_run_cleanly(tmp_path, small_disk):
    s = script(tmp_path, "forever.py", FOREVER)
    run_dir = small_disk / "r"
    p = start_diag("check", "--script", str(s), "--run-dir", str(run_dir), "--format", "json", cwd=tmp_path)
    wait_for(lambda: steps_seen(run_dir) > 0)
    _fill(small_disk)
    out, err = p.communicate(timeout=120)        # before: the events thread died and diag waited forever
    assert p.returncode == 2, err
    assert "diag: error: the disk is full" in err
    assert_no_diag_traceback(err)
    rep = json.loads(out)                         # what was observed is kept and reported
    assert rep["summary"]["steps"] > 0
    assert "the disk is full" in rep["run"]["stop_reason"]
    assert_nothing_left(run_dir)


# ---- run directories ------------------------------------------------------------------------------

def test_two_runs_on_one_run_directory(tmp_path):
    s = script(tmp_path, "forever.py", FOREVER)
    run_dir = tmp_path / "shared"
    first = start_diag("check", "--script", str(s), "--run-dir", str(run_dir), "--format", "json",
                       "--max-time", "60", "--fail-on", "never", cwd=tmp_path)
    try:
        wait_for(lambda: steps_seen(run_dir) > 0)
        second = run_diag("check", "--script", str(s), "--run-dir", str(run_dir), cwd=tmp_path)
        assert second.code == 2
        assert f"diag: error: the run directory {str(run_dir)!r} is in use by another diag run" in second.stderr
        assert_no_diag_traceback(second.stderr)
        # events of another run written into this directory are not folded into this one
        n = steps_seen(run_dir)
        foreign = {"kind": "step", "rank": 0, "t": 1.0, "index": 999, "total_s": 0.5, "run": "someone-else"}
        with open(run_dir / "events.rank0.jsonl", "a") as f:
            for _ in range(200):
                f.write(json.dumps(foreign) + "\n")
        time.sleep(1.5)
    finally:
        first.send_signal(2)
        out, err = first.communicate(timeout=60)
    rep = json.loads(out)
    # the 200 foreign steps were ignored: the report counts no more steps than this run wrote (a count
    # from the file, not from the time it ran: on a loaded machine the run goes on far longer than 1.5 s)
    own = 0
    with open(run_dir / "events.rank0.jsonl") as f:
        for line in f:
            ev = json.loads(line)
            own += ev.get("kind") == "step" and ev.get("run") != "someone-else"
    assert n <= rep["summary"]["steps"] <= own, (n, rep["summary"]["steps"], own)
    assert_nothing_left(run_dir)


def test_a_script_that_deletes_its_run_directory_is_reported_honestly(tmp_path):
    s = script(tmp_path, "rm_rundir.py", """
        import os, shutil, time, torch
        m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), 0.1)
        for _ in range(3):
            loss = m(torch.randn(8, 4)).sum(); opt.zero_grad(); loss.backward(); opt.step()
        time.sleep(0.5)
        shutil.rmtree(os.path.dirname(os.environ["DIAG_EVENTS"]))
    """)
    run_dir = tmp_path / "run"
    r = run_diag("check", "--script", str(s), "--run-dir", str(run_dir), "--format", "json", "--fail-on", "never",
                 cwd=tmp_path, timeout=120)
    rep = json.loads(r.stdout)
    assert "deleted its run directory" in rep["run"]["stop_reason"]
    assert rep["run"]["status"] != "completed"
    assert "the script deleted its run directory" in r.stderr
    assert not run_dir.exists()                  # not recreated behind the user's back
    assert_no_diag_traceback(r.stderr)


def test_output_into_a_missing_directory_is_refused_before_the_run(tmp_path):
    s = script(tmp_path, "tiny.py", TINY + "\nopen(sys.argv[1], 'w').write('ran')\n")
    marker = tmp_path / "ran"
    t0 = time.monotonic()
    r = run_diag("check", "--script", str(s), "-o", str(tmp_path / "nope" / "report.txt"), "--", str(marker),
                 cwd=tmp_path)
    assert r.code == 2
    assert "does not exist" in r.stderr and "nope" in r.stderr
    assert not marker.exists()
    assert time.monotonic() - t0 < 30
    assert_no_diag_traceback(r.stderr)


# ---- the current directory shadows nothing --------------------------------------------------------

@pytest.mark.skipif(sys.version_info < (3, 11), reason="PYTHONSAFEPATH and -P are Python 3.11+")
def test_files_in_the_cwd_do_not_shadow_modules(tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for name in ("json", "torch", "diag", "runpy", "signal"):
        (cwd / f"{name}.py").write_text(f"open({str(tmp_path / 'shadowed')!r}, 'a').write('{name} ')\n"
                                        f"raise SystemExit('shadowed {name}')\n")
    elsewhere = tmp_path / "project"
    elsewhere.mkdir()
    s = script(elsewhere, "train.py", """
        import json, sys, torch
        m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), 0.1)
        for _ in range(2):
            loss = m(torch.randn(8, 4)).sum(); opt.zero_grad(); loss.backward(); opt.step()
        print("path0", sys.path[0], flush=True)
    """)
    expected = subprocess.run([sys.executable, str(s)], cwd=cwd, capture_output=True, text=True)
    assert expected.returncode == 0, expected.stderr          # plain python is not fooled either
    # diag itself as its console script starts it (not `python -m diag`, which the cwd's diag.py would
    # shadow before any of diag's code runs): -P keeps the cwd off diag's own sys.path
    from faults_support import env

    p = subprocess.run([sys.executable, "-P", "-m", "diag", "check", "--script", str(s), "--run-dir",
                        str(tmp_path / "run"), "--format", "json", "--fail-on", "never"], cwd=cwd, env=env(),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert not (tmp_path / "shadowed").exists()
    r = p
    r.stdout = p.stdout
    assert json.loads(r.stdout)["run"]["status"] == "completed"
    # the script sees python script.py's sys.path[0]: its own directory
    assert f"path0 {elsewhere}" in (tmp_path / "run" / "log.txt").read_text()
    assert "PYTHONSAFEPATH" not in (tmp_path / "run" / "log.txt").read_text()


def test_the_script_does_not_inherit_diags_safe_path_setting(tmp_path):
    s = script(tmp_path, "env.py", TINY + "\nimport os\nprint('SAFE', os.environ.get('PYTHONSAFEPATH'), flush=True)\n")
    r = run_diag("check", "--script", str(s), "--run-dir", str(tmp_path / "run"), "--format", "json",
                 "--fail-on", "never", cwd=tmp_path, timeout=120)
    assert r.code == 0
    assert "SAFE None" in (tmp_path / "run" / "log.txt").read_text()


# ---- secrets and permissions ----------------------------------------------------------------------

def test_secret_arguments_are_redacted_everywhere_and_the_run_is_private(tmp_path):
    secret = "sk-" + uuid.uuid4().hex
    s = script(tmp_path, "tiny.py", TINY)
    run_dir = tmp_path / "run"
    for fmt in ("json", "text"):
        r = run_diag("check", "--script", str(s), "--run-dir", str(run_dir), "--format", fmt, "--fail-on", "never",
                     "--", "--api-key", secret, "--password=hunter2-" + secret, "HF_TOKEN=" + secret,
                     "--lr", "0.1", cwd=tmp_path, timeout=120)
        assert r.code == 0, r.stderr
        assert secret not in r.stdout and secret not in r.stderr
        for f in run_dir.iterdir():
            assert secret not in f.read_text(errors="replace"), f.name
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f.name
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    rep = json.loads((run_dir / "report.json").read_text())
    assert rep["run"]["args"] == ["--api-key", "***", "--password=***", "HF_TOKEN=***", "--lr", "0.1"]
    assert "--api-key ***" in r.stdout        # the text header names the argument, not its value
