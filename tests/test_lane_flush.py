"""The lane's batched quiet close on synthetic records, without torch (diag/probe/lane.py, issue 28).

``Lane.close`` keeps a quiet step's clock values as one tuple; ``Lane.flush`` turns the kept ones into
the probe's records and hands their events to the writer as one record. Here a stand-in probe and
sink take what it writes, and each figure is checked against what the step's close worked out one
step at a time before (``Lane.own``, ``build_step``)."""
from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

from diag.evidence import events as E
from diag.probe.hooks import hot_first
from diag.probe.lane import ENTRIES, QUIET_NS, Lane, build_step, quiet_lines, step_line

SKEY = "train.py:41:Net"


def _probe(ready: bool = True):
    written: list = []
    deferred: list = []
    errors: list = []
    ho = SimpleNamespace(window_calls=0, local_calls=4, outermost_forwards=0)
    sink = written.append
    fs = SimpleNamespace(ready=ready, defer=deferred.append)
    p = SimpleNamespace(_handover=ho, _est_marks=(0, 0, 0), _bwd_calls=0, slow_path_ns=300.0, hooked_call_ns=500.0,
                        autograd_hook_ns=50.0, _est_ns=0.0, _own_mark=1000, _last_core_s=2e-6, _last_extras_s=1e-6,
                        sink=sink, _forked=False, t0=10.0, rank=0,
                        report_error=lambda where, e: errors.append((where, e)))
    lane = Lane(True)
    lane.entry_ns = 100.0
    lane.skey = SKEY
    lane.n_site = 10
    lane.fast = (sink, fs, {"run": "r-1"})
    return p, lane, written, deferred, errors


def _plain(end, n0, own, start, closed, idx, samples=16):
    # (end, n0, own, start, closed, o_start, epoch, window, idx, dt_fetch, f_start, f_end, bare_s, b_start, b_end,
    #  samples, tokens): one micro-batch's clock values as Lane.close keeps them
    return (end, n0, own, start, closed, end - 2e-4, 0, False, idx, 1e-5, start + 2e-5, start + 3e-4, 0.0,
            start + 3.1e-4, start + 6e-4, samples, None)


def _records():
    r1 = _plain(11.001, 11_001_000_000, 3000, 11.0, 11.0000005, 7)
    r2 = _plain(11.002, 11_002_000_000, 7000, 11.001, 11.0010009, 8, samples=12)
    # gradient accumulation's sums (k 3): (end, n0, own, start, closed, o_start, epoch, window, idx, k, data, fwd,
    # bwd, samples, tokens, d0, f0, True)
    r3 = (11.004, 11_004_000_000, 9000, 11.002, 11.002001, 11.0038, 0, True, 9, 3, 3e-5, 9e-4, 8e-4, 48, None,
          1e-5, 11.00202, True)
    return [r1, r2, r3]


