"""Helpers for tests that build Evidence by hand and run built-in checks over it."""
from __future__ import annotations

from diag.evidence import Evidence, RankEvidence, StepRecord
from diag.registry import Registry


def run_check(cid, ev):
    reg = Registry.discover().select([cid])
    return [f for f in reg.run(ev) if f.id == cid]


def steps(n, total, data, fwd=0.0):
    return [StepRecord(index=i + 1, total_s=total, data_s=data, forward_s=fwd or (total - data) / 2,
                       backward_s=(total - data) / 2 if not fwd else 0.0) for i in range(n)]


def ev_with(rank: RankEvidence, cpus=8) -> Evidence:
    ev = Evidence()
    ev.ranks.append(rank)
    ev.environment.cpu_count = cpus
    ev.run.status = "completed"
    return ev
