"""The hook hand-over (issue 20): the probe pays per step, not per module call.

Any *global* forward hook takes every module call off the hook-free fast path of
``Module._call_impl`` (~4-5 µs per call: docs/performance.md). The probe only needs the *outermost*
forward of each model, so:

* **discovery window**: global pre/post hooks route every module call to the probe's ``fwd_pre`` /
  ``fwd_post`` (the probe's outermost-forward rules, unchanged). Each outermost module the probe
  sees is noted (:meth:`HandOver.note`).
* **handed over**: at a boundary (a step closed after at least one outermost forward in the window,
  or ``WINDOW_FORWARDS`` outermost forwards without a step) the global hooks are removed and the
  noted modules get module-local hooks that call the same ``fwd_pre`` / ``fwd_post``. Inner
  modules then run on torch's fast path.
* **modules built after install** are hooked as they are built (torch's global *registration* hooks
  fire only while a module is built, never on a call); a module registered as another module's child
  is unhooked again unless it was seen called as an outermost module. A compiled module's inner
  module is never hooked (its hooks would run inside the compiled region); the OptimizedModule is.
* **signals that reopen a window** (none per module call): a new optimizer; a DataLoader iteration
  starting; ``train()``/``eval()`` that changes a module's mode; an optimizer step no known forward
  fed; a parameterless outermost module that used to call a model and no longer calls a known one;
  periodic windows (steps 16, 32, 64, ... 1024, then every 1024). A reason whose windows find nothing
  new backs off (2, 4, 8, ... steps).

``DIAG_PROBE_HANDOVER=0`` keeps the global hooks on for the whole run (the old behaviour).
"""
from __future__ import annotations

import os
import sys
import time
import warnings
import weakref

from diag.probe.hooks import _never, compiling_check, env_on, hot_first, run_eagerly
from diag.probe.marks import (  # noqa: F401
    CALL_MARK,
    ProbeHook,
    lift_global_hooks,
    lift_module_hooks,
    mark_attribute,
    put_back,
    put_back_global,
    remove_global_hook,
    unmark_attribute,
)
from diag.probe.quiet import add_filter, remove_filter
from diag.probe.tensors import TorchState, output_grad_tensors, samples_of

_pc = time.perf_counter

_COMPILE_WARNING = r"Using `torch.compile\(module\)` when there are global hooks"

_compiling = _never           # torch.compiler.is_dynamo_compiling once installed (hooks.compiling_check)

WINDOW_FORWARDS = 16          # a window with no step closes after this many outermost forwards
PERIODIC_FIRST = 16           # periodic windows at steps 16, 32, 64, ... then every PERIODIC_CAP
PERIODIC_CAP = 1024


_CALL: tuple | None = None    # (torch.nn.Module.__call__, torch's module of hooks) where the lane's call works


def _bind_call() -> None:
    """The lane's call needs ``Module.__call__`` to be torch's ``_wrapped_call_impl``, which calls an
    instance's ``_compiled_call_impl`` when one is set (torch >= 2.1)."""
    global _CALL
    try:
        import torch
        from torch.nn.modules import module as nn_module

        m = torch.nn.Module
        if (m.__dict__.get("_compiled_call_impl", 0) is None and m.__call__ is m.__dict__.get("_wrapped_call_impl")
                and "_compiled_call_impl" in getattr(m, "__getstate__").__code__.co_consts):
            _CALL = (m.__call__, nn_module)
    except Exception:
        _CALL = None


