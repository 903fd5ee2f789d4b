"""Installing and undoing what the probe adds to torch: hook handles and attribute patches.

Every hook the probe (or an extension) registers and every attribute it patches is undone on
uninstall, even when undoing one of them fails (the rest are still undone, nothing raises into the
user's code). Two helpers do it for everyone:

``remove_hooks(handles)``  removes each ``RemovableHandle`` in the list, then empties it.
``Patches``               records ``owner.name`` before replacing it (``patches.patch(owner, name,
                          new)``; ``patches.patch_instance(obj, name, new)`` for an attribute set on one
                          object, held weakly) and restores them all, newest first (``patches.undo()``).
"""
from __future__ import annotations

import os
import weakref
from typing import Any


def _never() -> bool:
    return False


def hot_first(obj: Any, names: tuple) -> None:
    """Put ``names`` first in ``obj``'s attribute dict, in that order (values and everything else as they
    were: the same dict object, its items re-inserted). An object with more than 30 attributes (the
    probe, the hand-over: CPython 3.11 shares keys between instances up to 30) keeps them in a table of
    its own, one 16-byte entry each in the order first set, and a step's attribute reads go to their
    entries by index: the few dozen a lane step reads, set first, share a few cache lines instead of
    being spread over the whole table (a deep step's work evicts them between one hook and the next).
    ``diag.probe.lane.Lane`` does the same with the order of its ``__slots__``."""
    d = obj.__dict__
    hot = {k: d[k] for k in names if k in d}
    rest = [(k, v) for k, v in d.items() if k not in hot]
    d.clear()
    d.update(hot)
    d.update(rest)


def env_on(name: str) -> bool:
    """A probe switch that is on unless the environment says ``0``, ``false``, ``no`` or ``off``."""
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def compiling_check():
    """``torch.compiler.is_dynamo_compiling`` (``is_compiling`` on an older torch, a function that is
    always False without torch): 0.1 µs a call, ``is_compiling()`` takes twice that.

    The probe's hooks and wrappers call it first: under ``torch.compile``'s tracing it is a constant
    True, so dynamo neither traces diag's bookkeeping (``time.perf_counter`` and the probe's objects
    are graph breaks: a compiled train step, a compiled optimizer step and a compiled evaluation went
    from 3 graphs to 23 under the probe, and dynamo printed its warnings into the user's output) nor
    guards on the probe's counters (a recompile each time one changes). The hooks that mark a step
    (a model's outermost forward, an optimizer step, a backward) then call their :func:`run_eagerly`
    twin: one graph break at the call, the hook run as plain Python every time the compiled code
    runs."""
    try:
        import torch

        return getattr(torch.compiler, "is_dynamo_compiling", None) or torch.compiler.is_compiling
    except Exception:
        return _never


def run_eagerly(fn):
    """``fn`` behind ``torch._dynamo.disable``: called from code torch.compile traces, it is a graph
    break and runs as plain Python each time (None where that is unavailable). Imports torch._dynamo
    (about a second): call it once torch.compile is in use."""
    try:
        import torch._dynamo

        return torch._dynamo.disable(fn, recursive=True)
    except Exception:
        return None


def remove_hooks(handles: list) -> None:
    """Remove every hook handle in ``handles`` (one that fails to remove is skipped) and empty the
    list, so a second call does nothing."""
    for h in handles:
        try:
            h.remove()
        except Exception:
            pass
    handles.clear()


_ABSENT = object()


def restore_attribute(owner: Any, name: str, orig: Any) -> None:
    """Put ``owner.name`` back as it was before a patch: ``orig``, or deleted when it was inherited or
    absent (``orig`` is ``_ABSENT`` or None) so that the inherited one shows through again."""
    if orig is _ABSENT or orig is None:
        try:
            delattr(owner, name)
        except AttributeError:
            pass
    else:
        setattr(owner, name, orig)


class Patches:
    """Attribute patches, undone newest first. A class attribute that was inherited (not in the
    owner's own ``__dict__``) is deleted on undo, so the inherited one shows through again."""

    __slots__ = ("_items",)

    def __init__(self) -> None:
        self._items: list[tuple[Any, str, Any, bool]] = []   # (owner or weakref, name, original, instance?)

    def patch(self, owner: Any, name: str, new: Any) -> Any:
        """Replace ``owner.name`` with ``new``; returns the attribute it replaces (None when it was
        inherited or absent)."""
        orig = owner.__dict__.get(name, _ABSENT) if hasattr(owner, "__dict__") else getattr(owner, name, _ABSENT)
        self._items.append((owner, name, orig, False))
        setattr(owner, name, new)
        return None if orig is _ABSENT else orig

    def patch_instance(self, obj: Any, name: str, new: Any) -> None:
        """Set ``name`` on one object (bypassing its ``__setattr__``); undo deletes it again. The
        object is held weakly: one that is gone by then needs no undoing."""
        from diag.probe.marks import mark_attribute

        object.__setattr__(obj, name, new)
        self._items.append((weakref.ref(obj), name, _ABSENT, True))
        mark_attribute(obj, name)       # left out of the object's pickle/deepcopy (diag.probe.marks)

    def undo(self) -> None:
        """Restore every patched attribute, newest first; one that fails is skipped."""
        items, self._items = self._items, []
        for owner, name, orig, instance in reversed(items):
            try:
                if instance:
                    obj = owner()
                    if obj is not None:
                        from diag.probe.marks import unmark_attribute

                        unmark_attribute(obj, name)
                        if name in obj.__dict__:
                            del obj.__dict__[name]
                else:
                    restore_attribute(owner, name, orig)
            except Exception:
                pass

    def __len__(self) -> int:
        return len(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)


