"""A quiet probe: warnings that diag's own hooks cause never reach the user's output, and warnings
that the user's calls raise through one of diag's wrappers keep the user's location.

- torch.compile warns on every call of a compiled module while any *global* module hook is
  registered (``torch/_dynamo/eval_frame.py``): diag's hooks are global, the user's are not, so that
  one message is filtered for the probe's lifetime (:func:`silence_hook_warnings`, undone by the
  returned function).
- A wrapper that diag puts around a torch call (GradScaler's ``__init__``, anomaly detection, ...)
  adds a frame under torch's ``stacklevel``: the warning would name diag's file.
  :func:`relocated_warnings` records what the wrapped call warns and issues it again at the first
  frame of the user's code, through the warnings machinery (the user's filters still apply).
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import warnings

from diag.probe.frames import _DIAG_DIR, is_library_file

# torch._dynamo.eval_frame.OptimizedModule.__call__: "Using `torch.compile(module)` when there are
# global hooks on modules (e.g., from `register_module_forward_hook`); ..."
_COMPILE_HOOKS = r"Using `torch\.compile\(module\)` when there are global hooks"


def add_filter(action: str, message: str, category=Warning):
    """Put a warnings filter first, *without* telling the warnings machinery that its filters changed;
    returns the entry for :func:`remove_filter`.

    ``warnings.filterwarnings`` bumps the filters' version, which empties every module's
    ``__warningregistry__``: each warning the script had already shown once (the default action) is
    shown again the next time it is raised. Adding and removing a filter in the middle of a run made a
    Lightning run print a FutureWarning twice under diag (the do-no-harm harness). An ``ignore`` or
    ``always`` entry needs no bump: neither action writes to a registry, and the filter list is read
    on every warning."""
    entry = (action, re.compile(message, re.I), category, None, 0)
    warnings.filters.insert(0, entry)
    return entry


def remove_filter(entry) -> None:
    with contextlib.suppress(Exception):
        warnings.filters.remove(entry)


def silence_hook_warnings():
    """Filter torch.compile's global-hook warning (diag's global hooks, in a discovery window, are
    the only global ones the probe adds); returns the function that removes the filter."""
    entry = add_filter("ignore", _COMPILE_HOOKS, UserWarning)
    return lambda: remove_filter(entry)


def _user_frame():
    f = sys._getframe(2)
    while f is not None:
        fn = f.f_code.co_filename
        if not (is_library_file(fn) or fn.endswith(os.sep + "warnings.py")):
            return f
        f = f.f_back
    return None


def _module_of(filename) -> tuple:
    """The dotted name and warnings registry of the loaded module whose file is ``filename`` (what the
    warnings machinery uses for a warning raised there); ``(None, None)`` when no loaded module has it
    (``warn_explicit`` then derives the name from the file, as it does)."""
    for name, mod in list(sys.modules.items()):
        if getattr(mod, "__file__", None) == filename:
            g = getattr(mod, "__dict__", None)
            return name, (g.setdefault("__warningregistry__", {}) if isinstance(g, dict) else None)
    return None, None


@contextlib.contextmanager
def relocated_warnings():
    """Run the body recording its warnings; re-issue each one, those that name a file of diag at
    the user's calling line instead."""
    # warnings.catch_warnings would bump the filters' version on the way out (every module's registry
    # emptied: Lightning's set_detect_anomaly at each fit() made a warning the script had shown once
    # show again); the same recording, without that: an `always` entry (add_filter) and a recorder
    caught: list = []
    entry = add_filter("always", "")
    saved = (warnings.showwarning, warnings._showwarnmsg_impl)      # type: ignore[attr-defined]
    warnings.showwarning = warnings._showwarning_orig               # type: ignore[attr-defined]
    warnings._showwarnmsg_impl = caught.append                      # type: ignore[attr-defined]
    try:
        yield
    finally:
        warnings.showwarning, warnings._showwarnmsg_impl = saved    # type: ignore[attr-defined]
        remove_filter(entry)
        pending = list(caught)
    if not pending:
        return
    user = _user_frame()
    for w in pending:
        filename, lineno = w.filename, w.lineno
        ours = str(filename).startswith(_DIAG_DIR + os.sep)
        if user is not None and (ours or filename == user.f_code.co_filename):
            if ours:
                filename, lineno = user.f_code.co_filename, user.f_lineno
            module = user.f_globals.get("__name__")
            registry = user.f_globals.setdefault("__warningregistry__", {})
        else:
            # a warning that names a library's own line (torch's, at stacklevel 1) is the module's, not the
            # user's: the user's module name made the default filter for __main__ show what Python hides
            # (torch.compile printed torch.jit's DeprecationWarning under diag, not bare)
            module, registry = _module_of(filename)
        with contextlib.suppress(Exception):
            warnings.warn_explicit(w.message, w.category, filename, lineno, module=module,
                                   registry=registry, source=getattr(w, "source", None))
