"""End to end: real tiny scripts through `diag check` (a subprocess each)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from conftest import SCRIPTS, findings_by_id, severities

pytestmark = pytest.mark.slow


def check_json(diag_cli, script, *extra, script_args=(), timeout=120):
    args = ["check", "--script", str(SCRIPTS / script), "--format", "json", *extra]
    if script_args:
        args += ["--", *script_args]
    r = diag_cli(*args, timeout=timeout)
    assert r.stdout.strip(), f"no JSON on stdout; stderr:\n{r.stderr}"
    return r, r.json()


def test_eval_no_grad_flags_only_the_bad_loop(diag_cli):
    r, rep = check_json(diag_cli, "spine_eval_cases.py", script_args=["--bad"])
    hits = [f for f in rep["findings"] if f["id"] == "eval.no-grad" and f["severity"] == "warning"]
    assert len(hits) == 1, rep["findings"]
    f = hits[0]
    src = (SCRIPTS / "spine_eval_cases.py").read_text().splitlines()
    assert "BAD-EVAL" in src[f["location"]["line"] - 1]
    assert f["evidence"]["forwards"] == 3
    assert f["evidence"]["trainable_params"] == 32 * 64 + 64 + 64 * 2 + 2
    assert r.code == 0   # a warning is below the default --fail-on error


def test_eval_no_grad_no_false_positive(diag_cli):
    # no_grad, inference_mode, @torch.no_grad() and a frozen module: none is flagged
    r, rep = check_json(diag_cli, "spine_eval_cases.py")
    assert severities(rep, "eval.no-grad") == ["pass"]
    assert rep["summary"]["steps"] == 6
    assert r.code == 0


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


def test_oom_mid_run_is_diagnosed(diag_cli):
    r, rep = check_json(diag_cli, "spine_oom.py")
    assert r.code == 3
    f = findings_by_id(rep)["memory.oom"][0]
    assert f["severity"] == "error"
    e = f["evidence"]
    assert e["requested"] == 2 << 30
    assert e["free"] == int(1.05 * (1 << 30))
    assert e["reserved_unallocated"] == int(2.30 * (1 << 30))
    assert e["batch_size"] == 16
    assert "step 3" in f["message"] and "batch size 16" in f["message"]
    assert "expandable_segments" in f["fix"]    # 2.3 GiB reserved-unallocated >= 2 GiB requested
    assert rep["run"]["status"] == "oom"


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


def test_manual_sgd_steps_are_detected(diag_cli):
    r, rep = check_json(diag_cli, "spine_manual_sgd.py")
    assert rep["summary"]["steps"] == 8
    assert severities(rep, "run.no-steps") == ["pass"]
    assert r.code == 0


def test_missing_import_is_the_scripts_failure(diag_cli):
    r, rep = check_json(diag_cli, "spine_missing_import.py")
    assert r.code == 3
    assert "ModuleNotFoundError" in r.stderr and "a_module_that_does_not_exist_anywhere" in r.stderr
    assert severities(rep, "run.no-steps") == ["warning"]   # failed before any step
    assert findings_by_id(rep)["run.failed"][0]["evidence"]["type"] == "ModuleNotFoundError"


def test_sys_exit_nonzero_is_a_failure(diag_cli):
    r, rep = check_json(diag_cli, "spine_sysexit.py")
    assert r.code == 3
    assert rep["run"]["exit_code"] == 4
    assert rep["summary"]["steps"] == 2


def test_data_wait_found_with_zero_workers_and_workers_recorded(diag_cli, tmp_path):
    r, rep = check_json(diag_cli, "spine_slow_data.py", "--run-dir", str(tmp_path / "slow"))
    f = findings_by_id(rep)["dataloader.workers"][0]
    assert f["severity"] == "error", f       # ~32 ms of data per ~1 ms step
    assert f["evidence"]["num_workers"] == 0
    assert f["evidence"]["data_share"] > 0.5
    assert f["evidence"]["recommended_workers"] >= 1
    assert f["location"]["file"].endswith("spine_slow_data.py")
    assert r.code == 1                        # an error finding fails the default --fail-on


def test_text_mode_passes_script_output_through_and_saves_run_dir(diag_cli, tmp_path):
    r = diag_cli("check", "--script", str(SCRIPTS / "spine_manual_sgd.py"), "--run-dir", str(tmp_path / "t"))
    assert r.code == 0
    assert "trained" in r.stdout              # the script's own stdout, passed through
    assert "run.no-steps" in r.stdout or "pass" in r.stdout.lower()
    for name in ("evidence.json", "log.txt", "report.json"):
        assert (tmp_path / "t" / name).is_file()
    assert "trained" in (tmp_path / "t" / "log.txt").read_text()


def test_from_rejudges_without_running(diag_cli, tmp_path):
    run_dir = tmp_path / "saved"
    r1, rep1 = check_json(diag_cli, "spine_eval_cases.py", "--run-dir", str(run_dir), script_args=["--bad"])
    r2 = diag_cli("check", "--from", str(run_dir / "evidence.json"), "--format", "json", "--fail-on", "warning")
    assert r2.code == 1
    rep2 = r2.json()
    assert [f["id"] for f in rep2["findings"]] == [f["id"] for f in rep1["findings"]]
    assert "running" not in r2.stderr


def test_demo_planted_and_clean(diag_cli):
    r = diag_cli("demo", "--format", "json", "--", "--epochs", "1")
    assert r.code == 0, r.stderr
    found = {f["id"] for f in r.json()["findings"] if f["severity"] in ("error", "warning", "info")}
    assert {"dataloader.workers", "eval.no-grad"} <= found
    r = diag_cli("demo", "--clean", "--format", "json", "--fail-on", "warning", "--", "--epochs", "1")
    bad = [f for f in r.json()["findings"] if f["severity"] in ("error", "warning", "crashed")]
    assert bad == [] and r.code == 0


def test_reused_run_dir_starts_fresh(diag_cli, tmp_path):
    run_dir = tmp_path / "again"
    _, first = check_json(diag_cli, "spine_manual_sgd.py", "--run-dir", str(run_dir))
    r, second = check_json(diag_cli, "spine_manual_sgd.py", "--run-dir", str(run_dir))
    assert first["summary"]["steps"] == second["summary"]["steps"] == 8
    assert "held an earlier run" in r.stderr
    assert (run_dir / "log.txt").read_text().count("trained") == 1


def test_training_in_eval_mode_counts_steps_and_is_not_an_evaluation(diag_cli):
    r, rep = check_json(diag_cli, "spine_train_in_eval_mode.py")
    assert rep["summary"]["steps"] == 6
    hits = [f for f in rep["findings"] if f["id"] == "eval.no-grad" and f["severity"] == "warning"]
    assert len(hits) == 1, hits
    src = (SCRIPTS / "spine_train_in_eval_mode.py").read_text().splitlines()
    assert "BAD-EVAL" in src[hits[0]["location"]["line"] - 1]
    assert hits[0]["evidence"]["forwards"] == 2


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


def test_a_loss_module_is_not_a_model(diag_cli):
    """`loss_fn(model(x), y)`: the loss module has no parameters, so it is neither a model nor a call
    site nor a second batch of the step; a parameterless wrapper's inner model forward counts instead."""
    r, rep = check_json(diag_cli, "spine_loss_modules.py")
    assert r.code == 0, r.stderr[-2000:]
    ev = json.loads(Path(rep["run"]["evidence"]).read_text())
    rank = ev["ranks"][0]
    assert [m["cls"] for m in rank["models"]] == ["Sequential"]
    src = (SCRIPTS / "spine_loss_modules.py").read_text().splitlines()
    sites = {src[f["location"]["line"] - 1].split("# ")[-1]: f for f in rank["forwards"]}
    # the model's own call site: inside the wrapper's forward, where it is called
    assert set(sites) == {"LOSS-LINE", "INNER-CALL"}, rank["forwards"]
    assert sites["LOSS-LINE"]["count"] == 6 and sites["LOSS-LINE"]["in_step"]
    assert sites["INNER-CALL"]["count"] == 3 and sites["INNER-CALL"]["input_shapes"] == [[5, 16]]
    assert not sites["INNER-CALL"]["grad_enabled"]
    assert rank["steps"][-1]["samples"] == 8
    assert all(s["forward_s"] > 0 for s in rank["steps"])
    measured = (rank.get("flops") or {}).get("measured") or {}
    assert measured.get("samples") == 8 and measured.get("n_forward") == 1, measured


