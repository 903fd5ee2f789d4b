"""The pure parts behind the fault suite: redaction, sanitising, finding marked processes."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from diag.redact import redact_args
from diag.sanitize import for_terminal, strip_ansi


@pytest.mark.parametrize("args, expected", [
    (["--api-key", "sk-abcdefghijkl", "--lr", "3e-4"], ["--api-key", "***", "--lr", "3e-4"]),
    (["--token=abc", "--password", "hunter2"], ["--token=***", "--password", "***"]),
    (["OPENAI_API_KEY=sk-xyz", "db_password=pw", "epochs=3"], ["OPENAI_API_KEY=***", "db_password=***", "epochs=3"]),
    (["ghp_abcdefghijklmnopqrstu", "hf_abcdefghijklmnopqrstu", "plain"], ["***", "***", "plain"]),
    (["--db", "postgres://user:secret@host/db"], ["--db", "postgres://user:***@host/db"]),
    (["--max-tokens", "100", "--tokenizer", "gpt2", "--author", "me"],
     ["--max-tokens", "100", "--tokenizer", "gpt2", "--author", "me"]),
    (["--secret", "--epochs", "2"], ["--secret", "--epochs", "2"]),     # a flag, not a value
])
def test_redact_args(args, expected):
    before = list(args)
    assert redact_args(args) == expected
    assert args == before                          # the input is not changed in place


def test_for_terminal_escapes_every_control_character():
    s = "a\x1b]0;title\x07b\x1b[2Jc\x9b31md\r\x00e\u202ef"
    out = for_terminal(s)
    assert not any(ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f for c in out)
    assert out == "a\\x1b]0;title\\x07b\\x1b[2Jc\\x9b31md\\x0d\\x00e\\u202ef"
    assert for_terminal("line1\nline2\ttab", multiline=True) == "line1\nline2\ttab"
    assert for_terminal("line1\nline2") == "line1\\x0aline2"
    assert for_terminal(None) == "" and for_terminal(3) == "3"


def test_strip_ansi_keeps_the_text():
    data = {"m": ["\x1b[1;31mred\x1b[0m and \x1b]0;t\x07title", 3], "n": "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\"}
    assert strip_ansi(data) == {"m": ["red and title", 3], "n": "link"}


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_marked_pids_finds_processes_by_their_environment_and_kill_everything_kills_them():
    from diag.supervise import kill_everything, marked_pids, new_run_id

    rid = new_run_id("unit")
    env = dict(os.environ, DIAG_RUN_ID=rid)
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env, start_new_session=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while p.pid not in marked_pids(rid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marked_pids(rid) == [p.pid]
        kill_everything(rid, None)
        assert p.wait(timeout=10) == -9
        assert other.poll() is None          # an unmarked process is spared
    finally:
        other.kill()
        other.wait()
        p.kill()
        p.wait()
