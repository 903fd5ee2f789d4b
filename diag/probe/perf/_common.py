"""Shared by the performance recorders: where a call came from in the user's code, with its source line."""
from __future__ import annotations

import linecache
import os
import sys

from diag.probe.frames import frame_location, line_of
from diag.probe.frames import is_library_file as _is_library_file

MAX_LOCATE = 5000       # synchronisations / copies located (counting goes on without location)
MAX_SITES = 10          # sites kept per list


def _loc_of(f) -> dict | None:
    loc = frame_location(f)
    if loc is not None:
        code = _source(loc["file"], loc["line"])
        if code:
            loc["code"] = code
    return loc


def _source(file: str, line: int | None) -> str | None:
    if not file or not line:
        return None
    try:
        text = linecache.getline(file, line).strip()
    except Exception:
        return None
    return text[:200] or None


def _count_at_caller(sites: dict) -> None:
    """Count one event at the user's line that caused it (sites: (file, line) -> site dict)."""
    f = _caller_outside_library()
    key = (f.f_code.co_filename, line_of(f)) if f is not None else ("?", 0)
    site = sites.get(key)
    if site is None:
        site = sites[key] = {"file": key[0], "line": key[1],
                             "function": f.f_code.co_name if f is not None else None,
                             "code": _source(key[0], key[1]), "count": 0}
    site["count"] += 1


def _caller_outside_library():
    """The innermost frame in the user's code, skipping the warnings module too."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not (_is_library_file(fn) or fn.endswith(os.sep + "warnings.py")):
            return f
        f = f.f_back
    return None
