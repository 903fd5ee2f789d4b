"""Real multi-process jobs: `diag check --nproc-per-node 2` launches tests/scripts/dist_train.py through
torchrun (gloo, CPU) with the probe in every rank. Four launches in all (~9 s each here): a planted
straggler stopped by --steps, a balanced job stopped by --max-time, a rank that crashes, and a
two-node job (two diag processes, one per "node") whose evidence files are merged.

Every run goes through tests/scripts/dist_reaper.py, a child subreaper: whatever the run leaves
behind (a rank, a DataLoader worker) becomes its child and is reported.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from conftest import REPO, SCRIPTS, findings_by_id, run_diag

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses PR_SET_CHILD_SUBREAPER")]

TRAIN = str(SCRIPTS / "dist_train.py")


def reaped(cwd: Path, *diag_args: str, timeout: float = 150, sigint_after: tuple = ()) -> dict:
    """Run `python -m diag ARGS` under the subreaper; {"code", "stdout", "stderr", "left"}.
    sigint_after=(N, run_dir, ranks): Ctrl-C once every rank has done N steps."""
    out = cwd / f"reaper-{len(list(cwd.glob('reaper-*.json')))}.json"
    pre = ["--sigint-after-steps", *map(str, sigint_after)] if sigint_after else []
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("DIAG_SIMULATE_GPUS", None)
    subprocess.run([sys.executable, str(SCRIPTS / "dist_reaper.py"), str(out), *pre, sys.executable, "-m", "diag",
                    *diag_args], cwd=cwd, env=env, timeout=timeout, check=True, stdin=subprocess.DEVNULL)
    return json.loads(out.read_text())


def evidence(run_dir: Path) -> dict:
    return json.loads((run_dir / "evidence.json").read_text())


@pytest.fixture(scope="module")
def straggler(tmp_path_factory):
    """Rank 1's input pipeline is 5x slower and it holds 200 MiB more; diag stops the job at step 15."""
    d = tmp_path_factory.mktemp("straggler")
    res = reaped(d, "check", "--nproc-per-node", "2", "--steps", "15", "--script", TRAIN, "--run-dir", "run",
                 "--format", "json", "--", "--steps", "60", "--slow-rank", "1", "--slow-factor", "5",
                 "--hold-mb-rank", "1", "--hold-mb", "200")
    return d / "run", res


def test_planted_straggler_is_found_and_named(straggler):
    run_dir, res = straggler
    assert res["left"] == [], f"processes left behind: {res['left']}"
    assert res["code"] == 1, res["stderr"][-3000:]
    report = json.loads(res["stdout"])
    f = findings_by_id(report)
    (s,) = f["distributed.straggler"]
    assert s["severity"] == "error"
    ev = s["evidence"]
    assert (ev["rank"], ev["host"], ev["phase"]) == (1, socket.gethostname(), "data wait")
    assert f"Rank 1 on {socket.gethostname()}" in s["message"]
    # about 5x the fast rank's data wait, and the fast rank waits for it in the all-reduce
    assert ev["phase_s"] > 3 * ev["others_phase_s"]
    assert ev["others_comm_wait_s"] > 0.5 * ev["excess_s"]
    (m,) = f["distributed.memory-imbalance"]
    assert m["severity"] in ("warning", "error") and m["evidence"]["rank"] == 1
    assert m["evidence"]["peak_bytes"] - m["evidence"]["min_bytes"] > 150 << 20
    assert f["distributed.backend"][0]["severity"] == "pass"


def test_every_rank_is_probed_and_stopped_at_the_step_limit(straggler):
    run_dir, res = straggler
    e = evidence(run_dir)
    assert e["run"]["launcher"] == "torchrun" and e["run"]["status"] == "stopped"
    assert "--steps 15 reached" in e["run"]["stop_reason"]
    assert [r["rank"] for r in e["ranks"]] == [0, 1]
    pids = set()
    for r in e["ranks"]:
        assert r["world_size"] == 2 and r["local_rank"] == r["rank"] and r["host"] == socket.gethostname()
        assert r["status"] == "stopped" and r["step_stats"]["count"] == 15
        d = r["distributed"]
        assert d["backend"] == "gloo" and d["world_size"] == 2 and d["rank"] == r["rank"]
        assert d["launcher"]["local_world_size"] == 2 and d["launcher"]["node_rank"] == 0
        (model,) = d["ddp"]["models"]
        assert model["find_unused_parameters"] is False and model["unused_params"] == 0
        assert d["ddp"]["forwards_sync"] == 15
        assert d["memory"]["host_peak_rss_bytes"] > 0
        for s in r["steps"]:
            assert "comm_wait_s" in s["extra"] and s["extra"]["ddp_sync"] == 1
        pids.add(r["pid"])
    assert len(pids) == 2
    # the fast rank's wait for the straggler is measured as collective wait, not "other" work
    fast, slow = e["ranks"]
    assert fast["distributed"]["comm"]["grad_sync_wait_s"] > 5 * slow["distributed"]["comm"]["grad_sync_wait_s"]
    # torchrun's own log lines went to launcher.log, not to the user's terminal
    assert "OMP_NUM_THREADS" not in res["stderr"] and "torch.distributed" not in res["stderr"]
    assert "OMP_NUM_THREADS" in (run_dir / "launcher.log").read_text()


