"""diag.runner end to end: real tiny scripts through `diag check` (a subprocess each): limits, failures,
exit codes, the run directory, the script's output, and nothing left behind."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from conftest import SCRIPTS, check_json, findings_by_id, severities

pytestmark = pytest.mark.slow


def test_crash_exit_3_traceback_shown_and_findings_kept(diag_cli):
    r, rep = check_json(diag_cli, "spine_crash.py")
    assert r.code == 3
    assert "Traceback (most recent call last)" in r.stderr
    assert "planted failure: checkpoint ckpt.pt is corrupt" in r.stderr
    assert "load_checkpoint" in r.stderr
    assert "diag/probe" not in r.stderr and "runpy" not in r.stderr   # only the user's frames
    assert "about to fail" in r.stderr   # the script's output went to stderr (stdout is data)
    f = findings_by_id(rep)["run.failed"][0]
    assert f["severity"] == "error" and f["evidence"]["type"] == "ValueError"
    assert f["evidence"]["step"] == 3
    assert f["location"]["function"] == "load_checkpoint"
    assert rep["summary"]["steps"] == 3                 # nothing observed before the crash is lost
    ev = json.loads(Path(rep["run"]["evidence"]).read_text())
    assert ev["run"]["status"] == "failed"
    assert "planted failure" in Path(rep["run"]["log"]).read_text()


def test_the_scripts_own_keyboard_interrupt_shows_its_traceback_as_bare(diag_cli, write_script):
    """A KeyboardInterrupt the script raises (or a SIGINT sent to it, not diag's stop) prints its
    traceback in a bare run: under diag too, with the bare exit code."""
    s = write_script("interrupts.py", """
        def wait_for_user():
            raise KeyboardInterrupt
        print("working")
        wait_for_user()
    """)
    r = diag_cli("check", "--script", str(s), "--format", "json")
    assert r.code == 130, r.stderr
    assert "Traceback (most recent call last)" in r.stderr and "wait_for_user" in r.stderr
    assert "\nKeyboardInterrupt\n" in r.stderr
    assert "diag/probe" not in r.stderr and "runpy" not in r.stderr
    assert r.json()["run"]["status"] == "interrupted"


def test_the_scripts_own_excepthook_shows_its_uncaught_error_as_bare(diag_cli, write_script):
    """A script that installs its own sys.excepthook (rich.traceback.install, pretty_errors) has its
    uncaught error shown by that hook, with the traceback a bare run gives it (no frame of diag's)."""
    s = write_script("pretty.py", """
        import sys
        import traceback

        def pretty(t, v, tb):
            files = [f.filename for f in traceback.extract_tb(tb)]
            print(f"PRETTY {t.__name__}: {v} frames={len(files)} probe={any('probe' in f or 'runpy' in f for f in files)}",
                  file=sys.stderr)

        sys.excepthook = pretty

        def load():
            raise ValueError("boom")

        load()
    """)
    r = diag_cli("check", "--script", str(s), "--format", "json")
    assert r.code == 3, r.stderr
    assert "PRETTY ValueError: boom frames=2 probe=False" in r.stderr   # <module> and load only
    assert "Traceback (most recent call last)" not in r.stderr
    assert r.json()["findings"] and r.json()["run"]["status"] == "failed"


def _descendants_of_run(run_dir: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline", "environ"]):
        try:
            env = p.info.get("environ") or {}
            if run_dir in env.get("DIAG_EVENTS", ""):
                out.append(p)
        except (psutil.Error, TypeError):
            pass
    return out


def test_steps_limit_stops_endless_loop_with_workers(diag_cli, tmp_path):
    run_dir = tmp_path / "run-steps"
    t0 = time.monotonic()
    r, rep = check_json(diag_cli, "spine_forever.py", "--steps", "12", "--run-dir", str(run_dir),
                        "--fail-on", "never")
    assert time.monotonic() - t0 < 60
    assert rep["summary"]["steps"] == 12
    assert rep["run"]["status"] == "stopped" and "--steps 12" in rep["run"]["stop_reason"]
    assert "finally block ran" in r.stderr       # stopped by unwinding, not killed
    assert r.code == 0
    assert _descendants_of_run(str(run_dir)) == []
    ev = json.loads((run_dir / "evidence.json").read_text())
    assert ev["ranks"][0]["dataloaders"][0]["num_workers"] == 2


def test_max_time_stops_endless_loop_no_orphans(diag_cli, tmp_path):
    run_dir = tmp_path / "run-time"
    t0 = time.monotonic()
    r, rep = check_json(diag_cli, "spine_forever.py", "--max-time", "8", "--run-dir", str(run_dir),
                        "--fail-on", "never")
    elapsed = time.monotonic() - t0
    assert elapsed < 8 + 15, elapsed
    assert rep["run"]["status"] == "timeout"
    assert "--max-time 8" in rep["run"]["stop_reason"]
    assert rep["summary"]["steps"] > 0
    assert r.code == 0
    time.sleep(0.5)
    assert _descendants_of_run(str(run_dir)) == []


def test_missing_import_is_the_scripts_failure(diag_cli):
    r, rep = check_json(diag_cli, "spine_missing_import.py")
    assert r.code == 3
    assert "ModuleNotFoundError" in r.stderr and "a_module_that_does_not_exist_anywhere" in r.stderr
    assert severities(rep, "run.no-steps") == ["skipped"]   # failed before any step: run.failed says why
    assert findings_by_id(rep)["run.failed"][0]["evidence"]["type"] == "ModuleNotFoundError"


def test_sys_exit_nonzero_is_a_failure(diag_cli):
    r, rep = check_json(diag_cli, "spine_sysexit.py")
    assert r.code == 3
    assert rep["run"]["exit_code"] == 4
    assert rep["summary"]["steps"] == 2


def test_text_mode_passes_script_output_through_and_saves_run_dir(diag_cli, tmp_path):
    r = diag_cli("check", "--script", str(SCRIPTS / "spine_manual_sgd.py"), "--run-dir", str(tmp_path / "t"))
    assert r.code == 0
    assert "trained" in r.stdout              # the script's own stdout, passed through
    assert "run.no-steps" in r.stdout or "pass" in r.stdout.lower()
    for name in ("evidence.json", "log.txt", "report.json"):
        assert (tmp_path / "t" / name).is_file()
    assert "trained" in (tmp_path / "t" / "log.txt").read_text()


def test_reused_run_dir_starts_fresh(diag_cli, tmp_path):
    run_dir = tmp_path / "again"
    _, first = check_json(diag_cli, "spine_manual_sgd.py", "--run-dir", str(run_dir))
    r, second = check_json(diag_cli, "spine_manual_sgd.py", "--run-dir", str(run_dir))
    assert first["summary"]["steps"] == second["summary"]["steps"] == 8
    assert "held an earlier run" in r.stderr
    assert (run_dir / "log.txt").read_text().count("trained") == 1


def test_sigterm_to_diag_stops_the_script_and_leaves_nothing(tmp_path):
    """A CI job cancelled (SIGTERM to diag) must not leave the script running in its own session."""
    import signal
    import subprocess
    import sys

    from conftest import REPO

    run_dir = tmp_path / "term"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    p = subprocess.Popen([sys.executable, "-m", "diag", "check", "--script", str(SCRIPTS / "spine_forever.py"),
                          "--run-dir", str(run_dir), "--format", "json"], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:      # wait until the script trains
        ev = run_dir / "evidence.json"
        try:
            if json.loads(ev.read_text())["ranks"][0]["step_stats"]["count"] > 0:
                break
        except (OSError, ValueError, KeyError, IndexError):
            pass
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, err
    rep = json.loads(out)
    assert rep["run"]["status"] == "interrupted" and rep["run"]["stop_reason"] == "interrupted by SIGTERM"
    assert "finally block ran" in err
    time.sleep(0.5)
    assert _descendants_of_run(str(run_dir)) == []


def test_progress_bars_show_live_and_the_log_tab_gets_what_a_terminal_shows(tmp_path):
    """The script's output is passed on as it arrives, carriage returns included (a tqdm bar redraws
    live in the terminal, before any newline); listeners get lines as a terminal would show them."""
    import subprocess
    import sys as _sys
    import threading

    from diag.runner import Run, RunConfig

    run = Run(RunConfig(script=str(SCRIPTS / "spine_progress.py"), run_dir=str(tmp_path / "run"), gpu=False))
    lines: list[tuple[str, str]] = []
    run.log_listeners.append(lambda name, line: lines.append((name, line)))
    run.start()
    run.wait()
    assert ("stderr", "batch 50/50\n") in lines and ("stdout", "epoch done\n") in lines
    assert not any("batch 49" in ln for _, ln in lines)
    assert b"\rbatch 1/50\rbatch 2/50" in (tmp_path / "run" / "log.txt").read_bytes()   # the file: as written
    # a replay of the saved run shows the log as the Log tab did
    from diag.evidence import load_evidence
    from diag.tui.live import ReplaySource

    replayed = ReplaySource(load_evidence(tmp_path / "run" / "evidence.json"), path=str(tmp_path / "run")).take_logs()
    assert ("stdout", "batch 50/50\n") in replayed and not any("batch 49" in ln for _, ln in replayed)

    # live: the unfinished bar reaches diag's terminal while the script still waits
    p = subprocess.Popen([_sys.executable, "-m", "diag", "check", "--script", str(SCRIPTS / "spine_progress.py"),
                          "--run-dir", str(tmp_path / "live"), "--", "--hang"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         cwd=tmp_path)
    seen = bytearray()
    got = threading.Event()

    def read():
        while True:
            b = p.stderr.read1(4096)
            if not b:
                return
            seen.extend(b)
            if b"waiting for the next epoch 0%" in seen:
                got.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert got.wait(60), seen.decode(errors="replace")[-2000:]
    finally:
        p.terminate()
        p.communicate(timeout=30)
