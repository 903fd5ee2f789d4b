"""Shared helpers of the fault-injection suite (tests/test_faults_*.py)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from conftest import REPO


def env(**extra) -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.setdefault("COLUMNS", "120")
    e.pop("DIAG_SIMULATE_GPUS", None)
    e.update(extra)
    return e


def script(tmp_path: Path, name: str, source: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(source))
    return p


def start_diag(*args, cwd, **kw) -> subprocess.Popen:
    """diag in a session of its own (the tests send it signals as a terminal or CI would)."""
    return subprocess.Popen([sys.executable, "-m", "diag", *args], cwd=cwd, env=env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            start_new_session=True, **kw)


def wait_for(pred, timeout: float = 90.0, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {pred}")


def read_pids(path: Path) -> list[int]:
    try:
        return [int(x) for x in path.read_text().split()]
    except (OSError, ValueError):
        return []


def alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.Error:
            pass
    return out


def marked(run_dir: Path) -> list[int]:
    """Live processes that belong to the run (their DIAG_EVENTS points into its run directory)."""
    out = []
    for p in psutil.process_iter(["environ"]):
        try:
            e = p.info.get("environ") or {}
            if str(run_dir) in e.get("DIAG_EVENTS", "") and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (psutil.Error, TypeError):
            pass
    return out


def assert_nothing_left(run_dir: Path, pids=(), timeout: float = 10.0) -> None:
    """Nothing of the run may be running (checked with psutil, allowing the kernel a moment)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = set(alive(pids)) | set(marked(run_dir))
        if not left:
            return
        time.sleep(0.1)
    left = set(alive(pids)) | set(marked(run_dir))
    for pid in left:        # clean up for the next test, then fail
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    raise AssertionError(f"processes left running: {sorted(left)}")


def assert_no_diag_traceback(stderr: str) -> None:
    assert "Traceback (most recent call last)" not in stderr, stderr
    assert "DiagStop" not in stderr, stderr


def steps_seen(run_dir: Path) -> int:
    try:
        ev = json.loads((run_dir / "evidence.json").read_text())
        return sum(r["step_stats"]["count"] for r in ev["ranks"])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
