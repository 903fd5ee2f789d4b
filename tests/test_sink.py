"""The probe's event file (diag/probe/sink.py, issue 20): step events leave the step's thread and are
written by a writer thread at most FLUSH_S later; every other event writes the waiting ones first, so
the file keeps the order of emission; a forked child writes nothing; os._exit under the probe loses
nothing; NaN becomes null."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest

from diag.probe import sink as sink_mod
from diag.probe.sink import FileSink


def _lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_step_events_are_written_by_the_writer_thread_within_the_flush_interval(tmp_path):
    p = tmp_path / "ev.jsonl"
    s = FileSink(str(p))
    try:
        s({"kind": "step", "index": 1})
        assert s._thread is not None and s._thread.daemon
        deadline = time.monotonic() + 10 * sink_mod.FLUSH_S + 5
        while time.monotonic() < deadline and not _lines(p):
            time.sleep(0.02)
        assert _lines(p) == [{"kind": "step", "index": 1}]
        assert s.writer_ns > 0
    finally:
        s.close()
    assert not s._thread.is_alive()


def test_other_events_write_the_waiting_steps_first_and_close_writes_the_rest(tmp_path):
    p = tmp_path / "ev.jsonl"
    s = FileSink(str(p))
    s({"kind": "step", "index": 1})
    s({"kind": "append", "path": "memory.steps", "value": {"step": 1}})   # a per-step record: deferred too
    s({"kind": "step", "index": 2})
    s({"kind": "set", "path": "x", "value": 1})          # written now, after the waiting events
    assert [e.get("index", e["kind"]) for e in _lines(p)] == [1, "append", 2, "set"]
    s({"kind": "step", "index": 3, "total_s": float("nan")})
    s.close()
    got = _lines(p)
    assert [e.get("index", e["kind"]) for e in got] == [1, "append", 2, "set", 3]
    assert got[-1]["total_s"] is None                   # NaN has no JSON spelling
    s({"kind": "step", "index": 4})                      # after close: dropped, no error
    assert len(_lines(p)) == 5


def test_the_writer_encodes_in_chunks_and_gives_the_gil_back_between_them(tmp_path, monkeypatch):
    # the writer thread's flush (FileSink._flush_chunked): CHUNK lines, written, then a real sleep (the
    # script's thread takes the GIL); an event written in place between two chunks keeps the file's order
    p = tmp_path / "ev.jsonl"
    s = FileSink(str(p), defer_steps=True)
    monkeypatch.setattr(sink_mod, "CHUNK", 3)
    seen = []

    def sleep(dt):
        seen.append((dt, [e.get("index", e["kind"]) for e in _lines(p)], len(s._pending)))
        if len(seen) == 2:
            s({"kind": "set", "path": "x", "value": 1})   # drains the rest first, under the lock

    monkeypatch.setattr(sink_mod.time, "sleep", sleep)
    for i in range(1, 11):
        s._pending.append({"kind": "step", "index": i})   # (the writer thread is not started: no step event emitted)
    s._flush_chunked()
    assert seen[0] == (sink_mod.BREATHE_S, [1, 2, 3], 7)
    assert seen[1] == (sink_mod.BREATHE_S, [1, 2, 3, 4, 5, 6], 4)
    assert len(seen) == 2                                    # the in-place write took the rest
    assert [e.get("index", e["kind"]) for e in _lines(p)] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, "set"]
    # past BACKLOG waiting events it does not breathe (it catches up)
    monkeypatch.setattr(sink_mod, "BACKLOG", 4)
    seen.clear()
    for i in range(11, 21):
        s._pending.append({"kind": "step", "index": i})
    s._flush_chunked()
    assert [n for _, _, n in seen] == [1]                   # slept only once fewer than 4 waited
    s.close()
    assert [e.get("index") for e in _lines(p)][-10:] == list(range(11, 21))


def test_a_full_disk_in_the_writer_thread_reaches_the_next_call(tmp_path, monkeypatch):
    s = FileSink(str(tmp_path / "ev.jsonl"))
    try:
        def full(*a, **k):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(s, "_write", full)
        s({"kind": "step", "index": 1})
        deadline = time.monotonic() + 10 * sink_mod.FLUSH_S + 5
        while time.monotonic() < deadline and s._error is None:
            time.sleep(0.02)
        with pytest.raises(OSError):
            s({"kind": "step", "index": 2})
    finally:
        monkeypatch.undo()
        s.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_writes_nothing(tmp_path):
    p = tmp_path / "ev.jsonl"
    s = FileSink(str(p))
    s({"kind": "step", "index": 1})
    pid = os.fork()
    if pid == 0:                     # the child: a DataLoader worker would be here
        try:
            s({"kind": "set", "path": "child"})
            s({"kind": "step", "index": 99})
            s.flush()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    s.close()
    assert [e.get("index", e["kind"]) for e in _lines(p)] == [1]


def test_a_script_that_ends_with_os_exit_loses_no_step_event(tmp_path):
    script = tmp_path / "exits.py"
    script.write_text(textwrap.dedent("""
        import os, torch
        m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), 0.1)
        for _ in range(4):
            opt.zero_grad(); m(torch.randn(8, 4)).sum().backward(); opt.step()
        os._exit(0)
    """))
    events = tmp_path / "events.jsonl"
    env = dict(os.environ, DIAG_EVENTS=str(events))
    r = subprocess.run([sys.executable, "-m", "diag.probe", str(script)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    steps = [e["index"] for e in _lines(events) if e["kind"] == "step"]
    assert steps == [1, 2, 3, 4]     # all written well within FLUSH_S: only the os._exit patch saves them


def _lane_loop(tmp_path, batches: int, body: str):
    """A plain loop the probe's lane takes (a DataLoader, SGD, 1 step in 64 sampled), ``body`` run after
    each step (indented as the loop's body, ``i`` the step's index from 0): (the script, its events'
    path, the environment to run it under ``python -m diag.probe``)."""
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(f"""
        import os, threading, time, torch
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 1); opt = torch.optim.SGD(m.parameters(), 0.1)
        for i, (x,) in enumerate(DataLoader(TensorDataset(torch.randn({batches * 8}, 4)), batch_size=8)):
            opt.zero_grad(); m(x).sum().backward(); opt.step()
    """) + textwrap.dedent(body).replace("\n", "\n    ").rstrip() + "\n")
    events = tmp_path / "events.jsonl"
    env = dict(os.environ, DIAG_EVENTS=str(events), DIAG_PROBE_BUDGET="0.0001%")   # (1 step in 64 sampled)
    return script, events, env


def test_os_exit_mid_run_loses_none_of_the_lanes_quiet_steps(tmp_path):
    """The probe's lane keeps its quiet steps' clock values on the step's thread until the next decision
    (diag.probe.lane.Lane.flush): os._exit between two of them writes them all first."""
    script, events, env = _lane_loop(tmp_path, 200, """
            if i == 149:
                os._exit(0)
    """)
    r = subprocess.run([sys.executable, "-m", "diag.probe", str(script)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    steps = [e for e in _lines(events) if e["kind"] == "step"]
    assert [e["index"] for e in steps] == list(range(1, 151))
    assert sum(1 for e in steps if e.get("sampled") is False) > 100     # the lane's steps


def test_a_script_killed_while_hung_in_c_code_loses_at_most_0_1_s_of_lane_steps(tmp_path):
    """The probe's lane keeps its quiet steps on the step's thread for up to 0.1 s (QUIET_NS): a script
    that hangs inside C code (no Python runs on its thread, so no flush) and is then killed outright
    loses those, and nothing the writer thread had (it goes on writing while the script hangs)."""
    import signal

    script, events, env = _lane_loop(tmp_path, 400, """
            time.sleep(0.004)
            if i == 239:      # (in a run of quiet steps: 1 in 64 sampled, the next decision at 256)
                print("hung", flush=True)
                lock = threading.Lock(); lock.acquire(); lock.acquire()   # (waits in C for ever)
    """)
    proc = subprocess.Popen([sys.executable, "-m", "diag.probe", str(script)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "hung"
        time.sleep(1.0)          # (the writer thread's 0.2 s, and more)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    steps = [e for e in _lines(events) if e["kind"] == "step"]
    idx = [e["index"] for e in steps]
    assert idx == list(range(1, len(idx) + 1))
    assert sum(1 for e in steps if e.get("sampled") is False) > 100     # the lane's steps
    # steps of ~4.5 ms: 0.1 s is at most 23 of them (the last decision, at step 200, is 40 steps back)
    assert 240 - 23 <= idx[-1] <= 240, idx[-1]


def test_the_writer_counts_a_record_of_many_steps_as_its_lines(tmp_path):
    """The writer thread holds the GIL for CHUNK lines at a time: a record of many steps (the probe's
    lane hands its quiet steps over in batches, diag.probe.lane.quiet_lines) counts as its lines."""
    from diag.probe.sink import CHUNK

    s = FileSink(str(tmp_path / "events.jsonl"))

    def build(rec):
        return ['{"kind": "step", "index": %d}' % i for i in rec[1]]

    build.count = lambda rec: len(rec[1])
    size = CHUNK // 2 + 1
    for k in range(4):
        s._pending.append((build, list(range(size * k, size * k + size))))
    first = s._drain_lines(CHUNK)
    assert len(first) == 1 and len(first[0].split("\n")) == size     # at most ~CHUNK lines, not 4 records
    assert len(s._drain_lines(CHUNK)) == 1
    s._pending.appendleft((build, list(range(3 * CHUNK))))
    assert len(s._drain_lines(CHUNK)) == 1       # one record past CHUNK on its own: taken all the same
    assert len(s._drain_lines()) == 2       # the rest, all at once (a flush)
    s.close()


def test_a_loaders_per_pass_record_leaves_the_step_thread_too(tmp_path):
    """issue 28: a `dataloader` event each epoch, written in place, encoded every waiting step event on
    the step's thread (~80 µs a step on a loader of 8 batches): it is deferred like a step, in order."""
    p = tmp_path / "ev.jsonl"
    s = FileSink(str(p))
    try:
        s({"kind": "step", "index": 1})
        s({"kind": "dataloader", "id": 1, "epochs": 2})
        assert len(s._pending) == 2          # nothing encoded or written on the caller's thread
        s({"kind": "end"})
        assert [e["kind"] for e in _lines(p)] == ["step", "dataloader", "end"]
    finally:
        s.close()


def test_a_deferred_loader_record_is_a_copy_of_the_probes_own():
    from diag.probe.core import _loader_event

    info = {"id": 1, "first_batch_s": [0.1]}
    ev = _loader_event(info)
    info["first_batch_s"].append(0.2)
    assert ev["first_batch_s"] == [0.1]
