"""Nothing of diag in the user's objects (issue 26): what the probe puts on a user's object, and how it
stays out of everything that copies, saves, compiles or traces that object.

The probe attaches two kinds of things to objects the script owns, and nothing else:

* **module-local forward hooks** on each outermost model (the hook hand-over, :mod:`diag.probe.handover`:
  the cheap route of a forward to the probe). They are :class:`ProbeHook` objects in the module's own
  hook dictionaries (``_forward_pre_hooks``, ``_forward_hooks`` and the id sets torch keeps beside them).
* **attributes set on one object** (``Patches.patch_instance``: DDP's ``_sync_buffers``, timed; and
  the lane's call, ``_compiled_call_impl`` on the lane's model while the lane is on, its two hooks
  taken out meanwhile: :meth:`diag.probe.handover.HandOver.take_call`).

One rule keeps both out of the user's way: *whatever reads a module's state, or turns the module into
something else, sees it as it would be without diag.* Two doors implement it:

1. **Reduction** — ``torch.nn.Module.__reduce_ex__`` (installed by the probe, undone at its end): the
   state a module hands to ``pickle``, ``torch.save`` (whole model), ``copy.deepcopy`` and ``copy.copy``
   is the module's own state with diag's hook entries and marked attributes left out. It wraps
   ``object.__reduce_ex__``, so a class's own ``__getstate__``/``__reduce__`` (LightningModule's, DDP's)
   still runs; only a class that defines ``__reduce_ex__`` itself escapes it. A checkpoint written under
   diag names no ``diag`` global and loads with ``weights_only=True`` where the bare one does; a deep
   copy (an EMA model) has the hooks the bare copy has: none of diag's.
2. **Lifting** — while the script calls something that compiles or traces a module
   (``torch.jit.script``, ``torch.jit.trace``/``trace_module``, ``torch.export.export`` — which
   ``torch.onnx.export`` uses —, and ``torch.fx.Tracer.trace``, which ``symbolic_trace`` and
   transformers' tracer use), diag's hooks are taken out of every hooked module (and its global hooks
   out of torch, during a discovery window) and put back afterwards at the same place in each
   dictionary. TorchScript then compiles no hook of diag's, and a trace runs no probe code on proxies.

Why not hooks kept outside the module? torch's fast path for a module call (``Module._call_impl``)
looks at the module's own dictionaries and at the *global* hooks; a global hook costs every module call
of the run its slow path (4-5 µs a call, docs/performance.md). The per-step cost of the probe rests on
module-local hooks on a handful of outermost modules, so they stay, and are made invisible instead.
"""
from __future__ import annotations

import contextlib
import functools
import weakref
from collections import OrderedDict

# the dictionaries in which torch keeps a module's forward hooks (hook id -> hook, or id -> True)
HOOK_DICTS = ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks",
              "_forward_hooks_with_kwargs", "_forward_hooks_always_called")
_CALLABLE_DICTS = ("_forward_pre_hooks", "_forward_hooks")

# entry points that compile or trace a module: (module path, owner attribute path, attribute name)
LIFT_AROUND = (
    ("torch.jit", "torch.jit", "script"),
    ("torch.jit", "torch.jit", "trace"),
    ("torch.jit", "torch.jit", "trace_module"),
    ("torch.export", "torch.export", "export"),
    ("torch.fx", "torch.fx.Tracer", "trace"),
)


class ProbeHook(functools.partial):
    """A module-local hook of diag's: a ``functools.partial`` of the hook function (calling it is a C
    call, not one more Python frame per forward: issue 20). Its type is how the reduction and the
    lifting recognise diag's entries. ``copy.deepcopy`` of it alone returns itself (never a copy of the
    probe); a module's reduction leaves it out, so that path is never taken for a module's hooks."""

    __slots__ = ()
    __name__ = "diag_probe_hook"       # for code that names hooks (TorchScript's stubs, loggers)
    __qualname__ = "diag_probe_hook"

    @property
    def fn(self):
        return self.func

    def __deepcopy__(self, memo):
        return self

    def __copy__(self):
        return self

    def __reduce__(self):
        # reached only outside a module's reduction (a hook pickled on its own): never name diag
        raise TypeError("diag's probe hook is not picklable on its own")


# ---- attributes set on one object -------------------------------------------------------------------
CALL_MARK = "_compiled_call_impl"   # the lane's call on a module (diag.probe.handover.HandOver.take_call)
_attrs: dict[int, tuple] = {}       # id(obj) -> (weakref or None, set of names)


def mark_attribute(obj, name: str) -> None:
    """``name`` was set on ``obj`` by diag: its reduction leaves it out."""
    key = id(obj)
    entry = _attrs.get(key)
    if entry is None or (entry[0] is not None and entry[0]() is not obj):
        try:
            ref = weakref.ref(obj, lambda _r, k=key: _attrs.pop(k, None))
        except TypeError:
            ref = None
        entry = _attrs[key] = (ref, set())
    entry[1].add(name)


