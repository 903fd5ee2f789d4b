"""Introspection of frames: which frame is the user's code, where a call came from, and the
user-facing description of an exception (its traceback without diag's own frames)."""
from __future__ import annotations

import os
import re
import site
import sys
import sysconfig
import traceback
import types

_DIAG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_DEMO_DIR = os.path.join(_DIAG_DIR, "demo") + os.sep   # the bundled demos are user code


def user_frame(start_depth: int = 2):
    """The innermost frame that is not inside torch, diag or the standard library's runpy."""
    f = sys._getframe(start_depth)
    while f is not None:
        fn = f.f_code.co_filename
        lib = _LIB_CACHE.get(fn)          # the cache first: called per outermost forward (issue 20)
        if lib is None:
            lib = is_library_file(fn)
        if not lib:
            return f
        f = f.f_back
    return None


_LIB_CACHE: dict[str, bool] = {}


def _library_roots() -> tuple[str, ...]:
    """Directories whose files are never the user's code: the standard library and every
    installed-packages directory (site-packages / dist-packages) this interpreter knows."""
    roots: set[str] = set()
    try:
        paths = sysconfig.get_paths()
        for key in ("stdlib", "platstdlib", "purelib", "platlib"):
            if paths.get(key):
                roots.add(os.path.realpath(paths[key]))
    except Exception:
        pass
    try:
        roots.update(os.path.realpath(p) for p in site.getsitepackages())
    except Exception:
        pass
    try:
        roots.add(os.path.realpath(site.getusersitepackages()))
    except Exception:
        pass
    return tuple(sorted(r.rstrip(os.sep) + os.sep for r in roots if r and r != os.sep))


_LIB_ROOTS = _library_roots()
_SCRIPT_DIRS: list[str] = []   # directories of the script diag runs: user code even under a library root


def set_user_script(path: str | None) -> None:
    """The script diag runs is the user's code wherever it lives (also inside a library root)."""
    if path:
        d = os.path.dirname(os.path.realpath(path)) + os.sep
        if d not in _SCRIPT_DIRS:
            _SCRIPT_DIRS.append(d)
            _LIB_CACHE.clear()


def is_library_file(fn: str) -> bool:
    """Is ``fn`` (a code object's file name) code that is not the user's: torch, diag (its bundled
    demos excepted), the standard library, or any installed package (site-packages / dist-packages:
    transformers, Lightning, accelerate, ...)? Calls through such frames are located at the first
    frame of the user's own code that led to them."""
    r = _LIB_CACHE.get(fn)
    if r is None:
        if fn.startswith("<"):
            r = True
        elif fn.startswith(_DIAG_DIR + os.sep):
            r = not fn.startswith(_DEMO_DIR)
        elif f"{os.sep}torch{os.sep}" in fn or f"{os.sep}site-packages{os.sep}" in fn \
                or f"{os.sep}dist-packages{os.sep}" in fn:
            r = True
        else:
            real = os.path.realpath(fn) if os.path.isabs(fn) else os.path.abspath(fn)
            r = any(real.startswith(root) for root in _LIB_ROOTS) and \
                not any(real.startswith(d) for d in _SCRIPT_DIRS)
        _LIB_CACHE[fn] = r
    return r


