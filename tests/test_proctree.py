"""diag.supervise.live_tree_pids: the process tree the runner and the sampler scan while a run goes
on, read from /proc's children lists, finds what psutil's walk finds (new sessions, grandchildren,
children of a thread other than the main one) and falls back to psutil where the lists are absent."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from diag import supervise

TREE = r"""
import os, subprocess, sys, threading, time
kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)]
def from_a_thread():
    kids.append(subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60; wait"]))
t = threading.Thread(target=from_a_thread); t.start(); t.join()
print("ready", flush=True)
time.sleep(60)
"""


@pytest.fixture
def tree():
    p = subprocess.Popen([sys.executable, "-c", TREE], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while len(supervise.tree_pids(p.pid)) < 4 and time.monotonic() < deadline:   # sh's two sleeps
            time.sleep(0.05)
        yield p
    finally:
        for pid in supervise.tree_pids(p.pid):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        p.kill()
        p.wait()


@pytest.mark.skipif(not os.path.exists(f"/proc/self/task/{os.getpid()}/children"),
                    reason="this kernel has no /proc children lists (the psutil fallback is tested below)")
def test_the_proc_lists_find_what_psutil_finds(tree):
    walked = supervise.tree_pids(tree.pid)
    assert len(walked) >= 4          # python, sh, its two sleeps
    assert sorted(supervise.live_tree_pids(tree.pid)) == sorted(walked)


def test_without_the_proc_lists_it_is_psutils_walk(tree, monkeypatch):
    real_open = open

    def no_children_files(path, *a, **kw):
        if str(path).endswith("/children"):
            raise FileNotFoundError(path)
        return real_open(path, *a, **kw)

    monkeypatch.setattr("builtins.open", no_children_files)
    monkeypatch.setattr(supervise.os.path, "exists", lambda p: not str(p).endswith("/children"))
    assert sorted(supervise.live_tree_pids(tree.pid)) == sorted(supervise.tree_pids(tree.pid))


def test_a_process_that_is_gone_has_no_tree():
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert supervise.live_tree_pids(p.pid) == []