def unmark_attribute(obj, name: str) -> None:
    entry = _attrs.get(id(obj))
    if entry is not None:
        entry[1].discard(name)
        if not entry[1]:
            _attrs.pop(id(obj), None)


def marked_attributes(obj) -> set:
    entry = _attrs.get(id(obj))
    if entry is None or (entry[0] is not None and entry[0]() is not obj):
        return set()
    return entry[1]


# ---- hooks --------------------------------------------------------------------------------------------
def probe_hook_ids(d: dict) -> set:
    """The ids of diag's hooks in a module's state (``__dict__`` or a copy of it)."""
    ids = set()
    for name in _CALLABLE_DICTS:
        hooks = d.get(name)
        if hooks:
            for k, v in hooks.items():
                if type(v) is ProbeHook:
                    ids.add(k)
    return ids


def clean_state(module, state):
    """``state`` (what ``module`` hands to its reduction) without diag's hook entries and marked
    attributes; ``state`` itself when it holds none (the common case costs two dict lookups)."""
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], dict):
        cleaned = clean_state(module, state[0])          # (dict, slots) state
        return state if cleaned is state[0] else (cleaned, state[1])
    if not isinstance(state, dict):
        return state
    ids = probe_hook_ids(state)
    names = marked_attributes(module)
    if not ids and not names:
        return state
    out = {k: v for k, v in state.items() if k not in names}
    if ids:
        for name in HOOK_DICTS:
            hooks = out.get(name)
            if hooks and any(k in ids for k in hooks):
                out[name] = OrderedDict((k, v) for k, v in hooks.items() if k not in ids)
    if CALL_MARK in names:
        # the probe's lane calls this module itself, its hooks taken out of these dictionaries for the
        # while (diag.probe.handover.HandOver.take_call): a copy gets dictionaries of its own, as it does
        # when the hooks are in (above); a shallow copy (copy.copy) would share them, and the probe's hooks
        # on the copy (HandOver.restored) would land in the original's
        for name in HOOK_DICTS:
            hooks = out.get(name)
            if hooks is not None and hooks is state.get(name):
                out[name] = OrderedDict(hooks)
    return out


_object_reduce_ex = object.__reduce_ex__


def module_reduce_ex(self, protocol):
    """``torch.nn.Module.__reduce_ex__`` while the probe runs: ``object``'s, with the state cleaned."""
    rv = _object_reduce_ex(self, protocol)
    if isinstance(rv, tuple) and len(rv) >= 3 and rv[2] is not None:
        state = clean_state(self, rv[2])
        if state is not rv[2]:
            rv = rv[:2] + (state,) + rv[3:]
    return rv


class Lifted:
    """Take diag's hooks out of the modules (and torch's global hooks out) for the length of a call,
    and put them back in place. Nested calls lift once. ``sources`` are callables that return the
    objects to lift (the hand-over's hooked modules and its global hook handles)."""

    def __init__(self) -> None:
        self.depth = 0
        self._saved: list = []
        self._lifters: list = []      # objects with lift() -> token and restore(token)

    def register(self, lifter) -> None:
        self._lifters.append(lifter)

    @contextlib.contextmanager
    def __call__(self):
        self.depth += 1
        if self.depth == 1:
            saved = []
            for lifter in self._lifters:
                try:
                    saved.append((lifter, lifter.lift()))
                except Exception:
                    pass
            self._saved = saved
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                saved, self._saved = self._saved, []
                for lifter, token in reversed(saved):
                    try:
                        lifter.restore(token)
                    except Exception:
                        pass


def lift_module_hooks(modules) -> list:
    """Remove diag's entries from each module's hook dictionaries; returns what :func:`put_back` needs
    to restore them at their place."""
    token = []
    for m in modules:
        d = getattr(m, "__dict__", None)
        if not d:
            continue
        ids = probe_hook_ids(d)
        if not ids:
            continue
        snaps = []
        for name in HOOK_DICTS:
            hooks = d.get(name)
            if hooks and any(k in ids for k in hooks):
                snaps.append((hooks, list(hooks.items())))
                for k in ids:
                    hooks.pop(k, None)
        token.append((weakref.ref(m), ids, snaps))
    return token


def put_back(token) -> None:
    for ref, ids, snaps in token:
        if ref() is None:
            continue
        for hooks, items in snaps:
            others = [k for k, _ in items if k not in ids]
            if list(hooks.keys()) == others:      # untouched during the call: the exact order again
                hooks.clear()
                hooks.update(items)
            else:                                 # the call changed them: ours go at the end
                for k, v in items:
                    if k in ids:
                        hooks[k] = v