# ANSI escape sequences (CSI, OSC, two-character escapes) and other C0/C1 control characters except
# newline and tab: the script's messages may carry them (coloured tracebacks, rich output)
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]|[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences and control characters (newlines and tabs kept)."""
    return _ANSI.sub("", text) if text else text


_LINES: dict = {}      # (id(code), f_lasti) -> (code, line): line_of's cache (the code kept: its id stays its)
_LINES_MAX = 4096


def line_of(f) -> int:
    """``f.f_lineno``, looked up by the frame's instruction. CPython finds a frame's line by walking its
    code's line table from the start, so a read costs what the code before the instruction is long:
    ~40 ns in a small function, **~40 µs at line 2,000 of a script's module level** (a training loop
    at the end of a long script, or a ``trainer.train()`` deep in a long ``main()``: the user's frame a
    call-site key is built from, on every outermost forward). ``f_lasti`` is a field read; a call site
    is one instruction, so its line is read once."""
    code = f.f_code
    key = (id(code), f.f_lasti)
    got = _LINES.get(key)
    if got is not None and got[0] is code:
        return got[1]
    line = f.f_lineno
    if len(_LINES) >= _LINES_MAX:
        _LINES.clear()
    _LINES[key] = (code, line)
    return line


def frame_location(f) -> dict | None:
    if f is None:
        return None
    return {"file": f.f_code.co_filename, "line": line_of(f), "function": f.f_code.co_name}


def is_oom(exc: BaseException) -> bool:
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except Exception:
        pass
    msg = str(exc).lower()
    # the CPU allocator's words: "not enough memory" (Windows' wording in torch) or "can't allocate
    # memory" (Linux: ENOMEM from posix_memalign)
    return isinstance(exc, (RuntimeError, MemoryError)) and (
        "out of memory" in msg or isinstance(exc, MemoryError)
        or ("defaultcpuallocator" in msg and "memory" in msg))


def _is_diag_file(fn: str) -> bool:
    return fn.startswith(_DIAG_DIR + os.sep) and not fn.startswith(_DEMO_DIR)


def _kept(files: list[str], script: str | None) -> list[int]:
    """Which frames of a traceback (their files, outermost first) a bare run shows: not diag's, which
    a call passed through: the probe's launcher above the script's first frame, the probe's wrappers
    in the middle (its DataLoader iterator, ``backward``, ``zero_grad``, optimizer wrappers). Where
    the exception was raised in diag itself, diag's frames after the last frame of other code stay
    (that traceback is diag's bug report). ``script`` is user code wherever it lives."""
    def diags(fn: str) -> bool:
        return _is_diag_file(fn) and fn != script

    last_other = max((i for i, fn in enumerate(files) if not diags(fn)), default=-1)
    return [i for i, fn in enumerate(files) if i > last_other or not diags(fn)]


def _users_frames(frames: list, script: str | None) -> list:
    return [frames[i] for i in _kept([fr.filename for fr in frames], script)]


def _chain(exc):
    """``exc`` and the exceptions chained to it (cause, context, a group's members), each once; the
    same for a ``traceback.TracebackException``."""
    todo, seen = [exc], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend((e.__cause__, e.__context__))
        todo.extend(getattr(e, "exceptions", None) or ())


def as_bare(exc: BaseException, script: str | None) -> None:
    """Give ``exc`` and its chained exceptions the tracebacks a bare run would have given them (diag's
    frames out, :func:`_kept`), for the script's own ``sys.excepthook`` (rich's, pretty_errors') to
    show; the exception is not the script's to use any more (it ended the script)."""
    for e in _chain(exc):
        entries = []
        t = e.__traceback__
        while t is not None:
            entries.append(t)
            t = t.tb_next
        keep = _kept([t.tb_frame.f_code.co_filename for t in entries], script)
        if len(keep) == len(entries):
            continue
        tb = None
        for i in reversed(keep):
            t = entries[i]
            tb = types.TracebackType(tb, t.tb_frame, t.tb_lasti, t.tb_lineno)
        e.__traceback__ = tb


def user_traceback(exc: BaseException, script: str | None) -> str:
    """``exc``'s traceback as Python prints it in a bare run: its chained exceptions (``raise ... from``,
    an exception raised while handling another, exception groups) included, diag's frames left out
    (:func:`_users_frames`)."""
    te = traceback.TracebackException(type(exc), exc, exc.__traceback__)
    for t in _chain(te):    # (a TracebackException links its chain by the same names)
        t.stack = traceback.StackSummary.from_list(_users_frames(list(t.stack), script))
    return "".join(te.format())


def exception_info(exc: BaseException, step: int | None, script: str | None) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)
    try:
        text = user_traceback(exc, script)
    except Exception:      # (never lose the user's error to a failure of the formatting)
        text = "Traceback (most recent call last):\n" + "".join(traceback.format_list(frames)) + \
            "".join(traceback.format_exception_only(type(exc), exc))
    loc = None
    for fr in reversed(frames):
        if not is_library_file(fr.filename) or (script and fr.filename == script):
            loc = {"file": fr.filename, "line": fr.lineno, "function": fr.name}
            break
    if isinstance(exc, SyntaxError):
        # a syntax error in one of the user's own files (an import, exec of a file) is located there;
        # one in a string handed to ast.parse/compile stays at the user's line that parsed it
        fn = getattr(exc, "filename", None)
        if fn and os.path.isfile(fn) and not is_library_file(os.path.abspath(fn)) and exc.lineno:
            loc = {"file": os.path.abspath(fn), "line": int(exc.lineno), "function": None}
    return {
        "type": type(exc).__name__, "message": strip_ansi(str(exc))[:4000], "traceback": strip_ansi(text)[-20000:],
        "is_oom": is_oom(exc), "step": step, "location": loc,
    }


# the name the extensions and the replay used before this module existed
_is_library_file = is_library_file
