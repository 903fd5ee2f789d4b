"""diag attach without a live target: phase attribution of hand-made stacks, speedscope parsing,
permission and bad-PID errors (through a scripted stand-in for py-spy where the real condition cannot
be made here), and the judgement over hand-built attach evidence."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from diag.attach import pyspy
from diag.attach.analyse import count_cycles, parse_speedscope, summarise_main, summarise_worker
from diag.attach.phases import Frame, classify, is_user_frame
from diag.cli import main
from diag.errors import DiagError

SP = "/usr/lib/python3/site-packages"
TORCH = SP + "/torch"


def F(name, file, line=1):
    return Frame(name, file, line)


def user(tmp_path, code: str, name="train"):
    p = tmp_path / f"train_{abs(hash(code))}.py"
    p.write_text(code + "\n")
    return F(name, str(p), 1)


MOD = F("<module>", "/home/u/train.py", 10)


@pytest.mark.parametrize("stack,phase", [
    ([MOD, F("_MultiProcessingDataLoaderIter._next_data", TORCH + "/utils/data/dataloader.py"),
      F("_MultiProcessingDataLoaderIter._get_data", TORCH + "/utils/data/dataloader.py"),
      F("Queue.get", "/usr/lib/python3.11/multiprocessing/queues.py")], "data"),
    ([MOD, F("_BaseDataLoaderIter.__next__", TORCH + "/utils/data/dataloader.py"),
      F("_SingleProcessDataLoaderIter._next_data", TORCH + "/utils/data/dataloader.py"),
      F("Slow.__getitem__", "/home/u/train.py", 30)], "data"),
    ([MOD, F("Module._wrapped_call_impl", TORCH + "/nn/modules/module.py"),
      F("Module._call_impl", TORCH + "/nn/modules/module.py"), F("Net.forward", "/home/u/train.py", 5)], "forward"),
    ([MOD, F("Tensor.backward", TORCH + "/_tensor.py"), F("backward", TORCH + "/autograd/__init__.py"),
      F("_engine_run_backward", TORCH + "/autograd/graph.py")], "backward"),
    # a forward recomputed under backward (activation checkpointing) is backward: the outermost wins
    ([MOD, F("Tensor.backward", TORCH + "/_tensor.py"),
      F("Module._call_impl", TORCH + "/nn/modules/module.py")], "backward"),
    ([MOD, F("Optimizer.profile_hook_step.<locals>.wrapper", TORCH + "/optim/optimizer.py"),
      F("SGD.step", TORCH + "/optim/sgd.py")], "optimizer"),
    ([MOD, F("all_reduce", TORCH + "/distributed/distributed_c10d.py")], "collective"),
    ([MOD, F("save", TORCH + "/serialization.py"), F("_save", TORCH + "/serialization.py")], "checkpoint"),
    ([MOD, F("Logger.info", "/usr/lib/python3.11/logging/__init__.py")], "logging"),
    ([MOD, F("synchronize", TORCH + "/cuda/__init__.py")], "sync"),
    ([MOD, F("evaluate", "/home/u/train.py", 40), F("Module._call_impl", TORCH + "/nn/modules/module.py")],
     "evaluation"),
    ([MOD, F("decorate_context", TORCH + "/utils/_contextlib.py"), F("score", "/home/u/train.py", 44),
      F("Module._call_impl", TORCH + "/nn/modules/module.py")], "evaluation"),
    ([MOD, F("train_one_epoch", "/home/u/train.py", 50)], "other"),
    ([], "other"),
])
def test_classify(stack, phase):
    assert classify(stack) == phase


def test_sync_recognised_from_the_users_line(tmp_path):
    leaf = user(tmp_path, "    total += loss.item()   # the host waits here")
    assert classify([MOD, leaf]) == "sync"
    leaf = user(tmp_path, "    # loss.item() in a comment is not a sync")
    assert classify([MOD, leaf]) == "other"


def test_user_frames():
    assert is_user_frame(F("f", "/home/u/train.py"))
    assert not is_user_frame(F("f", TORCH + "/nn/modules/module.py"))
    assert not is_user_frame(F("f", "/usr/lib/python3.11/threading.py"))
    assert not is_user_frame(F("f", "<frozen importlib._bootstrap>"))
    assert not is_user_frame(F("thread (1)", "", 0))


def test_cycles():
    assert count_cycles(["data", "forward", "backward", "optimizer"] * 3) == 11
    assert count_cycles(["other"] * 40) == 0
    assert count_cycles(["backward"] * 40) == 0
    assert count_cycles(["other"] * 20 + ["backward"] + ["other"] * 20) == 1


def _doc(pid, stacks, frames, name="MainThread", extra=()):
    return {"shared": {"frames": frames},
            "profiles": [{"type": "sampled", "name": f'Process {pid} Thread {pid} "{name}"',
                          "samples": stacks, "weights": [0.05] * len(stacks)}, *extra]}


def test_parse_speedscope_and_stuck(tmp_path):
    code = tmp_path / "t.py"
    code.write_text("import threading\nlock = threading.Lock()\nlock.acquire()\nlock.acquire()\n")
    frames = [{"name": "<module>", "file": str(code), "line": 4},
              {"name": "process 7", "file": "", "line": 0}]
    doc = _doc(7, [[1, 0]] * 30, frames)
    threads = parse_speedscope(doc)[7]
    assert threads[0].stacks[0] == (Frame("<module>", str(code), 4),)     # synthetic frame dropped
    s = summarise_main(threads[0], rate=20)
    assert s["stuck"]["where"]["line"] == 4
    assert "lock" in s["stuck"]["waits_on"]
    assert s["stuck"]["seconds_at_least"] == 1.5
    assert s["cycles"] == 0


def test_a_wait_that_ends_is_not_stuck():
    """A DDP rank that waits in backward's all-reduce ~99% of each step for a slower rank: the few samples
    that catch its forward or its optimizer step show it moving (not stuck); a differing sample in no
    training phase (a torn read) does not."""
    frames = [{"name": "<module>", "file": "/home/u/train.py", "line": 20},
              {"name": "Tensor.backward", "file": TORCH + "/_tensor.py", "line": 1},
              {"name": "_engine_run_backward", "file": TORCH + "/autograd/graph.py", "line": 1},
              {"name": "Module._call_impl", "file": TORCH + "/nn/modules/module.py", "line": 1},
              {"name": "Net.forward", "file": "/home/u/train.py", "line": 5}]
    wait, fwd, torn = [0, 1, 2], [0, 3, 4], [0]
    moving = _doc(7, [wait] * 150 + [fwd] + [wait] * 249, frames)
    s = summarise_main(parse_speedscope(moving)[7][0], rate=100)
    assert s["stuck"] is None and s["cycles"] >= 1
    torn_read = _doc(7, [wait] * 150 + [torn] + [wait] * 249, frames)
    s = summarise_main(parse_speedscope(torn_read)[7][0], rate=100)
    assert s["stuck"] is not None and s["stuck"]["phase"] == "backward"


def test_sleeping_loop_is_not_stuck(tmp_path):
    code = tmp_path / "t.py"
    code.write_text("import time\nwhile True:\n    time.sleep(1)\n")
    doc = _doc(7, [[0]] * 30, [{"name": "<module>", "file": str(code), "line": 3}])
    assert summarise_main(parse_speedscope(doc)[7][0], rate=20)["stuck"] is None


def test_worker_busy_below_the_worker_loop():
    wl = TORCH + "/utils/data/_utils/worker.py"
    frames = [{"name": "<module>", "file": "/home/u/train.py", "line": 52},           # inherited by fork
              {"name": "_worker_loop", "file": wl, "line": 300},
              {"name": "Queue.get", "file": "/usr/lib/python3.11/multiprocessing/queues.py", "line": 100},
              {"name": "_MapDatasetFetcher.fetch", "file": TORCH + "/utils/data/_utils/fetch.py", "line": 50},
              {"name": "Slow.__getitem__", "file": "/home/u/train.py", "line": 30}]
    idle = _doc(8, [[0, 1, 2]] * 10, frames)
    assert summarise_worker(parse_speedscope(idle)[8], 8)["busy_share"] == 0.0
    busy = _doc(8, [[0, 1, 3, 4]] * 9 + [[0, 1, 2]], frames)
    w = summarise_worker(parse_speedscope(busy)[8], 8)
    assert w["busy_share"] == 0.9
    assert w["top_frames"][0]["line"] == 30


# ---- errors: bad PIDs and permissions ------------------------------------------------------------------

def test_missing_pid(capsys):
    assert main(["attach", "99999999", "--duration", "1"]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and "Traceback" not in err


def test_not_python(capsys):
    p = subprocess.Popen(["sleep", "60"])
    try:
        assert main(["attach", str(p.pid), "--duration", "1"]) == 2
        assert "not a Python process" in capsys.readouterr().err
    finally:
        p.kill()
        p.wait()


def test_python_without_torch_is_not_a_training_job(capsys):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import time
        time.sleep(0.5)
        assert main(["attach", str(p.pid), "--duration", "1"]) == 2
        assert "not visibly a training job" in capsys.readouterr().err
    finally:
        p.kill()
        p.wait()


def test_usage_errors(capsys):
    assert main(["attach"]) == 2
    assert "nothing to attach to" in capsys.readouterr().err
    assert main(["attach", "12", "--job", "13"]) == 2
    with pytest.raises(SystemExit) as e:
        main(["attach", "abc"])
    assert e.value.code == 2


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """A scripted py-spy that fails as py-spy does without ptrace rights."""
    def make(stderr: str):
        exe = tmp_path / "py-spy"
        exe.write_text("#!/bin/sh\ncat >&2 <<'EOF'\n" + stderr + "\nEOF\nexit 1\n")
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv(pyspy.ENV_PYSPY, str(exe))
        return exe
    return make


@pytest.fixture
def python_target():
    # a Python process that has torch's name in its maps is not needed: --any-process skips that test
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p
    p.kill()
    p.wait()


PERM = "Error: Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'"


def test_ptrace_scope_sentence(standin, python_target, monkeypatch, tmp_path, capsys):
    standin(PERM)
    scope = tmp_path / "ptrace_scope"
    scope.write_text("1\n")
    monkeypatch.setattr(pyspy, "PTRACE_SCOPE_FILE", str(scope))
    monkeypatch.setattr(pyspy, "has_cap_sys_ptrace", lambda *a: False)
    assert main(["attach", str(python_target.pid), "--any-process", "--duration", "1"]) == 2
    err = capsys.readouterr().err
    assert "kernel.yama.ptrace_scope=1" in err and "sysctl kernel.yama.ptrace_scope=0" in err
    assert err.count("\n") <= 2


def test_ptrace_scope_3(standin, python_target, monkeypatch, tmp_path, capsys):
    standin(PERM)
    scope = tmp_path / "ptrace_scope"
    scope.write_text("3\n")
    monkeypatch.setattr(pyspy, "PTRACE_SCOPE_FILE", str(scope))
    assert main(["attach", str(python_target.pid), "--any-process", "--duration", "1"]) == 2
    assert "ptrace_scope=3" in capsys.readouterr().err


def test_container_without_cap_sys_ptrace(standin, python_target, monkeypatch, tmp_path, capsys):
    standin(PERM)
    monkeypatch.setattr(pyspy, "PTRACE_SCOPE_FILE", str(tmp_path / "absent"))
    monkeypatch.setattr(pyspy, "has_cap_sys_ptrace", lambda *a: False)
    assert main(["attach", str(python_target.pid), "--any-process", "--duration", "1"]) == 2
    assert "--cap-add SYS_PTRACE" in capsys.readouterr().err


def test_another_users_process(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    e = pyspy.permission_error(42, owner_uid=0, scope=0, cap=False)
    assert "belongs to user root" in e.message and "sudo" in e.message


def test_cap_parsing(tmp_path):
    st = tmp_path / "status"
    st.write_text("Name:\tx\nCapEff:\t00000000a80425fb\n")
    assert pyspy.has_cap_sys_ptrace(str(st)) is False
    st.write_text("Name:\tx\nCapEff:\t000001ffffffffff\n")
    assert pyspy.has_cap_sys_ptrace(str(st)) is True


def test_real_pyspy_is_installed():
    out = subprocess.run([pyspy.executable(), "--version"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.startswith("py-spy")


# ---- judgement over hand-built attach evidence ------------------------------------------------------------

def _evidence(phases: dict, workers=(), stuck=None, cycles=5, ranks=1):
    from diag.evidence import Evidence, RankEvidence, RunInfo

    ev = Evidence(run=RunInfo(id="t", launcher="attach", status="running", wall_s=10.0))
    ev.run.source = "attach"
    n = 200
    for rank in range(ranks):
        ph = phases if not isinstance(phases, list) else phases[rank]
        main_d = {"samples": n, "phases": {p: {"samples": int(s * n), "share": s} for p, s in ph.items()},
                  "hot_lines": [{"file": "/home/u/train.py", "line": 7, "function": "f", "code": "x", "share": 0.5,
                                 "samples": 100, "phase": max(ph, key=ph.get)}],
                  "sync_lines": [], "stuck": stuck, "cycles": cycles}
        r = RankEvidence(rank=rank, world_size=ranks, pid=100 + rank)
        r.extras["attach"] = {"source": "attach", "pid": 100 + rank, "main": main_d, "workers": list(workers),
                              "window_s": 10.0, "cpu_percent": 10.0}
        ev.ranks.append(r)
    return ev


def judge(ev, select=(), ignore=()):
    """What diag attach and diag check --from do: the one registry over the evidence."""
    from diag.registry import Registry

    return Registry.discover().select(select, ignore).run(ev)


def _by_id(findings):
    out = {}
    for f in findings:
        out.setdefault(f.id, []).append(f)
    return out


def test_judge_saturated_workers():

    ev = _evidence({"data": 0.6, "forward": 0.2, "backward": 0.2},
                   workers=[{"pid": 5, "busy_share": 0.97, "cpu_percent": 99.0, "top_frames": []}] * 2)
    f = _by_id(judge(ev))
    assert len(f["dataloader.workers"]) == 1                    # the attach variant replaced the probe check
    assert f["dataloader.workers"][0].severity.value == "warning"
    assert "saturated" in f["dataloader.workers"][0].message
    assert f["run.no-steps"][0].severity.value == "skipped"
    assert "Not observable by sampling" in f["run.no-steps"][0].message
    assert f["run.hung"][0].severity.value == "pass"


def test_judge_idle_workers_main_slow():

    ev = _evidence({"data": 0.02, "forward": 0.5, "backward": 0.48},
                   workers=[{"pid": 5, "busy_share": 0.05, "cpu_percent": 3.0, "top_frames": []}])
    f = _by_id(judge(ev))["dataloader.workers"][0]
    assert f.severity.value == "pass" and "main process is the slow side" in f.message


def test_judge_stuck_is_error_and_select():
    from diag.commands.check import exit_code_for

    stuck = {"where": {"file": "/home/u/train.py", "line": 9, "function": "f", "code": "q.get()"},
             "waits_on": "a queue.Queue.get() with no timeout", "seconds_at_least": 10.0, "phase": "other",
             "share": 1.0, "stack": []}
    ev = _evidence({"other": 1.0}, stuck=stuck, cycles=0)
    findings = judge(ev)
    hung = _by_id(findings)["run.hung"][0]
    assert hung.severity.value == "error" and hung.location.line == 9
    assert exit_code_for(ev, findings, "error") == 1
    only = judge(ev, select=["run.hung"])
    assert {f.id for f in only} == {"run.hung"}


def test_attach_checks_silent_on_probe_evidence():
    from diag.evidence import Evidence
    from diag.registry import Registry

    findings = Registry.discover().run(Evidence())
    ids = [f.id for f in findings]
    assert ids.count("dataloader.workers") == 1        # only the probe's own check answers
    assert [f for f in findings if f.id == "run.hung"][0].severity.value == "skipped"


def test_from_rejects_probe_evidence(tmp_path, capsys):
    from diag.evidence import Evidence

    p = tmp_path / "evidence.json"
    Evidence().save(p)
    assert main(["attach", "--from", str(p)]) == 2
    assert "not written by diag attach" in capsys.readouterr().err


def test_gpu_low_utilization_from_simulated_telemetry():
    """The GPU side through diag.gpu: a window's telemetry from the simulated 'starved' scenario."""
    from diag.gpu import SimulatedProvider
    from diag.gpu.sampler import Sampler

    clock = iter(range(1000))
    prov = SimulatedProvider("starved", clock=lambda: float(next(clock)))
    s = Sampler(prov, interval=1.0, host=False)
    s.track(os.getpid())
    for _ in range(8):
        s.sample_once()
    ev = _evidence({"data": 0.7, "forward": 0.2, "backward": 0.1})
    ev.gpu = s.to_evidence()
    ev.run.simulated_gpus = "starved"
    f = _by_id(judge(ev))["gpu.low-utilization"]
    assert len(f) == 1 and f[0].severity.value == "warning", f
    assert "simulated" in f[0].message and "data" in f[0].message
    assert f[0].evidence["cause_phase"] == "data"


