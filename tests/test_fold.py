"""diag.fold: probe events folded into Evidence."""
from __future__ import annotations

from diag.evidence import Evidence
from diag.fold import fold


def test_fold_builds_rank_evidence_and_bounds_lists():
    ev = Evidence()
    fold(ev, {"kind": "start", "rank": 1, "t": 0, "pid": 7, "host": "h", "world_size": 2})
    for i in range(3):
        fold(ev, {"kind": "step", "rank": 1, "t": i, "index": i + 1, "total_s": 0.01, "data_s": 0.002,
                  "n_backward": 1, "samples": 8})
    fold(ev, {"kind": "forward_site", "rank": 1, "t": 0, "key": "s1", "module": "M", "training": False})
    fold(ev, {"kind": "forward_counts", "rank": 1, "t": 0, "counts": {"s1": 5}})
    for i in range(5):
        fold(ev, {"kind": "append", "rank": 1, "t": 0, "path": "memory.samples", "value": i, "limit": 3})
    fold(ev, {"kind": "set", "rank": 1, "t": 0, "path": "flops.measured", "value": {"flops": 10}})
    fold(ev, {"kind": "set", "rank": 1, "t": 0, "path": "nonsense.x", "value": 1})   # ignored
    fold(ev, {"kind": "end", "rank": 1, "t": 9, "status": "completed", "exit_code": 0})
    r = ev.rank(1)
    assert r.pid == 7 and r.world_size == 2 and r.status == "completed"
    assert r.step_stats.count == 3 and r.step_stats.samples == 24 and r.backward_calls == 3
    assert r.forwards[0].count == 5
    assert r.memory["samples"] == [2, 3, 4]
    assert r.flops["measured"]["flops"] == 10
    assert ev.primary is r          # no rank 0: the first rank stands in
