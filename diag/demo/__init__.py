"""Bundled demo training scripts (shipped inside the package).

- ``planted.py``: a small CPU/GPU training script with planted performance problems.
- ``clean.py``: its clean twin; diag must find nothing wrong in it.
"""
from __future__ import annotations

from pathlib import Path

DEMO_DIR = Path(__file__).resolve().parent


def demo_path(name: str = "planted") -> Path:
    p = DEMO_DIR / f"{name}.py"
    if not p.is_file():
        names = ", ".join(sorted(x.stem for x in DEMO_DIR.glob("*.py") if not x.stem.startswith("_")))
        from diag.errors import DiagError

        raise DiagError(f"there is no bundled demo called {name!r} (available: {names})")
    return p