def test_stuck_in_a_collective_names_it():
    frames = [{"name": "<module>", "file": "/home/u/train.py", "line": 12},
              {"name": "all_reduce", "file": TORCH + "/distributed/distributed_c10d.py", "line": 2800}]
    s = summarise_main(parse_speedscope(_doc(9, [[0, 1]] * 40, frames))[9][0], rate=20)
    assert s["stuck"]["waits_on"] == "the collective all_reduce (torch.distributed)"
    assert s["stuck"]["phase"] == "collective"
    assert s["stuck"]["where"]["line"] == 12


def test_hung_job_names_the_rank_stuck_elsewhere():

    def stuck(line, waits):
        return {"where": {"file": "/home/u/train.py", "line": line, "function": "f", "code": "x"},
                "waits_on": waits, "seconds_at_least": 10.0, "phase": "collective", "share": 1.0, "stack": []}

    ev = _evidence({"collective": 1.0}, stuck=stuck(30, "the collective all_reduce (torch.distributed)"),
                   cycles=0, ranks=3)
    odd = ev.ranks[2].extras["attach"]["main"]
    odd["stuck"] = stuck(41, "the collective broadcast (torch.distributed)")
    hung = _by_id(judge(ev))["run.hung"][0]
    assert hung.severity.value == "error"
    assert "Odd one out: rank 2" in hung.message
    assert "rank 0, rank 1 at train.py:30" in hung.message