class DiagStop(BaseException):
    """Raised inside the user's script to end it at a step or time limit (unwinds like Ctrl-C,
    so the script's ``finally`` blocks and DataLoader shutdown still run)."""

    def __init__(self, reason: str, status: str = "stopped"):
        super().__init__(reason)
        self.reason = reason
        self.status = status


def optimizer_alive() -> bool:
    """Is there an Optimizer object in this process? Looked up once per run, when the first
    backward is followed by new work without an optimizer step."""
    try:
        import gc

        import torch

        opt_cls = torch.optim.Optimizer
        # type(o), not isinstance: isinstance may consult o.__class__, which some deprecated
        # torch objects answer with a FutureWarning in the user's output
        return any(issubclass(type(o), opt_cls) for o in gc.get_objects())
    except Exception:
        return False


class OptimizerCensus:
    """The ``torch.optim.Optimizer`` objects alive in this process, counted as they are made: the
    step machine asks how many there are each time it meets a new one (an optimizer-step group is
    complete when every live optimizer stepped), and whether any is alive (manual mode).

    Before issue 28 each question was a scan of the garbage collector's objects
    (:func:`live_optimizers`): 60-90 ms on a small script, seconds on a job with millions of Python
    objects, on the step's thread inside the second step, where it read as the script's own time
    before the forward (a false ``dataloader.main-thread-data`` error on short runs). The census wraps
    ``Optimizer.__init__`` and ``Optimizer.__setstate__`` (unpickling and ``copy`` call it) and keeps
    each optimizer in a ``WeakSet``: it holds none alive and puts nothing on it; undone, both methods
    are torch's again. (``Optimizer.__new__`` would see every instance, but CPython cannot take a
    ``__new__`` set on a class back: after ``del`` the class's constructor refuses arguments.)

    Not counted, unlike the scan: an object of a subclass that never calls ``Optimizer.__init__``, such
    as accelerate's ``AcceleratedOptimizer`` (a wrapper whose ``step`` calls its inner optimizer's: it
    fires no optimizer hook of its own, so with the scan a step ended at the next batch instead of at
    the inner optimizer's step). Optimizers made before the probe installed (``diag.watch()`` in a
    running script) are found by one scan at install."""

    def __init__(self) -> None:
        self._live: weakref.WeakSet = weakref.WeakSet()
        self.ok = False

    def install(self, patches: "Patches", scan: bool = False) -> None:
        import functools

        import torch

        cls = torch.optim.Optimizer
        live = self._live
        census = self

        def seen(obj) -> None:
            try:
                live.add(obj)
            except TypeError:   # a subclass with __slots__ and no __weakref__: the scan answers from then on
                census.ok = False

        init, setstate = cls.__init__, cls.__setstate__

        @functools.wraps(init)
        def __init__(self, *args, **kwargs):
            init(self, *args, **kwargs)
            seen(self)

        @functools.wraps(setstate)
        def __setstate__(self, state):
            setstate(self, state)
            seen(self)

        patches.patch(cls, "__init__", __init__)
        patches.patch(cls, "__setstate__", __setstate__)
        self.ok = True
        if scan:
            import gc

            for o in gc.get_objects():
                if issubclass(type(o), cls):
                    seen(o)

    def count(self) -> int:
        return len(self._live) if self.ok else live_optimizers()

    def any(self) -> bool:
        return len(self._live) > 0 if self.ok else optimizer_alive()


def live_optimizers() -> int:
    """How many Optimizer objects are alive in this process (a gc scan: once per newly seen optimizer)."""
    try:
        import gc

        import torch

        cls = torch.optim.Optimizer
        return sum(1 for o in gc.get_objects() if issubclass(type(o), cls))
    except Exception:
        return 0


_STEP_WRAPPER: list = []    # [the code object of torch's hooked optimizer step() wrapper, or None]


def _step_wrapper_code() -> Any:
    if not _STEP_WRAPPER:
        code = None
        try:
            from torch.optim.optimizer import Optimizer

            code = Optimizer.profile_hook_step(_never).__code__
        except Exception:
            pass
        _STEP_WRAPPER.append(code)
    return _STEP_WRAPPER[0]


def inside_step(opt: Any) -> bool:
    """Is ``opt``'s ``step()`` already running further out on this thread's stack? torch wraps each
    optimizer class's own ``step`` to call the step hooks (``Optimizer.profile_hook_step``, at the
    class's first instance), so a subclass whose ``step()`` calls ``super().step()`` fires them twice
    per step once its parent class has had an instance of its own. Called by a step pre-hook (from the
    innermost wrapper) only when the same optimizer's pre-hook already ran without its post-hook: two
    of torch's wrapper frames with ``opt`` as their ``self`` mean a nested call; one means the earlier
    step raised before its post-hook. Where the wrapper is not found (another torch), a pending
    pre-hook is taken as nested."""
    import sys

    code = _step_wrapper_code()
    if code is None:
        return True
    f = sys._getframe(1)
    seen = 0
    while f is not None:
        if f.f_code is code:
            try:
                own = f.f_locals.get("self")
            except Exception:
                own = None
            if own is opt:
                seen += 1
                if seen >= 2:
                    return True
        f = f.f_back
    return False
