"""Small helpers shared by the built-in checks (pure Python, over the public API only)."""
from __future__ import annotations

from diag.checks.api import fmt_bytes, fmt_pct, fmt_seconds, location

TUNING_GUIDE = "https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html"

pct = fmt_pct          # 42%, 0.5%
ms = fmt_seconds       # 2.35 s, 12.5 ms
loc = location


def gib(n: float | None) -> str:
    """1.50 GiB from 1 GiB up, whole MiB below."""
    return fmt_bytes(n, style="gib")


# ---- the script's own words (Evidence.run.script_facts, read by diag.scriptfacts) -------------------

def constructed_at(facts: dict | None, location: dict | None) -> dict | None:
    """Where the DataLoader iterated at ``location`` was constructed: the ``DataLoader(...)`` call
    assigned to the name that line iterates (the nearest one above it, else the first), or the
    script's only ``DataLoader(...)`` call; None when the source does not say."""
    if not facts or not location or not facts.get("loaders"):
        return None
    if location.get("file") and facts.get("file") and str(location["file"]) != facts["file"]:
        return None
    line = location.get("line")
    name = (facts.get("iterates") or {}).get(str(line))
    cands = [d for d in facts["loaders"] if name and name in d.get("names", [])]
    if not cands and len(facts["loaders"]) == 1:
        cands = facts["loaders"]
    if not cands:
        return None
    above = [d for d in cands if line is None or d["line"] <= line]
    pick = above[-1] if above else cands[0]
    return {"file": facts["file"], "line": pick["line"], "function": None,
            "num_workers_from": pick.get("num_workers_from")}


def flag(facts: dict | None, *words: str) -> dict | None:
    """The script's own flag whose destination holds one of ``words`` (``num_workers``, ``compile``)."""
    for f in (facts or {}).get("flags") or []:
        dest = str(f.get("dest") or "").lower()
        if any(w in dest for w in words):
            return f
    return None


def fix_site(ev, loader) -> tuple[dict | None, dict | None]:
    """(where the DataLoader's num_workers is set, the script's own workers flag or None): the flag's
    ``add_argument`` line when the DataLoader(...) call takes its num_workers from it (or the script has
    such a flag and the call names no num_workers), else the DataLoader(...) call, else None."""
    facts = getattr(ev.run, "script_facts", None)
    built = constructed_at(facts, loader.location)
    fl = flag(facts, "num_workers", "workers")
    if fl and built is not None:
        src = built.get("num_workers_from") or ""
        if fl["dest"] and fl["dest"] in src:
            return {"file": facts["file"], "line": fl["line"]}, fl
        return {"file": built["file"], "line": built["line"]}, (fl if not src else None)
    if built is not None:
        return {"file": built["file"], "line": built["line"]}, None
    return None, fl