def _lane_call(ho, probe, lane, ref):
    """The lane's model's call while the lane is on (:meth:`HandOver.take_call`): what torch's hooked path
    and the probe's two hooks do for one forward, the lane's case first, torch's fast path for the rest.
    Anything that is not the lane's forward calls the hooks' own functions, in the order and with the
    arguments torch calls them (an always-called post hook on a forward that raised included)."""
    local_pre, local_post, lane_begin, lane_end = ho._local_pre, ho._local_post, ho._lane_begin, ho._lane_end

    def diag_lane_call(*args, **kwargs):
        module = ref()
        ph = lane.phase
        if ((ph == 1 or ph == 8 or (ph == 3 and (lane.rest or lane.queue))) and lane.on and not probe.depth
                and not probe.in_backward and ho.active and not _compiling()):
            lane_begin(probe, lane, module)      # (HandOver._local_pre's lane case)
            taken = True
        else:
            taken = False
        try:
            if not taken:
                local_pre(module, args)
            if ho._call is not None:
                output = module._call_impl(*args, **kwargs)
            else:
                # the probe's hooks came back on the model since this call began (HandOver.give_call: the
                # lane turned off): torch's call without them (this call runs them)
                token = lift_module_hooks([module])
                try:
                    output = module._call_impl(*args, **kwargs)
                finally:
                    put_back(token)
        except Exception:
            try:
                local_post(module, args, kwargs, None)
            except Exception as e:
                warnings.warn("module forward hook with ``always_call=True`` raised an exception that was "
                              f"silenced as another error was raised in forward: {e}", stacklevel=2)
            raise
        if (taken and lane.phase == 1 and probe.depth == 1 and probe._top_module is module and output is not None
                and lane_end(probe, lane, module, args, kwargs, output, 3)):
            # HandOver._local_post's lane case (the model's forward ended), the call site three frames out of
            # HandOver._lane_end (this function's caller is Module._wrapped_call_impl)
            return output
        r = local_post(module, args, kwargs, output)
        return output if r is None else r

    return diag_lane_call