def test_diag_check_from_attach_evidence_uses_the_attach_judgement(tmp_path, capsys):
    ev = _evidence({"data": 0.6, "forward": 0.4})
    p = tmp_path / "evidence.json"
    ev.save(p)
    code = main(["check", "--from", str(p), "--format", "json"])
    rep = json.loads(capsys.readouterr().out)
    by = {f["id"]: f for f in rep["findings"]}
    assert by["run.no-steps"]["severity"] == "skipped"          # not an error: sampling has no steps
    assert by["dataloader.workers"]["check"] == "attach.dataloader-workers"
    assert code == 1 if by["dataloader.workers"]["severity"] == "error" else code == 0


TORN = """Error: Failed to get stack traces

Caused by:
    0: Failed to call get_stack_trace for thread 140670385806208
    1: Failed to copy PyCodeObject
    2: Bad address (os error 14)"""


def _counting_standin(tmp_path, monkeypatch, fail_times: int, stderr: str):
    """A py-spy that fails ``fail_times`` times with ``stderr``, then dumps no thread; it counts its
    calls in a file."""
    count = tmp_path / "calls"
    count.write_text("0")
    exe = tmp_path / "py-spy"
    exe.write_text("#!/bin/sh\n"
                   f"n=$(cat {count}); n=$((n+1)); echo $n > {count}\n"
                   f"if [ $n -le {fail_times} ]; then cat >&2 <<'EOF'\n{stderr}\nEOF\nexit 1; fi\n"
                   "echo '[]'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv(pyspy.ENV_PYSPY, str(exe))
    return lambda: int(count.read_text())


def test_a_torn_dump_is_read_again(tmp_path, monkeypatch):
    """py-spy --nonblocking catches a busy target mid-change about once in twenty dumps (seen as an
    attach that printed nothing in CI): the dump is tried again."""
    calls = _counting_standin(tmp_path, monkeypatch, 2, TORN)
    assert pyspy.dump(os.getpid()) == []
    assert calls() == 3


def test_a_dump_torn_every_time_is_one_sentence(tmp_path, monkeypatch):
    calls = _counting_standin(tmp_path, monkeypatch, 99, TORN)
    with pytest.raises(DiagError) as e:
        pyspy.dump(os.getpid())
    assert calls() == pyspy.DUMP_TRIES
    assert "Failed to get stack traces" in str(e.value)


def test_a_permission_error_is_not_retried(tmp_path, monkeypatch):
    calls = _counting_standin(tmp_path, monkeypatch, 99, PERM)
    with pytest.raises(DiagError):
        pyspy.dump(os.getpid())
    assert calls() == 1


def test_one_busy_data_call_for_a_short_window_is_judged_not_hung():
    """A 2-s window at 20 Hz of a job whose __getitem__ spins on one line: every sample can show the
    same stack (seen in CI under load). The process computes (CPU well above a wait's), so it is not
    stuck: run.hung warns 'one call', and dataloader.workers judges the window (all of it data)."""
    stuck = {"where": {"file": "/home/u/train.py", "line": 33, "function": "__getitem__",
                       "code": "while time.perf_counter() < busy_until:"},
             "waits_on": None, "seconds_at_least": 2.0, "phase": "data", "share": 1.0, "stack": []}
    ev = _evidence({"data": 1.0}, stuck=stuck, cycles=0)
    ev.ranks[0].extras["attach"]["cpu_percent"] = 38.0       # what a loaded 2-core machine leaves it
    f = _by_id(judge(ev))
    assert f["run.hung"][0].severity.value == "warning" and "One line" in f["run.hung"][0].title
    assert "run over and over" in f["run.hung"][0].message
    dw = f["dataloader.workers"][0]
    assert dw.severity.value == "warning" and "num_workers=0" in dw.message
    # the same stack with the CPU of a wait is a hang: the data check leaves it to run.hung
    ev.ranks[0].extras["attach"]["cpu_percent"] = 1.0
    f = _by_id(judge(ev))
    assert f["run.hung"][0].severity.value == "error"
    assert f["dataloader.workers"][0].severity.value == "skipped"