def test_balanced_job_is_not_flagged_and_ctrl_c_stops_every_rank(tmp_path):
    # Ctrl-C once both ranks trained 20 steps (--max-time takes the same path: Run.stop)
    res = reaped(tmp_path, "check", "--nproc-per-node", "2", "--script", TRAIN, "--run-dir", "run",
                 "--format", "json", "--", "--steps", "100000",
                 sigint_after=(20, tmp_path / "run", 2))
    assert res["left"] == [], f"processes left behind: {res['left']}"
    assert res["code"] == 130, res["stderr"][-3000:]
    report = json.loads(res["stdout"])
    f = findings_by_id(report)
    assert f["distributed.straggler"][0]["severity"] == "pass", f["distributed.straggler"][0]["message"]
    assert f["distributed.memory-imbalance"][0]["severity"] == "pass"
    e = evidence(tmp_path / "run")
    assert e["run"]["status"] == "interrupted" and len(e["ranks"]) == 2
    assert all(r["step_stats"]["count"] >= 20 for r in e["ranks"])
    assert all(r["status"] in ("stopped", "killed") for r in e["ranks"])
    for r in e["ranks"]:
        assert not _alive(r["pid"])


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_crashing_rank_ends_the_job_shows_its_traceback_once_and_leaves_nothing(tmp_path):
    pid_dir = tmp_path / "pids"
    pid_dir.mkdir()
    res = reaped(tmp_path, "check", "--nproc-per-node", "2", "--script", TRAIN, "--run-dir", "run", "--",
                 "--steps", "500", "--crash-rank", "1", "--crash-step", "4", "--workers", "1",
                 "--pid-dir", str(pid_dir))
    assert res["left"] == [], f"processes left behind: {res['left']}"
    assert res["code"] == 3
    err = res["stderr"]
    # the user's traceback, once, from the rank that failed first
    assert err.count('raise ValueError(f"planted failure on rank {rank}') == 1, err[-4000:]
    assert "rank 1 on" in err and "failed first: ValueError: planted failure on rank 1 at step 4" in err
    # not torchrun's report
    assert "ChildFailedError" not in err and "elastic/errors.html" not in err
    assert "Root Cause (first observed failure)" in (tmp_path / "run" / "launcher.log").read_text()
    # every rank and DataLoader worker that ran is gone
    pids = [int(p.name.split("-")[1]) for p in pid_dir.iterdir()]
    assert len(pids) >= 3
    assert not [p for p in pids if _alive(p)]
    e = evidence(tmp_path / "run")
    assert e["run"]["status"] == "failed" and e["run"]["stop_reason"].startswith("rank 1 on")
    r1 = e["ranks"][1]
    assert r1["exceptions"][0]["type"] == "ValueError" and r1["distributed"]["launcher_exit"]["exitcode"] == 1
    # the text report names rank 1 too
    out = res["stdout"]
    assert "ValueError on rank 1" in out


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_two_node_job_each_node_writes_its_run_and_merged_evidence_is_judged(tmp_path, straggler):
    port = _free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    procs = []
    for node in (0, 1):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "diag", "check", "--nproc-per-node", "1", "--nnodes", "2",
             "--node-rank", str(node), "--master-addr", "127.0.0.1", "--master-port", str(port),
             "--script", TRAIN, "--run-dir", f"node{node}", "--format", "json", "--", "--steps", "12"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            stdin=subprocess.DEVNULL))
    outs = [p.communicate(timeout=150) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode in (0, 1), err[-3000:]
    n0, n1 = evidence(tmp_path / "node0"), evidence(tmp_path / "node1")
    assert [r["rank"] for r in n0["ranks"]] == [0] and [r["rank"] for r in n1["ranks"]] == [1]
    assert n1["ranks"][0]["distributed"]["launcher"]["node_rank"] == 1

    r = run_diag("check", "--from", "node0/evidence.json", "--from", "node1", "--format", "json", cwd=tmp_path)
    assert r.code in (0, 1), r.stderr
    report = r.json()
    f = findings_by_id(report)
    (s,) = f["distributed.straggler"]
    # two balanced nodes: no straggler. On a loaded 2-core machine one process can be descheduled long
    # enough for a phase to differ by the warning's 10% of a step: on a contended host that is an info
    # (the host, not the rank); otherwise a warning far below the planted straggler's (rank 1's 5x data
    # pipeline); never an error
    if s["severity"] not in ("pass", "info"):
        planted = findings_by_id(json.loads(straggler[1]["stdout"]))["distributed.straggler"][0]["evidence"]
        e = s["evidence"]
        assert s["severity"] == "warning", s
        assert e["excess_s"] / e["step_s"] < 0.5 * planted["excess_s"] / planted["step_s"], (e, planted)
    assert s["evidence"]["ranks"] == 2
    assert f["distributed.backend"][0]["severity"] == "pass"

    same = run_diag("check", "--from", "node0", "--from", "node0/evidence.json", cwd=tmp_path)
    assert same.code == 2 and "are the same run" in same.stderr
    other_job = run_diag("check", "--from", "node0", "--from", str(straggler[0]), cwd=tmp_path)
    assert other_job.code == 2 and "rank 0 appears in both" in other_job.stderr
    assert "Traceback" not in same.stderr + other_job.stderr


def test_torchrun_options_are_validated_before_launch(tmp_path):
    r = run_diag("check", "--script", TRAIN, "--nproc-per-node", "2", "--nnodes", "2", cwd=tmp_path)
    assert r.code == 2 and "needs --master-addr" in r.stderr and "Traceback" not in r.stderr
    r = run_diag("check", "--script", TRAIN, "--nproc-per-node", "many", cwd=tmp_path)
    assert r.code == 2 and "--nproc-per-node" in r.stderr
    assert not (tmp_path / ".diag").exists()