# torch's dictionaries of global module hooks (a with_kwargs / always_call hook has an entry in the last two)
GLOBAL_HOOK_DICTS = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_forward_hooks_with_kwargs",
                     "_global_forward_hooks_always_called")


def lift_global_hooks(handles) -> tuple:
    """Take the global module hooks of ``handles`` (torch's handles of diag's global hooks) out of
    torch's dictionaries; :func:`put_back_global` restores them under the same ids, in place, and the
    handles stay valid. Not removed and registered again: torch.compile guards on those entries by id
    (``_global_forward_hooks[127]``), and its backend traces with torch.fx (a :class:`Lifted` call)
    between tracing the frame and building the guards: a hook registered again under a new id made the
    guards fail (``InternalTorchDynamoError: KeyError``, a model compiled before diag's discovery window
    closed, with the default backend)."""
    from torch.nn.modules import module as nn_module

    ids = frozenset(getattr(h, "id", None) for h in handles)
    snaps = []
    for name in GLOBAL_HOOK_DICTS:
        hooks = getattr(nn_module, name, None)
        if isinstance(hooks, dict) and any(k in ids for k in hooks):
            snaps.append((hooks, list(hooks.items())))
            for k in ids:
                hooks.pop(k, None)
    return ids, snaps


def put_back_global(token) -> None:
    """Restore what :func:`lift_global_hooks` took out."""
    ids, snaps = token
    put_back([(lambda: True, ids, snaps)])


class GlobalHooks:
    """A pair of torch's global forward hooks (pre, and post with kwargs, always called) that a
    :class:`Lifted` call takes out of torch and puts back (the probe without the hand-over)."""

    def __init__(self, pre, post) -> None:
        self.pre, self.post = pre, post
        self.handles: list = []

    def add(self) -> "GlobalHooks":
        from torch.nn.modules import module as nn_module

        self.handles.append(nn_module.register_module_forward_pre_hook(self.pre))
        self.handles.append(nn_module.register_module_forward_hook(self.post, with_kwargs=True,
                                                                   always_call=True))
        return self

    def remove(self) -> None:
        for h in self.handles:
            remove_global_hook(h)
        self.handles.clear()

    def lift(self):
        handles = list(self.handles)
        return handles, (lift_global_hooks(handles) if handles else None)

    def restore(self, lifted) -> None:
        handles, token = lifted
        if token is not None and self.handles == handles:     # (still these hooks: put back, same ids)
            put_back_global(token)


def install(patches, lifted: Lifted, on_restored=None) -> None:
    """Install both doors (undone with the probe's other patches). ``on_restored(module)`` is called
    after a module's state is set from a copy or a pickle (``copy.deepcopy``, ``pickle.load``,
    ``torch.load`` of a whole model): such a module carries no hook of diag's, so the probe looks for
    it again (a discovery window) instead."""
    import importlib

    import torch

    patches.patch(torch.nn.Module, "__reduce_ex__", module_reduce_ex)
    if on_restored is not None:
        orig_setstate = torch.nn.Module.__dict__.get("__setstate__")
        if callable(orig_setstate):
            @functools.wraps(orig_setstate)
            def __setstate__(self, state, _orig=orig_setstate):
                _orig(self, state)
                try:
                    on_restored(self)
                except Exception:
                    pass

            patches.patch(torch.nn.Module, "__setstate__", __setstate__)
    for modname, owner_path, attr in LIFT_AROUND:
        try:
            importlib.import_module(modname)
            owner = importlib.import_module(owner_path) if owner_path == modname else None
            if owner is None:
                mod_path, _, cls = owner_path.rpartition(".")
                owner = getattr(importlib.import_module(mod_path), cls)
            orig = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr, None)
        except Exception:
            continue
        if orig is None or not callable(orig):
            continue
        patches.patch(owner, attr, _lifting(orig, lifted))


def _lifting(orig, lifted: Lifted):
    @functools.wraps(orig)
    def call(*args, **kwargs):
        if not lifted._lifters:
            return orig(*args, **kwargs)
        with lifted():
            return orig(*args, **kwargs)

    return call


def remove_global_hook(handle) -> None:
    """Remove a global module hook completely. torch's handle for
    ``register_module_forward_hook(with_kwargs=True)`` leaves its id in
    ``_global_forward_hooks_with_kwargs``; ``_has_any_global_hook()`` reads that dict, so every call of
    a ``torch.compile``'d module would warn about "global hooks" for the rest of the process."""
    from torch.nn.modules import module as nn_module

    try:
        handle.remove()
    except Exception:
        pass
    getattr(nn_module, "_global_forward_hooks_with_kwargs", {}).pop(getattr(handle, "id", None), None)