def test_flush_works_out_what_each_quiet_close_did():
    p, lane, _written, deferred, errors = _probe()
    lane.qbuf = _records()
    lane.pend = 3
    lane.q_extra = 2           # (r3's micro-batches beyond one)
    lane.flush(p)
    assert lane.qbuf == [] and not errors
    # the probe's time on each step: its time since the last step event, and the hooked calls no timer saw
    # (4 since the last flush, 500 ns each) spread over the three, with the lane's five hook entries priced
    est = 4 * 500.0 / 3 + ENTRIES * 100.0
    assert lane.cores == [3000 - 1000 + est, 7000 - 3000 + est, 9000 - 7000 + est]
    assert p._own_mark == 9000 and p._est_marks == (0, 4, 0)
    assert abs(p._est_ns - 3 * est) < 1e-9
    # the budget's lists: each step's wall time, fed with the core time of the step before it
    assert lane.q_tot == [11.001 - 11.0, 11.002 - 11.001, 11.004 - 11.002]
    assert lane.q_core == [2e-6, lane.cores[0] / 1e9, lane.cores[1] / 1e9]
    assert p._last_core_s == lane.cores[2] / 1e9 and p._last_extras_s == 0.0
    assert lane.n_site == 10 + 1 + 1 + 3 and lane.q_extra == 0
    assert lane.pend == 3        # (settle counts the steps; flush only their records)
    assert lane.q_due == 11_004_000_000 + QUIET_NS
    # one record to the writer; its lines are step_line's, for the same events build_step makes
    assert len(deferred) == 1 and deferred[0][0] is quiet_lines
    assert quiet_lines.count(deferred[0]) == 3
    lines = quiet_lines(deferred[0])
    events = [json.loads(line) for line in lines]
    assert [e["index"] for e in events] == [7, 8, 9]
    assert [e["forward_counts"] for e in events] == [{SKEY: 11}, {SKEY: 12}, {SKEY: 15}]
    assert [e["micro_batches"] for e in events] == [1, 1, 3]
    assert [e["samples"] for e in events] == [16, 12, 48]
    assert events[2].get("probe_window") is True and "probe_window" not in events[0]
    assert all(e["kind"] == E.STEP and e["run"] == "r-1" and e["sampled"] is False for e in events)
    r1 = _records()[0]
    e1 = events[0]
    assert e1["total_s"] == r1[0] - r1[3]
    assert e1["forward_s"] == r1[11] - r1[10] + r1[12] and e1["backward_s"] == r1[14] - r1[13]
    assert e1["optimizer_s"] == r1[0] - r1[5] and e1["data_s"] == r1[9]
    # pre_forward_s: from the close's end (the step machine's closed_at) to the forward, less the fetch
    assert e1["extra"]["pre_forward_s"] == int(((r1[10] - r1[4] - r1[9]) * 1e9) + 0.5) / 1e9
    assert e1["probe_s"] == int(lane.cores[0] + 0.5) / 1e9
    assert e1["t"] == int((r1[1] * 1e-9 - 10.0) * 1e6 + 0.5) / 1e6
    # key for key, the event build_step makes from the same record
    rec = (step_line, 7, r1[0] - r1[3], r1[9], r1[11] - r1[10] + r1[12], r1[14] - r1[13], r1[0] - r1[5], 16, None,
           None, r1[10] - r1[4] - r1[9], lane.cores[0], False, SKEY, 11, r1[1], 10.0, 0, {"run": "r-1"}, 1)
    assert lines[0] == step_line(rec) and e1 == build_step(rec)


def test_flush_with_nothing_kept_does_nothing():
    p, lane, written, deferred, _errors = _probe()
    lane.flush(p)
    assert not deferred and not written and lane.cores == [] and p._own_mark == 1000


def test_a_writer_that_cannot_take_them_gets_each_event_through_the_sinks_call():
    """A failed write leaves the file sink not ready: the events go through the sink's call one by one
    (which raises the writer's error for the probe to report), none lost, none tagged twice."""
    p, lane, written, deferred, errors = _probe(ready=False)
    lane.qbuf = _records()[:2]
    lane.flush(p)
    assert not deferred and not errors
    assert [e["index"] for e in written] == [7, 8]
    assert all(e["kind"] == E.STEP and "run" not in e for e in written)   # (the sink adds its own tags)

    def failing(event):
        raise OSError("No space left on device")

    p, lane, written, deferred, errors = _probe(ready=False)
    p.sink = failing
    lane.fast = (failing, lane.fast[1], {})
    lane.qbuf = _records()[:2]
    lane.flush(p)
    assert [w for w, _e in errors] == ["sink", "sink"]


def test_a_forked_child_writes_none_of_the_parents_steps():
    p, lane, written, deferred, _errors = _probe()
    p._forked = True
    lane.qbuf = _records()[:1]
    lane.flush(p)
    assert not deferred and not written


def test_hot_first_reorders_an_objects_attributes_and_changes_nothing_else():
    class Obj:
        pass

    o = Obj()
    for i in range(40):
        setattr(o, f"a{i}", i)
    d = o.__dict__
    hot_first(o, ("a37", "a3", "missing", "a20"))
    assert o.__dict__ is d                                   # the same dict, its items re-inserted
    assert list(d)[:3] == ["a37", "a3", "a20"]
    assert sorted(d) == sorted(f"a{i}" for i in range(40)) and all(getattr(o, f"a{i}") == i for i in range(40))
    assert [k for k in d if k not in ("a37", "a3", "a20")] == [f"a{i}" for i in range(40) if i not in (37, 3, 20)]
    o.late = "x"                                             # set later: at the end, as before
    assert list(d)[-1] == "late" and not hasattr(o, "missing")


def test_a_lane_steps_slots_come_first():
    hot = ("on", "phase", "it_id")
    assert Lane.__slots__[:3] == hot and len(set(Lane.__slots__)) == len(Lane.__slots__)


def test_the_lane_imports_no_torch():
    code = "import sys, diag.probe.lane; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
