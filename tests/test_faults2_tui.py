"""Issue 27, class 11: `kill -TERM` (or SIGHUP) on `diag tui` leaves the terminal as it found it: the
main screen, the cursor shown, mouse reporting off, the tty's modes restored; exit 130, one line."""
from __future__ import annotations

import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time

import pytest

from faults_support import env
from diag.testing import EvidenceBuilder


def read_until(fd, needle: bytes, timeout: float) -> bytes:
    buf = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            if needle and needle in buf:
                return buf
    return buf


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminated_tui_restores_the_terminal(tmp_path, sig):
    ev = tmp_path / "evidence.json"
    EvidenceBuilder().cuda_training().steps(10, total_s=2.5, samples=8).build().save(ev)
    master, slave = pty.openpty()
    before = termios.tcgetattr(slave)
    e = env(TERM="xterm-256color", COLUMNS="120", LINES="40")
    p = subprocess.Popen([sys.executable, "-m", "diag", "tui", "--from", str(ev)], stdin=slave, stdout=slave,
                         stderr=slave, env=e, cwd=tmp_path, start_new_session=True)
    try:
        out = read_until(master, b"\x1b[?1049h", 120)        # the app entered the alternate screen
        assert b"\x1b[?1049h" in out, out[-500:]
        out += read_until(master, b"", 3)                     # let it draw
        os.kill(p.pid, sig)
        deadline = time.monotonic() + 60
        while p.poll() is None and time.monotonic() < deadline:
            out += read_until(master, b"", 0.5)
        out += read_until(master, b"", 1)
        assert p.poll() is not None, "diag tui did not exit"
        assert p.returncode == 130, (p.returncode, out[-800:])
        tail = out[out.rindex(b"\x1b[?1049h"):]
        assert b"\x1b[?1049l" in tail                        # back on the main screen
        assert b"\x1b[?25h" in tail                          # cursor shown
        assert b"\x1b[?1000l" in tail or b"\x1b[?1000h" not in tail   # mouse reporting off
        assert f"interrupted by {sig.name}".encode() in out and b"Traceback" not in out
        after = termios.tcgetattr(slave)
        assert after[3] == before[3] and after[0] == before[0]   # lflag (ECHO, ICANON) and iflag restored
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
        os.close(slave)