def next_periodic(s: int) -> int:
    """The first step count after ``s`` at which a periodic window opens: PERIODIC_FIRST, then the powers
    of two, then every PERIODIC_CAP steps (a count the lane compares with one int: diag.probe.lane)."""
    if s < PERIODIC_FIRST:
        return PERIODIC_FIRST
    if s < PERIODIC_CAP:
        return 1 << s.bit_length()
    return (s // PERIODIC_CAP + 1) * PERIODIC_CAP


# reasons that never back off: each names a real change in the run
_NO_BACKOFF = ("install", "new optimizer", "a step no known forward fed", "periodic")


def handover_enabled() -> bool:
    return env_on("DIAG_PROBE_HANDOVER")


# diag's module-local hooks: a type of their own, which the probe's reduction and lifting recognise
# (diag.probe.marks: nothing of diag in a pickled, copied, scripted or traced module)
_Hook = ProbeHook


class HandOver:
    """Routes module calls to ``probe.fwd_pre`` / ``probe.fwd_post``: through global hooks while a
    discovery window is open, through module-local hooks on the outermost modules otherwise."""

    def __init__(self, probe):
        self.probe = probe
        self.active = False
        self.discovering = False
        self._global: list = []
        self._other: list = []
        self._pre = _Hook(self._local_pre)
        self._post = _Hook(self._local_post)
        self._eager_pre = self._eager_post = None   # their twins for compiled code (prepare_compiled)
        self._hooked: dict[int, tuple] = {}        # id(module) -> (weakref, pre handle, post handle)
        self._children: "weakref.WeakSet" = weakref.WeakSet()
        self._compiled_inner: "weakref.WeakSet" = weakref.WeakSet()
        self.known: set[int] = set()               # ids of modules seen called as outermost
        self._new: list = []                        # noted since the last hand-over
        self._bare_models: dict[int, bool] = {}     # id(parameterless outermost) -> it called a model
        self._opts: dict[int, int] = {}             # id(optimizer) -> outermost forwards at its last step
        self._in_train = False
        self._orig_train = None
        self._window_forwards = 0
        self._pending: str | None = None
        self._reason = ""
        self._not_before: dict[str, int] = {}
        self._fruitless: dict[str, int] = {}
        self.outermost_forwards = 0
        self.window_calls = 0                       # module calls seen by the global hooks (windows)
        self.local_calls = 0                        # calls of modules carrying the probe's local hooks
        self.step_in_window = False                 # a window was open during the current step
        self.steps = 0
        self.next_periodic = PERIODIC_FIRST        # the step count at which the next periodic window opens
        self.windows: list[tuple[int, str]] = []    # (step, reason) of each window opened
        self.handovers = 0
        self._warn_filter = None
        self._lifted = 0                            # inside a call that compiles or traces a module (marks.Lifted)
        self._call: tuple | None = None             # the lane's call on its model (take_call), while it is there
        self.calls_taken = 0                        # times take_call put the lane's call on a model
        # what a lane step reads, first in this object's dict (diag.probe.hooks.hot_first)
        hot_first(self, ("active", "_call", "steps", "next_periodic", "step_in_window", "discovering", "_pending",
                         "outermost_forwards", "_opts"))

    # ---- install ------------------------------------------------------------------------------------
    def install(self, scan: bool = False) -> "HandOver":
        import torch
        from torch.nn.modules import module as nn_module

        global _compiling
        _compiling = compiling_check()
        _bind_call()

        self.active = True
        self._other.append(nn_module.register_module_module_registration_hook(self._on_child))
        self._other.append(nn_module.register_module_parameter_registration_hook(self._on_param))
        # the optimizer signals come from the probe's own optimizer hooks: _opt_pre below (a new optimizer),
        # and Probe._opt_post (an optimizer stepped twice with no known forward between: inlined there)
        me = self
        orig_train = torch.nn.Module.train

        def train(module, mode: bool = True):
            if _compiling() or me._in_train or not me.active:     # .train() recurses into every child: act once
                return orig_train(module, mode)
            me._in_train = True
            try:
                if module.training != bool(mode):  # model.train() every step changes nothing
                    me.request("train()/eval()")
                return orig_train(module, mode)
            finally:
                me._in_train = False

        self.probe.patch(torch.nn.Module, "train", train)
        if scan:
            self._scan()
        self._open("install")
        return self

    def _scan(self) -> None:
        """Modules built before the probe (``diag.watch()`` in a notebook): hook the roots now."""
        import gc

        import torch

        mod_cls = torch.nn.Module
        # type(o), not isinstance: isinstance may consult o.__class__ (a FutureWarning on some objects)
        mods = [o for o in gc.get_objects() if issubclass(type(o), mod_cls)]
        kids = set()
        for m in mods:
            try:
                for ch in m.children():
                    kids.add(id(ch))
                    self._children.add(ch)
            except Exception:
                pass
        for m in mods:
            if id(m) not in kids and self.probe.module_has_parameters(m):
                self._hook(m)

    def uninstall(self) -> None:
        self.give_call()
        self.active = False
        for h in self._global + self._other:
            remove_global_hook(h)
        self._global.clear()
        self._other.clear()
        for _ref, a, b in list(self._hooked.values()):
            a.remove()
            b.remove()
        self._hooked.clear()
        self._unfilter()

    # ---- the two routes -----------------------------------------------------------------------------
    def _mine(self, module) -> bool:
        hooks = module._forward_pre_hooks
        if hooks:
            pre = self._pre
            for h in hooks.values():
                if h is pre:
                    return True
        return False

    # Each hook asks _compiling() first: a module called inside a torch.compile'd function is traced,
    # hooks included. The global hooks (every module call in a window) trace to nothing; a hooked
    # outermost module's hooks call their eager twins (one graph break each, hooks.compiling_check).
    def prepare_compiled(self) -> None:
        if self._eager_pre is None:
            self._eager_pre = run_eagerly(self._local_pre)
            self._eager_post = run_eagerly(self._local_post)

    def _g_pre(self, module, args):
        if _compiling():
            return None
        self.window_calls += 1
        if self._mine(module):            # its own hook reports it: never twice
            return None
        return self.probe.fwd_pre(module, args)

    def _g_post(self, module, args, kwargs, output=None):
        if _compiling() or self._mine(module):
            return None
        probe = self.probe
        r = probe.fwd_post(module, args, kwargs, output)
        if probe.depth == 0 and not probe.in_backward:
            self._after_outermost()
        return r

    def _local_pre(self, module, args):
        if _compiling():
            f = self._eager_pre
            return f(module, args) if f is not None else None
        if not self.active:          # a deep copy of a hooked module (an EMA) outlives the probe
            return None
        self.local_calls += 1        # priced by the probe's calibration (its estimated part)
        probe = self.probe
        lane = probe._lane
        if (lane.on and (lane.phase == 1 or (lane.phase == 3 and (lane.rest or lane.queue)) or lane.phase == 8)
                and id(module) == lane.mid and not probe.depth and not probe.in_backward):
            # the lane's model forward begins (diag.probe.lane): Probe.fwd_pre's outermost case, one frame
            # and its has-parameters lookup less (the lane's model has them: it was armed on it)
            self._lane_begin(probe, lane, module)
            return None
        if lane.on and lane.phase == 2 and id(module) == lane.bid and not probe.depth and not probe.in_backward:
            # the lane's loss module begins (a parameterless outermost module after the model forward):
            # Probe.fwd_pre's case for one, without its frame and its has-parameters lookup
            probe.depth = 1
            probe._top_module = None
            probe._top_depth = 0
            probe._seek_model = True
            probe._bare_start = _pc()
            probe._bare_had_model = False
            return None
        return probe.fwd_pre(module, args)

    def _local_post(self, module, args, kwargs, output=None):
        # On a forward that raised, torch calls a *global* always_call hook as hook(module, args, None)
        # but a *module-local* with_kwargs one as hook(module, args, kwargs, None): tell the probe the
        # global way (the hook then runs inside _call_impl's `except` block).
        if _compiling():
            f = self._eager_post
            return f(module, args, kwargs, output) if f is not None else None
        if not self.active:
            return None
        probe = self.probe
        lane = probe._lane
        if lane.on and lane.phase == 1 and probe.depth == 1 and probe._top_module is module and output is not None:
            # the lane's model forward ends (diag.probe.lane): its call-site key's parts checked, not rebuilt
            # (Probe._on_top_forward builds the key on the full path), here rather than one frame further in
            # Probe.fwd_post; anything unexpected goes on to fwd_post, which hands the step back
            if self._lane_end(probe, lane, module, args, kwargs, output, lane.site_depth + 1):
                return None
        elif (lane.on and lane.phase == 2 and probe.depth == 1 and id(module) == lane.bid
              and probe._top_module is None and not probe._bare_had_model and type(output) is TorchState.Tensor):
            # the lane's loss module ends: what Probe.fwd_post's lane case and note() do for it, here; a
            # module not known, or one that called a model before, goes on to them
            try:
                if (output.requires_grad and probe.active and not probe._forked and not probe._in_data
                        and not probe.in_backward and TorchState.grad() and lane.bref() is module
                        and self._bare_models.get(id(module)) is False and id(module) in self.known):
                    end = _pc()
                    probe.depth = 0
                    probe._seek_model = False
                    self.outermost_forwards += 1
                    lane.bare_s += end - probe._bare_start
                    if self.discovering or self._pending is not None:
                        self._after_outermost()
                    return None
            except Exception:
                pass
        if output is None and sys.exc_info()[0] is not None:
            r = probe.fwd_post(module, args, None)
        else:
            r = probe.fwd_post(module, args, kwargs, output)
        if probe.depth == 0 and (self.discovering or self._pending is not None) and not probe.in_backward:
            self._after_outermost()
        return r

    @staticmethod
    def _lane_begin(probe, lane, module) -> None:
        """The lane's model forward begins (its pre-hook, or the lane's call, found it expected: after a
        fetch; after a backward with no optimizer step, the next micro-batch of gradient accumulation, on
        a batch the script built or one fetched ahead; in the closure mode, a micro-batch run outside the
        closure): what Probe.fwd_pre's outermost case sets."""
        ph = lane.phase
        if ph == 3:
            lane.push()
            if not lane.rest:
                lane.t_fetch, lane.dt_fetch = lane.queue.pop(0)
        elif ph == 8:
            # the closure mode, a forward before the optimizer's step: a micro-batch run outside the
            # closure (Lightning's gradient accumulation calls the closure itself); the step's last one
            # runs inside it (Probe._opt_pre at phase 1)
            lane.phase = 1
        probe.forward_start = _pc()
        probe.depth = 1
        probe._top_module = module
        probe._top_depth = 1
        probe._seek_model = False
        if probe._ext_live.get("on_forward_start", True):
            probe._on_forward_start(module)

    def _lane_end(self, probe, lane, module, args, kwargs, output, depth: int) -> bool:
        """The lane's model forward ends (its post-hook, or the lane's call; the call site ``depth`` frames
        out of this one): when it is the forward the lane armed on (the same call site, in training mode
        with grad on, its output requiring grad, the same autocast), its clock values and the step's
        samples, as Probe._on_top_forward counts a step's first training forward (the call-site key's
        parts checked, not rebuilt). False: anything else (the full path takes it and hands the step back)."""
        try:
            ts = TorchState
            if not (probe.active and not probe._forked and not probe._in_data and not probe.in_backward
                    and module.training is True and module is lane.mref()):
                return False
            f = sys._getframe(depth)
            if not (f.f_code is lane.code and f.f_lasti == lane.lasti and ts.grad()
                    and (output.requires_grad if type(output) is ts.Tensor else bool(output_grad_tensors(output)))
                    and (ts.autocast_dtype(lane.dev) if ts.any_autocast() and ts.autocast(lane.dev)
                         else None) == lane.acd):
                return False
            end = _pc()
            probe.depth = 0
            probe._top_module = None      # (the forward is over: the probe keeps no reference to the model)
            hint = probe.steps.last_batch_samples
            t = args[0] if args else None
            shape = t.shape if type(t) is ts.Tensor else None
            if shape and t.is_floating_point():
                samples = shape[0]
                if hint is not None and samples != hint and hint in shape:
                    samples = hint
                lane.samples = samples
                lane.tokens = None
            else:
                lane.samples, lane.tokens = samples_of(args, kwargs, hint)
            lane.f_start = probe.forward_start
            lane.f_end = end
            lane.bare_s = 0.0
            lane.phase = 2
            self.outermost_forwards += 1
            if self.discovering or self._pending is not None:
                self._after_outermost()
        except Exception:
            return False
        return True

    def note(self, module, bare: bool = False, had_model: bool = False) -> None:
        """The probe saw ``module`` called as an outermost module (``bare``: without parameters;
        ``had_model``: it called a module with parameters)."""
        self.outermost_forwards += 1
        key = id(module)
        if key not in self.known:
            self.learn(module)
        if bare:
            if self._bare_models.get(key) and not had_model:
                self.request("wrapper lost its model")    # a wrapper that called a model now calls an unknown one
            self._bare_models[key] = had_model

    def learn(self, module) -> None:
        """A module seen called as an outermost one for the first time (the probe checks ``known``
        itself on a model's forward: one set lookup, no call)."""
        self.known.add(id(module))
        self._new.append(weakref.ref(module))

    def _after_outermost(self) -> None:
        if self.discovering:
            self._window_forwards += 1
            if self._window_forwards >= WINDOW_FORWARDS:
                self._hand_over()
        elif self._pending is not None:
            self._open(self._pending)

    # ---- windows ------------------------------------------------------------------------------------
    def request(self, reason: str) -> None:
        """Open a discovery window now when no forward is running, else when the outermost forward
        ends. A reason whose windows keep finding nothing new waits 2, 4, 8, ... steps."""
        if not self.active or self.discovering or self._lifted or not self.probe.is_live():
            return
        if self.steps < self._not_before.get(reason, 0):
            return
        if self.probe.depth == 0:
            self._open(reason)
        else:
            self._pending = reason

    def _open(self, reason: str) -> None:
        self._pending = None
        self.discovering = True
        self.step_in_window = True
        self._window_forwards = 0
        self._reason = reason
        self.windows.append((self.steps, reason))
        # torch.compile warns when a compiled module is called under global hooks: they are diag's, for
        # this window only. quiet.py filters that message for the probe's lifetime; this entry, first in
        # the list, also holds against a filter the script added since (simplefilter("always")). Added
        # and removed without a version bump (quiet.add_filter: warnings.filterwarnings emptied every
        # module's registry, and the script's warnings were shown again)
        self._warn_filter = add_filter("ignore", _COMPILE_WARNING)
        self._add_globals()

    def _add_globals(self) -> None:
        from torch.nn.modules import module as nn_module

        self.give_call()      # (a window sees the lane's model through its hooks: _mine)
        self._global.append(nn_module.register_module_forward_pre_hook(self._g_pre))
        self._global.append(nn_module.register_module_forward_hook(self._g_post, with_kwargs=True,
                                                                   always_call=True))

    # ---- lifting (diag.probe.marks.Lifted): out of the way of torch.jit.script/trace, export, fx -------
    def lift(self):
        """Take the probe's hooks out of the hooked modules and, in a window, torch's global hooks out:
        a call that compiles or traces a module sees none of diag's."""
        self.give_call()      # (the lane's model: its hooks back first, taken out below with the others)
        mods = [ref() for ref, _a, _b in self._hooked.values()]
        token = lift_module_hooks([m for m in mods if m is not None])
        # the window's global hooks: out of torch's dictionaries and back under the same ids (marks.
        # lift_global_hooks: torch.compile's guards name them by id)
        handles = list(self._global)
        gtoken = lift_global_hooks(handles) if handles else None
        self._lifted += 1
        return token, handles, gtoken

    def restore(self, lifted) -> None:
        token, handles, gtoken = lifted
        self._lifted -= 1
        put_back(token)
        if gtoken is not None and self._global == handles and self.active:
            put_back_global(gtoken)     # (a window closed inside the call removed them for good)

    def _hand_over(self) -> None:
        for h in self._global:
            remove_global_hook(h)
        self._global.clear()
        self.discovering = False
        self._unfilter()
        self.handovers += 1
        new = 0
        fresh, self._new = self._new, []
        for ref in fresh:
            m = ref()
            if m is not None:
                new += self._hook(m)
        r = self._reason
        if r not in _NO_BACKOFF:
            n = self._fruitless[r] = 0 if new else self._fruitless.get(r, 0) + 1
            if n:
                self._not_before[r] = self.steps + (1 << min(n, 10))

    def boundary(self) -> bool:
        """A step closed. Returns whether a window was open during it. Hands over when the window saw
        an outermost forward; opens the periodic windows."""
        in_window = self.step_in_window
        self.step_in_window = self.discovering
        self.steps += 1
        if self.discovering:
            if self._window_forwards > 0:
                self._hand_over()
                self.step_in_window = False
            return in_window
        s = self.steps
        if s >= self.next_periodic:
            self.next_periodic = next_periodic(s)
            self.request("periodic")
        return in_window

    def _unfilter(self) -> None:
        f, self._warn_filter = self._warn_filter, None
        if f is not None:
            remove_filter(f)

    def _hook(self, module) -> int:
        import torch

        if self._lifted:
            return 0                          # inside torch.jit.script/trace, export, fx: nothing of diag's
        if isinstance(module, (torch.fx.GraphModule, torch.jit.ScriptModule)):
            return 0                          # built by torch.compile/fx (called inside compiled code), or scripted
        key = id(module)
        old = self._hooked.get(key)
        if old is not None and old[0]() is module:
            return 0
        if module in self._compiled_inner:
            return 0                          # compiled: its OptimizedModule is hooked instead
        try:
            ref = weakref.ref(module)
            a = module.register_forward_pre_hook(self._pre)
            b = module.register_forward_hook(self._post, with_kwargs=True, always_call=True)
        except Exception:
            return 0
        self._hooked[key] = (ref, a, b)
        return 1

    def _unhook(self, module) -> None:
        old = self._hooked.pop(id(module), None)
        if old is not None:
            old[1].remove()
            old[2].remove()

    def hooked(self) -> int:
        return len(self._hooked)

    # ---- the lane's call (issue 28) ------------------------------------------------------------------
    # While the lane (diag.probe.lane) is on, its model's forward need not pay for torch's hooked path: any
    # entry in a module's hook dictionaries sends each call of it through Module._call_impl's slow path
    # (a closure, the dictionaries walked, ~3.5 µs a step on bench_depth's 11-call step: bench/hook_floor.py
    # --call). The lane takes the probe's two hooks out of the model (same ids, put back in place) and
    # calls the model itself: torch's own door for that, the instance's ``_compiled_call_impl`` (what
    # ``Module.compile()`` sets; ``Module.__getstate__`` leaves it out of every pickle and copy, and diag's
    # reduction (marks) does for a class with a state of its own). Only where the probe's hooks are the
    # model's only forward hooks and no global hook exists (the call then runs on torch's fast path, as the
    # hooks saw it), never once torch.compile is in use, and never while a window, a lifting or anything
    # that reads the hooks (give_call) is on.
    def take_call(self, module, lane) -> bool:
        """Take the probe's hooks out of ``module`` (the lane's model, the lane just armed) and call it
        through :func:`_lane_call` instead. False (nothing changed) where that is not the same call."""
        if self._call is not None:
            self.give_call()
        probe = self.probe
        if (_CALL is None or not self.active or self.discovering or self._global or self._lifted
                or self._pending is not None or getattr(probe, "compile_used", True)):
            return False
        ent = self._hooked.get(id(module))
        cls = type(module)
        if (ent is None or ent[0]() is not module or cls.__call__ is not _CALL[0]
                or getattr(cls, "__copy__", None) is not None or getattr(cls, "__deepcopy__", None) is not None):
            # (a class that copies itself may copy its __dict__ as it is: the copy's calls would be this
            # model's; a copy made through __reduce_ex__ is cleaned by diag's reduction, marks.clean_state)
            return False
        d = getattr(module, "__dict__", None)
        if type(d) is not dict or d.get("_compiled_call_impl") is not None:
            return False
        _ref, a, b = ent
        pre, post = d.get("_forward_pre_hooks"), d.get("_forward_hooks")
        g = _CALL[1]
        if (not pre or not post or len(pre) != 1 or len(post) != 1 or a.id not in pre or b.id not in post
                or d.get("_backward_hooks") or d.get("_backward_pre_hooks")
                or g._global_forward_pre_hooks or g._global_forward_hooks
                or g._global_backward_pre_hooks or g._global_backward_hooks):
            return False
        saved = []
        for name, hid in (("_forward_pre_hooks", a.id), ("_forward_pre_hooks_with_kwargs", a.id),
                          ("_forward_hooks", b.id), ("_forward_hooks_with_kwargs", b.id),
                          ("_forward_hooks_always_called", b.id)):
            hooks = d.get(name)
            if hooks is not None and hid in hooks:
                saved.append((hooks, hid, hooks.pop(hid)))
        fn = _lane_call(self, probe, lane, ent[0])
        d[CALL_MARK] = fn
        mark_attribute(module, CALL_MARK)
        self._call = (ent[0], a, b, saved, fn)
        self.calls_taken += 1
        return True

    def give_call(self) -> None:
        """Put the probe's hooks back on the lane's model (in place: first in their dictionaries, as
        they were registered before any hook the script added since) and drop the lane's call."""
        c, self._call = self._call, None
        if c is None:
            return
        ref, a, b, saved, fn = c
        module = ref()
        if module is None:
            return
        d = module.__dict__
        if d.get(CALL_MARK) is fn:
            del d[CALL_MARK]
        unmark_attribute(module, CALL_MARK)
        ent = self._hooked.get(id(module))
        if not self.active or ent is None or ent[1] is not a or ent[2] is not b:
            return                          # (unhooked meanwhile: nothing to put back)
        for hooks, hid, v in saved:
            if hid not in hooks:
                hooks[hid] = v
                if len(hooks) > 1 and hasattr(hooks, "move_to_end"):
                    hooks.move_to_end(hid, last=False)


    # ---- signals ------------------------------------------------------------------------------------
    def _live(self) -> bool:
        return self.active and not self._lifted and self.probe.is_live()

    def _on_child(self, parent, name, child):
        c = self._call
        if c is not None and child is not None and c[0]() is child:
            # the lane's model becomes another module's child (DataParallel, DDP, a wrapper): its hooks back
            # before the parent's first forward (DataParallel's replicas copy a module's __dict__ as it is)
            self.give_call()
        if child is None or not self._live():
            return None
        t0 = time.perf_counter_ns()
        try:
            self._children.add(child)
            if type(parent).__name__ == "OptimizedModule":
                self._compiled_inner.add(child)    # its hooks would run inside the compiled region
                self._unhook(child)
            elif id(child) not in self.known:
                self._unhook(child)
            self._hook(parent)
        except Exception as e:
            self.probe.report_error("handover.module_registration", e)
        self.probe.own_ns += time.perf_counter_ns() - t0
        return None

    def _on_param(self, module, name, param):
        if not self._live():
            return None
        t0 = time.perf_counter_ns()
        try:
            self.probe.forget_parameters(module)
            if module not in self._children:
                self._hook(module)
        except Exception as e:
            self.probe.report_error("handover.parameter_registration", e)
        self.probe.own_ns += time.perf_counter_ns() - t0
        return None

    def restored(self, module) -> None:
        """``module``'s state was just set from a copy or a pickle (``copy.deepcopy`` of a hooked model:
        an EMA; ``torch.load`` of a whole model). It carries no hook of diag's (diag.probe.marks): hook
        it as a module built in the run is hooked. Its children were restored before it: unhook them."""
        if not self._live():
            return
        t0 = time.perf_counter_ns()
        try:
            for child in module._modules.values():
                if child is not None:
                    self._children.add(child)
                    if id(child) not in self.known:
                        self._unhook(child)
            if module not in self._children and self.probe.module_has_parameters(module):
                self._hook(module)
        except Exception as e:
            self.probe.report_error("handover.restored", e)
        self.probe.own_ns += time.perf_counter_ns() - t0

    def _opt_pre(self, opt, args, kwargs):
        if id(opt) not in self._opts and self._live():
            self._opts[id(opt)] = self.outermost_forwards
            self.request("new optimizer")
        return None

    def summary(self) -> dict:
        reasons: dict[str, int] = {}
        for _, r in self.windows:
            reasons[r] = reasons.get(r, 0) + 1
        return {"windows": len(self.windows), "window_reasons": reasons, "handovers": self.handovers,
                "hooked_modules": len(self._hooked)}
