"""Fault injection on what diag prints: escape sequences in every evidence string field (console, JSON,
TUI), a closed stdout pipe, a segfault, a --max-time during the probe's start-up, a script that fails
before its first batch under `diag memory`, overflowing `diag cost` inputs."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import run_diag
from faults_support import assert_no_diag_traceback, assert_nothing_left, env, script
from tui_support import EVIDENCE, demo_findings

OSC = "\x1b]0;PWNED\x07"        # renames the terminal window
CLEAR = "\x1b[2J\x1b[H"          # clears the screen
RED = "\x1b[31m"


def _hostile_evidence(tmp_path) -> Path:
    from diag.evidence import ExceptionInfo, load_evidence

    ev = load_evidence(EVIDENCE)
    ev.run.script = f"/tmp/train{OSC}.py"
    ev.run.args = [f"--name={CLEAR}x"]
    ev.run.status = "failed"
    ev.run.stop_reason = f"{RED}boom{OSC}"
    ev.notes = [f"note {CLEAR}{OSC}"]
    ev.environment.hostname = f"host{OSC}"
    ev.primary.exceptions.append(ExceptionInfo(type=f"Value{OSC}Error", message=f"{RED}bad value{OSC}\x1b[0m",
                                               traceback=f"Traceback\n  {OSC}\nValueError: bad",
                                               location={"file": f"/tmp/t{OSC}.py", "line": 3, "function": OSC}))
    p = tmp_path / "hostile.json"
    ev.save(p)
    return p


def test_escape_sequences_in_evidence_never_reach_the_terminal_in_check_from(tmp_path):
    p = _hostile_evidence(tmp_path)
    r = run_diag("check", "--from", str(p), "--verbose", cwd=tmp_path)
    assert r.code == 3, r.stderr              # the recorded run failed
    out = r.stdout + r.stderr
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;PWNED\\x07" in r.stdout       # shown escaped, not dropped
    assert "boom" in r.stdout and "bad value" in r.stdout
    assert_no_diag_traceback(r.stderr)


def test_json_keeps_the_data_but_strips_colour_codes(tmp_path):
    p = _hostile_evidence(tmp_path)
    r = run_diag("check", "--from", str(p), "--format", "json", cwd=tmp_path)
    assert r.code == 3
    rep = json.loads(r.stdout)
    assert rep["run"]["stop_reason"] == "boom"          # ANSI (CSI and OSC) removed, the text kept
    assert rep["notes"] == ["note "]
    assert "\x1b" not in json.dumps(rep, ensure_ascii=False)


def test_memory_from_shows_escaped_strings(tmp_path):
    p = _hostile_evidence(tmp_path)
    r = run_diag("memory", "--from", str(p), cwd=tmp_path)
    out = r.stdout + r.stderr
    assert "\x1b]" not in out and "\x07" not in out
    assert_no_diag_traceback(r.stderr)


def _render(renderable) -> str:
    from rich.console import Console

    buf = io.StringIO()
    Console(file=buf, force_terminal=True, width=120, color_system="truecolor").print(renderable)
    return buf.getvalue()


def test_tui_header_finding_detail_and_log_show_escape_sequences_escaped(tmp_path):
    from diag.evidence import load_evidence
    from diag.findings import Finding, Location, Severity
    from diag.tui.live import Snapshot
    from diag.tui.widgets import UIState
    from diag.tui.widgets.checks import detail_renderable
    from diag.tui.widgets.header import header_lines

    ev = load_evidence(_hostile_evidence(tmp_path))
    st = UIState(mode="run", snapshot=Snapshot(ev, demo_findings()), clock=lambda: 0.0)
    one, two = header_lines(st)
    for text in (one, two):
        shown = _render(text)
        assert "\x1b]" not in shown and "\x07" not in shown and "\x1b[2J" not in shown
    assert "\\x1b" in one.plain + two.plain
    f = Finding(id="run.failed", severity=Severity.ERROR, title=f"crash {OSC}", message=f"{RED}bad{OSC}",
                evidence={"traceback": f"Traceback\n{OSC}", "host": OSC}, fix=CLEAR,
                location=Location(file=f"/x{OSC}.py", line=1, function=OSC))
    shown = _render(detail_renderable(f))
    assert "\x1b]" not in shown and "\x07" not in shown and "\x1b[2J" not in shown
    assert "\\x1b]0;PWNED\\x07" in shown


async def test_tui_log_tab_drops_colour_codes_and_escapes_the_rest():
    from tui_support import replay_app

    app = replay_app("log")
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0.3)
        pane = app.pane("log")
        pane.write_lines([("stdout", f"{RED}coloured{OSC} line\n")])
        await pilot.pause(0.2)
        from textual.widgets import RichLog

        text = "\n".join(strip.text for strip in pane.query_one(RichLog).lines)
        assert "coloured" in text and "\x1b" not in text and "\x07" not in text


# ---- exit codes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_closed_stdout_pipe_ends_quietly(tmp_path, fmt):
    # `true` exits without reading: diag's first write meets a closed pipe
    cmd = f"{sys.executable} -m diag check --from {EVIDENCE} --verbose --format {fmt} | true"
    p = subprocess.run(["bash", "-c", "set -o pipefail; " + cmd + "; echo \"rc=${PIPESTATUS[0]}\" >&2"],
                       capture_output=True, text=True, env=env(), cwd=tmp_path, timeout=120)
    err = p.stderr
    assert "rc=141" in err                     # ended as a process killed by SIGPIPE would
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception ignored" not in err


def test_a_segfault_reads_as_a_signal(tmp_path):
    s = script(tmp_path, "segv.py", """
        import ctypes, torch
        m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), 0.1)
        loss = m(torch.randn(8, 4)).sum(); opt.zero_grad(); loss.backward(); opt.step()
        ctypes.string_at(0)
    """)
    run_dir = tmp_path / "run"
    r = run_diag("check", "--script", str(s), "--run-dir", str(run_dir), "--format", "json", cwd=tmp_path,
                 timeout=120)
    assert r.code == 3, r.stderr
    rep = json.loads(r.stdout)
    assert rep["run"]["status"] == "killed"
    assert "killed by SIGSEGV" in rep["run"]["stop_reason"] and "None" not in rep["run"]["stop_reason"]
    assert_nothing_left(run_dir)


def test_max_time_during_the_probes_start_up_gives_no_traceback(tmp_path):
    s = script(tmp_path, "slow_import.py", """
        import torch
        m = torch.nn.Linear(4, 1)
    """)
    run_dir = tmp_path / "run"
    r = run_diag("check", "--script", str(s), "--run-dir", str(run_dir), "--max-time", "0.3",
                 "--format", "json", "--fail-on", "never", cwd=tmp_path, timeout=120)
    assert_no_diag_traceback(r.stderr)
    rep = json.loads(r.stdout)
    assert rep["run"]["status"] in ("timeout", "completed")
    assert r.code == 0
    assert_nothing_left(run_dir)


@pytest.mark.slow
def test_a_stop_that_lands_inside_an_import_waits_for_the_import_to_end(tmp_path):
    """--max-time's SIGTERM arriving while a module is being imported (torch's own import at start-up
    can then abort the process from inside a C++ callback) is delivered again once the import is over:
    the module is imported whole, the run stops there, no traceback, status timeout.

    The import lasts until a deadline well after --max-time (not a fixed sleep): on a loaded machine
    the probe's own start-up can take seconds, and the stop must land inside the script's import."""
    (tmp_path / "slow_module.py").write_text(
        "import os, time\n"
        "print('SLOW_MODULE_STARTED', flush=True)\n"
        "while time.time() < float(os.environ['SLOW_IMPORT_UNTIL']):\n"
        "    time.sleep(0.05)\n"
        "print('SLOW_MODULE_IMPORTED', flush=True)\n")
    s = script(tmp_path, "imports_slowly.py", """
        import slow_module
        import time
        while True:
            time.sleep(0.01)
    """)
    run_dir = tmp_path / "run"
    max_time = 3.0
    until = time.time() + max_time + 3.0
    r = run_diag("check", "--script", str(s), "--run-dir", str(run_dir), "--max-time", str(max_time),
                 "--format", "json", "--fail-on", "never", cwd=tmp_path, timeout=120,
                 env={"SLOW_IMPORT_UNTIL": repr(until)})
    if "SLOW_MODULE_STARTED" not in r.stderr:
        pytest.skip(f"the probe's start-up took longer than --max-time {max_time:g} s on this machine: the stop "
                    "landed before the script, not inside its import")
    assert_no_diag_traceback(r.stderr)
    assert "SLOW_MODULE_IMPORTED" in r.stderr
    rep = json.loads(r.stdout)
    assert rep["run"]["status"] == "timeout"
    assert r.code == 0
    assert_nothing_left(run_dir)


@pytest.mark.slow
def test_a_stop_that_surfaces_as_another_exception_is_the_stop_not_a_failure(tmp_path):
    """SIGTERM from --max-time lands in the script; its clean-up raises something else (as numpy does
    when the stop lands inside its import and an except clause imports it again). The run was
    stopped by diag: no traceback, exit 0, status timeout, and the report says what it surfaced as."""
    s = script(tmp_path, "cleanup_raises.py", """
        import time
        print("looping", flush=True)
        try:
            while True:
                time.sleep(0.01)
        finally:
            raise RuntimeError("clean-up failed after the stop")
    """)
    run_dir = tmp_path / "run"
    r = run_diag("check", "--script", str(s), "--run-dir", str(run_dir), "--max-time", "6",
                 "--format", "json", "--fail-on", "never", cwd=tmp_path, timeout=120)
    assert_no_diag_traceback(r.stderr)
    assert r.code == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["run"]["status"] == "timeout"
    assert_nothing_left(run_dir)


def test_memory_on_a_script_that_fails_before_its_first_batch_exits_3(tmp_path):
    s = script(tmp_path, "early.py", """
        import torch
        raise RuntimeError("no data here")
    """)
    r = run_diag("memory", "--script", str(s), "--run-dir", str(tmp_path / "run"), cwd=tmp_path, timeout=120)
    assert r.code == 3, r.stderr
    assert "no data here" in r.stderr


@pytest.mark.parametrize("args", [["--params", "1e300", "--tokens", "1e300", "--gpu", "h100"],
                                  ["--params", "1e300", "--tokens", "1e300", "--gpu", "h100", "--format", "json"],
                                  ["--params", "1e300", "--tokens", "1e300", "--compare", "H100x8,A100x16"]])
def test_cost_refuses_overflowing_inputs(args):
    r = run_diag("cost", *args)
    assert r.code == 2
    assert "diag: error: the inputs are too large to estimate" in r.stderr
    assert "inf" not in r.stdout
    assert_no_diag_traceback(r.stderr)
