"""Introspection of frames: which frame is the user's code, where a call came from, and the
user-facing description of an exception (its traceback without diag's own frames)."""
from __future__ import annotations

import os
import sys
import traceback

_DIAG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEMO_DIR = os.path.join(_DIAG_DIR, "demo") + os.sep   # the bundled demos are user code


def user_frame(start_depth: int = 2):
    """The innermost frame that is not inside torch, diag or the standard library's runpy."""
    f = sys._getframe(start_depth)
    while f is not None:
        fn = f.f_code.co_filename
        if not (is_library_file(fn)):
            return f
        f = f.f_back
    return None


_LIB_CACHE: dict[str, bool] = {}


def is_library_file(fn: str) -> bool:
    """Is ``fn`` (a code object's file name) torch, diag (its bundled demos excepted) or a standard
    library module that only forwards calls (runpy, contextlib, threading, functools)?"""
    r = _LIB_CACHE.get(fn)
    if r is None:
        r = (
            fn.startswith("<")
            or f"{os.sep}torch{os.sep}" in fn
            or (fn.startswith(_DIAG_DIR + os.sep) and not fn.startswith(_DEMO_DIR))
            or f"{os.sep}runpy.py" in fn
            or f"{os.sep}contextlib.py" in fn
            or f"{os.sep}threading.py" in fn
            or f"{os.sep}functools.py" in fn
        )
        _LIB_CACHE[fn] = r
    return r


def frame_location(f) -> dict | None:
    if f is None:
        return None
    return {"file": f.f_code.co_filename, "line": f.f_lineno, "function": f.f_code.co_name}


def is_oom(exc: BaseException) -> bool:
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except Exception:
        pass
    msg = str(exc)
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        "out of memory" in msg.lower() or isinstance(exc, MemoryError))


def exception_info(exc: BaseException, step: int | None, script: str | None) -> dict:
    tb = exc.__traceback__
    frames = traceback.extract_tb(tb)
    # drop diag's own frames (runpy, the probe) from the top of the traceback
    keep_from = 0
    for i, fr in enumerate(frames):
        if not is_library_file(fr.filename) or (script and fr.filename == script):
            keep_from = i
            break
    text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames[keep_from:])) + \
        "".join(traceback.format_exception_only(type(exc), exc))
    loc = None
    for fr in reversed(frames):
        if not is_library_file(fr.filename):
            loc = {"file": fr.filename, "line": fr.lineno, "function": fr.name}
            break
    return {
        "type": type(exc).__name__, "message": str(exc)[:4000], "traceback": text[-20000:],
        "is_oom": is_oom(exc), "step": step, "location": loc,
    }


# the name the extensions and the replay used before this module existed
_is_library_file = is_library_file
