"""Event kinds are spelled once, in diag/evidence/events.py (issue 28): the probe, the launcher and the
fold import them; no emit, no event literal and no comparison spells a kind as a string."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from diag.evidence import events

ROOT = Path(__file__).resolve().parents[1]
KINDS = set(events.ALL)
_PATTERNS = [
    re.compile(r'\bemit(?:_dict)?\(\s*["\']([a-z_]+)["\']'),                  # emit("step", ...)
    re.compile(r'["\']kind["\']\s*:\s*["\']([a-z_]+)["\']'),                  # {"kind": "child", ...}
    re.compile(r'\.get\(\s*["\']kind["\']\s*\)\s*(?:==|!=)\s*["\']([a-z_]+)["\']'),   # e.get("kind") == "step"
    re.compile(r'\bkind\s*(?:==|!=)\s*["\']([a-z_]+)["\']'),                  # kind == "end"
]


# the code that writes or reads events (a run's kind, "training" or "evaluation", is another thing)
EVENT_CODE = sorted([*(ROOT / "diag" / "probe").rglob("*.py"),
                     *(ROOT / "diag" / n for n in ("fold.py", "runner.py", "merge.py", "inprocess.py",
                                                   "supervise.py", "torchrun.py"))])


def test_no_event_kind_is_spelled_as_a_literal():
    hits = []
    for p in EVENT_CODE:
        for n, line in enumerate(p.read_text().splitlines(), 1):
            for rx in _PATTERNS:
                for m in rx.finditer(line):
                    if m.group(1) in KINDS:
                        hits.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not hits, "event kinds spelled as literals (use diag.evidence.events):\n" + "\n".join(hits)


def test_the_probe_imports_the_kinds_without_the_whole_evidence_package():
    """diag.evidence loads its sections on first use: the user's process gets only the kinds."""
    code = ("import sys, diag.probe.core; "
            "print(sorted(m for m in sys.modules if m.startswith('diag.evidence')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "['diag.evidence', 'diag.evidence.events']", out.stdout