@pytest.mark.parametrize("gan", [False, True])
def test_a_step_counts_every_micro_batch_of_its_call_site(diag_cli, gan):
    """4 micro-batches of 8 rows per optimizer step: 32 samples and 192 tokens a step, in the steps and
    in the FLOP measurement; a second model's batch of 32 (--gan) adds FLOPs, not samples."""
    r, rep = check_json(diag_cli, "spine_accumulate.py", script_args=["--gan"] if gan else [])
    assert r.code == 0, r.stderr[-2000:]
    rank = json.loads(Path(rep["run"]["evidence"]).read_text())["ranks"][0]
    assert [(s["n_backward"], s["samples"], s["tokens"], s["micro_batches"]) for s in rank["steps"]] == \
        [(4, 32, 192, 4)] * 6
    measured = rank["flops"]["measured"]
    assert (measured["samples"], measured["tokens"]) == (32, 192), measured
    assert measured["n_forward"] == (8 if gan else 4)
    # what memory scales with is one micro-batch; the Steps tab says both
    from diag.evidence import load_evidence
    from diag.tui.stats import summarize_steps
    from diag.tui.widgets.steps import summary_text

    ev = load_evidence(rep["run"]["evidence"])
    assert ev.primary.steps[-1].batch == 8
    assert "batch 8 × 4 accumulated" in summary_text(summarize_steps(ev), ev).plain


@pytest.mark.parametrize("mode, samples, tokens", [("--dataclass", 4, 96), ("--aux-first", 8, None)])
def test_outputs_in_a_dataclass_or_an_unused_first_tensor_still_make_steps(diag_cli, mode, samples, tokens):
    r, rep = check_json(diag_cli, "spine_outputs.py", script_args=[mode])
    assert r.code == 0, r.stderr[-2000:]
    assert rep["summary"]["steps"] == 5
    rank = json.loads(Path(rep["run"]["evidence"]).read_text())["ranks"][0]
    assert all(s["backward_s"] > 0 and s["n_backward"] == 1 for s in rank["steps"])
    assert rank["steps"][-1]["samples"] == samples and rank["steps"][-1]["tokens"] == tokens
    assert rank["forwards"][0]["output_requires_grad"] is True


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
