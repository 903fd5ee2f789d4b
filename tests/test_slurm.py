"""diag check as the program of a Slurm step (diag/slurm.py), simulated on one machine: Slurm's
environment variables set by hand, no Slurm installed. Unit tests of the nodelist parser, the rank
variables and the last-to-finish protocol; then two real 2-task jobs (gloo, CPU): one task per rank
without torchrun, and one task per "node" running torchrun with a c10d rendezvous; both give one
merged report; `diag merge` judges the directory again and names what is missing."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO, SCRIPTS, run_diag

from diag.errors import DiagError
from diag.slurm import JobDir, SlurmStep, detect, parse_nodelist, parse_tasks_per_node, rank_env

TRAIN = str(SCRIPTS / "dist_train.py")


# ---- the compressed lists ---------------------------------------------------------------------------

@pytest.mark.parametrize("text, hosts", [
    ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
    ("gpu5", ["gpu5"]),
    ("a1,b[2-3],c", ["a1", "b2", "b3", "c"]),
    ("gpu-[9-11]", ["gpu-9", "gpu-10", "gpu-11"]),
    ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ("node[001-002]-ib,login", ["node001-ib", "node002-ib", "login"]),
])
def test_nodelist_expands_as_slurm_writes_it(text, hosts):
    assert parse_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["node[01-03", "node01]", "node[a-b]", "node[5-3]"])
def test_malformed_nodelist_is_refused(text):
    with pytest.raises(ValueError):
        parse_nodelist(text)


def test_tasks_per_node():
    assert parse_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert parse_tasks_per_node("8") == [8]


def _env(**kw):
    base = {"SLURM_JOB_ID": "812345", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4", "SLURM_NNODES": "2",
            "SLURM_JOB_NODELIST": "node[07-08]", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_PROCID": "3",
            "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.9"}
    base.update({k: str(v) for k, v in kw.items()})
    return {k: v for k, v in base.items() if v != "None"}


def test_detect_reads_the_step_and_leaves_other_contexts_alone():
    step = detect(_env())
    assert (step.procid, step.localid, step.ntasks, step.nodes) == (3, 1, 4, ["node07", "node08"])
    assert step.node_of(0) == "node07" and step.node_of(3) == "node08"
    assert detect(_env(SLURM_STEP_ID=None)) is None          # the batch script itself, not an srun step
    assert detect(_env(SLURM_STEP_ID="batch")) is None
    assert detect(_env(SLURM_STEP_ID=str(0xFFFFFFFE))) is None   # the batch step's numeric id
    assert detect(_env(SLURM_NTASKS=1)) is None              # one task: nothing to merge
    assert detect({}) is None
    assert detect(_env(DIAG_SLURM="0")) is None
    with pytest.raises(DiagError, match="SLURM_PROCID=7"):
        detect(_env(SLURM_PROCID=7))


def test_rank_variables_come_from_slurm_unless_the_user_set_them():
    step = detect(_env())
    env = rank_env(step, {})
    assert env["RANK"] == "3" and env["LOCAL_RANK"] == "1" and env["WORLD_SIZE"] == "4"
    assert env["LOCAL_WORLD_SIZE"] == "2"
    assert env["MASTER_ADDR"] == "node07"                      # where rank 0 runs (block distribution)
    assert env["MASTER_PORT"] == str(20000 + 812345 % 20000)   # the same on every task of the job
    kept = rank_env(step, {"MASTER_ADDR": "head", "MASTER_PORT": "1234", "RANK": "3"})
    assert "MASTER_ADDR" not in kept and "MASTER_PORT" not in kept and "RANK" not in kept
    no_list = detect(_env(SLURM_JOB_NODELIST=None))
    assert rank_env(no_list, {})["MASTER_ADDR"] == "10.0.0.9"


def test_exactly_one_task_claims_the_merge(tmp_path):
    steps = [SlurmStep("9", "0", k, 0, 8, 1, 0) for k in range(8)]
    jobs = [JobDir(tmp_path, s, "one task per rank") for s in steps]
    for j in jobs:
        j.prepare()
    wins = []
    barrier = threading.Barrier(8)

    def go(j):
        j.mark_done("completed")
        barrier.wait()
        wins.append(j.claim())

    ts = [threading.Thread(target=go, args=(j,)) for j in jobs]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sorted(wins) == [False] * 7 + [True]
    assert jobs[0].done_parts() == list(range(8))
    # the same directory reused by another job: the old markers do not count as its tasks being done
    other = JobDir(tmp_path, SlurmStep("10", "0", 1, 0, 2, 1, 0), "one task per rank")
    other.prepare()
    assert not (tmp_path / "parts" / "1.done").exists()     # task 1 removed its own stale marker
    assert (tmp_path / "parts" / "0.done").exists()         # task 0's is still there (job 9's)...
    assert other.done_parts() == []                          # ...and does not count for job 10
    other.mark_done("completed")
    assert other.done_parts() == [1]


# ---- simulated jobs -----------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(cwd: Path, procid: int, ntasks: int, extra_env: dict, *args: str) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["COLUMNS"] = "120"
    env.pop("DIAG_SIMULATE_GPUS", None)
    for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    env.update({"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_NTASKS": str(ntasks),
                "SLURM_PROCID": str(procid), "SLURM_SUBMIT_DIR": str(cwd)})
    env.update(extra_env)
    return subprocess.Popen([sys.executable, "-m", "diag", "check", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)


def _finish(procs) -> list[tuple[int, str, str]]:
    return [(p.wait(timeout=240), p.stdout.read(), p.stderr.read()) for p in procs]


def _one_report(results, job: Path, tasks: int) -> tuple[str, dict]:
    reports = [out for code, out, err in results if "status:" in out]
    lines = [out for code, out, err in results if "done; the job's report will be written" in out]
    assert len(reports) == 1, [r[1][-2000:] + r[2][-2000:] for r in results]
    assert len(lines) == tasks - 1
    assert all(str(job.resolve()) in line for line in lines)
    rep = json.loads((job / "report.json").read_text())
    ev = json.loads((job / "evidence.json").read_text())
    return reports[0], {"report": rep, "evidence": ev}


@pytest.mark.slow
def test_two_tasks_one_rank_each_without_torchrun(tmp_path):
    """Mode (b): RANK/WORLD_SIZE/MASTER_* derived from SLURM_*; each task is one rank; one report."""
    port = _free_port()
    common = {"SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "localhost", "SLURM_TASKS_PER_NODE": "2",
              "SLURM_NODEID": "0", "MASTER_PORT": str(port)}
    # --fail-on never: the exit code says the flow went through, not what the report found (the script's
    # dataset sleeps 1 ms an item with num_workers=0: a true dataloader.workers finding, an error when the
    # wait holds on three steps in four, which it does unless the machine's load breaks a step)
    procs = [_start(tmp_path, k, 2, {**common, "SLURM_LOCALID": str(k)}, "--script", TRAIN, "--fail-on", "never",
                    "--", "--steps", "6")
             for k in range(2)]
    results = _finish(procs)
    job = tmp_path / ".diag" / "runs" / "slurm-4242.0"
    text, got = _one_report(results, job, 2)
    assert "2 ranks" in text and "merged from 2 evidence files" in text
    ranks = got["evidence"]["ranks"]
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    assert all(r["world_size"] == 2 for r in ranks)
    assert all(r["step_stats"]["count"] == 6 for r in ranks)
    assert sorted(p.name for p in job.glob("part-*")) == ["part-0", "part-1"]
    assert all(code == 0 for code, _, _ in results), [(code, out[-1500:]) for code, out, _ in results]
    assert "dataloader.workers" in text

    # diag merge judges the directory again, and names what is missing
    again = run_diag("merge", str(job), "--format", "json", "--fail-on", "never", cwd=tmp_path)
    assert again.code == 0, again.stderr
    merged = json.loads(again.stdout)
    assert merged["run"]["status"] == "completed" and merged["run"]["run_dir"] == str(job.resolve())
    assert any("merged from 2 evidence files" in n for n in merged["notes"])
    (job / "parts" / "1.done").unlink()
    res = run_diag("merge", str(job), cwd=tmp_path)
    assert res.code == 2 and "incomplete" in res.stderr and "task 1 (node localhost)" in res.stderr
    import shutil

    shutil.rmtree(job / "part-1")
    res = run_diag("merge", str(job), cwd=tmp_path)
    assert res.code == 2 and "1 of 2 parts have no evidence: task 1" in res.stderr
    part = run_diag("merge", str(job), "--partial", "--fail-on", "never", cwd=tmp_path)
    assert part.code == 0 and "partial job: 1 of 2 parts merged; missing part-1" in part.stdout


@pytest.mark.slow
def test_two_nodes_each_running_torchrun(tmp_path):
    """Mode (a): one task per node, each diag check runs torchrun with a c10d rendezvous."""
    port = _free_port()
    common = {"SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "localhost,localhost", "SLURM_TASKS_PER_NODE": "1(x2)",
              "SLURM_LOCALID": "0"}
    args = ("--script", TRAIN, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "job4242", "--run-dir", "shared",
            "--", "--steps", "6")
    procs = [_start(tmp_path, k, 2, {**common, "SLURM_NODEID": str(k)}, *args) for k in range(2)]
    results = _finish(procs)
    job = tmp_path / "shared"
    text, got = _one_report(results, job, 2)
    assert "2 ranks" in text
    assert sorted(r["rank"] for r in got["evidence"]["ranks"]) == [0, 1]
    assert got["evidence"]["run"]["launcher"] == "merged"


def test_merge_refuses_what_is_not_a_job(tmp_path):
    res = run_diag("merge", str(tmp_path / "nothing"), cwd=tmp_path)
    assert res.code == 2 and "is not a directory" in res.stderr
    res = run_diag("merge", str(tmp_path), cwd=tmp_path)
    assert res.code == 2 and "holds no Slurm job" in res.stderr
    (tmp_path / "job.json").write_text(json.dumps({"expected": 4}))
    res = run_diag("merge", str(tmp_path), cwd=tmp_path)
    assert res.code == 2 and "no task's evidence yet" in res.stderr and "expected 4 parts" in res.stderr
