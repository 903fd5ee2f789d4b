"""Which knobs to try, and in what shape: from the user's ``--knob`` list, or from the findings of a
first run (each finding whose check a knob's fix words, :mod:`diag.knobs`), split into *switch*
knobs (blocks of steps of one process) and *restart* knobs (runs of their own); the rest are "not
applicable" with the catalogue's reason. Pure: findings and evidence in, a plan out."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterable

from diag.knobs import KNOBS, parse_spec, spec_text

WORTH = ("error", "warning")     # findings at these severities point to knobs by default


@dataclass
class Pick:
    knob: str                    # id
    value: int | None = None
    reason: str = ""             # why it is tried ("finding dataloader.workers", "--knob")

    @property
    def spec(self) -> str:
        return spec_text(self.knob, self.value)

    @property
    def mode(self) -> str:
        return KNOBS[self.knob].mode


@dataclass
class Plan:
    switch: list[Pick] = field(default_factory=list)
    restart: list[Pick] = field(default_factory=list)
    not_applicable: list[tuple[Pick, str]] = field(default_factory=list)
    left_out: list[tuple[Pick, str]] = field(default_factory=list)

    @property
    def picks(self) -> list[Pick]:
        return self.switch + self.restart


def from_specs(specs: Iterable[str]) -> list[Pick]:
    """``--knob`` values (repeatable, comma-separated) -> picks; ValueError with one sentence on a bad one."""
    out: list[Pick] = []
    seen = set()
    for text in specs:
        for part in str(text).split(","):
            if not part.strip():
                continue
            kid, value = parse_spec(part)
            if kid in seen:
                raise ValueError(f"knob {kid!r} is given twice")
            seen.add(kid)
            out.append(Pick(kid, value, "--knob"))
    return out


def _severity(f: Any) -> str:
    sev = getattr(f, "severity", None)
    return str(getattr(sev, "value", sev) or "")


def from_findings(findings: Iterable[Any], cpus: int | None = None) -> list[Pick]:
    """The knobs the findings point to: a finding's own ``evidence["knob"]`` first, else the one knob
    whose fix words that check (a check that several knobs word, such as gpu.low-utilization, points
    to none unless it names its knob). ``dataloader.workers`` takes the finding's recommended count."""
    by_check: dict[str, list[str]] = {}
    for k in KNOBS.values():
        for c in k.checks:
            by_check.setdefault(c, []).append(k.id)
    out: dict[str, Pick] = {}
    for f in findings:
        if _severity(f) not in WORTH:
            continue
        ev = getattr(f, "evidence", None) or {}
        kid = ev.get("knob") if isinstance(ev.get("knob"), str) else None
        if kid not in KNOBS:
            cands = by_check.get(getattr(f, "check", None) or f.id, [])
            kid = cands[0] if len(cands) == 1 else None
        if kid is None or kid in out:
            continue
        value = None
        if KNOBS[kid].param is not None:
            if kid == "dataloader.workers":
                rec = ev.get("recommended_workers")
                value = int(rec) if isinstance(rec, int) and rec > 0 else default_workers(cpus)
            else:
                continue        # a knob that needs a number the finding does not give
        out[kid] = Pick(kid, value, f"finding {f.id}")
    return list(out.values())


def default_workers(cpus: int | None = None) -> int:
    cpus = cpus or os.cpu_count() or 2
    return max(1, min(8, cpus - 1))


def split(picks: list[Pick]) -> Plan:
    plan = Plan()
    for p in picks:
        k = KNOBS[p.knob]
        if p.knob == "dataloader.workers" and p.value is None:
            p.value = default_workers()
        if k.mode == "switch":
            plan.switch.append(p)
        elif k.mode == "restart":
            plan.restart.append(p)
        else:
            plan.not_applicable.append((p, k.outside or "diag cannot apply it from outside the script"))
    return plan
