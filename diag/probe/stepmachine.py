"""The step model as its own object (docs/steps.md): a state machine that decides where a training
step, an evaluation pass and an evaluation step begin and end, fed by what the probe's hooks saw.

It imports no torch and nothing of the probe: every observation arrives as plain values (times from
``time.perf_counter()``, loader ids, call-site keys, optimizer keys), and everything it concludes
leaves through its :class:`Listener` (the probe in a run; a recorder in ``tests/test_stepmachine.py``,
which drives it with synthetic sequences). The probe owns one (``Probe.steps``); nothing inherits it.

What it decides (the rules are docs/steps.md's; section numbers refer to it):

- **steps** (1): a step opens at the first training activity and closes at the end of its
  optimizer-step *group*, when the next iteration shows itself (a fetch, the same optimizer again,
  a training forward in a step no DataLoader fed, an evaluation forward, the run's end), or at once
  when every optimizer alive has stepped. Without any optimizer (a manual update) a step closes at
  its update (``manual_update``) or at the next batch or training forward.
- **phases** (2): data, forward, backward, optimizer (less a closure's time), other; ``eval_s``
  (forwards of other models inside the step) rides in ``extra``.
- **closures**: ``optimizer.step(closure)`` is timed (:meth:`wrap_closure`); repeated closure calls
  of one optimizer step evaluate the same batch and add no samples.
- **loader roles and evaluation passes** (4): a batch fetched while no step is open waits in a
  *tail* until what follows decides whether it is training data or an evaluation pass.
- **evaluation steps** (5): one forward of an evaluated model on one batch, with its data, h2d,
  forward and other phases.
"""
from __future__ import annotations

import time
from typing import Any, Protocol

from diag.evidence import events as E

EVAL_FLOPS_STEP = 3     # the evaluation step whose forward is counted with FlopCounterMode (evaluation-only runs)
TAIL_MAX = 64           # fetches kept in the tail before the oldest are committed to an evaluation pass


class Step:
    """The step in progress (implements :class:`diag.probe.context.StepState`)."""

    __slots__ = ("index", "start", "data_s", "forward_s", "backward_s", "optimizer_s", "eval_s",
                 "n_forward", "n_backward", "samples", "tokens", "sample_site", "micro_batches", "instrumented",
                 "extra", "group", "group_end", "batches")

    def __init__(self, index: int, start: float):
        self.index = index
        self.start = start
        self.data_s = self.forward_s = self.backward_s = self.optimizer_s = self.eval_s = 0.0
        self.n_forward = self.n_backward = 0
        self.samples: int | None = None
        self.tokens: int | None = None
        self.sample_site: str | None = None   # the call site whose batches the step's samples count
        self.micro_batches = 0
        self.instrumented = False
        self.extra: dict = {}
        self.group: set = set()      # the optimizers stepped in this step
        self.group_end: float | None = None   # when the group's last optimizer step ended
        self.batches = 0             # DataLoader batches that fed this step


class Listener(Protocol):
    """Where the machine's conclusions go (the probe implements it).

    ``emit_event(kind, data)``      an event to record (``evaluation``): kind, then the dict.
    ``step_opened(step)``           a training step opened.
    ``step_closed(step, ev)``       a training step closed; ``ev`` is its ``step`` event (the listener
                                    adds its own keys and records it; it may raise to stop the run).
    ``first_training()``            the first training activity of the run (framework detection).
    ``optimizer_alive()``           is any optimizer object alive in the process (decides manual mode).
    ``live_optimizers()``           how many optimizer objects are alive (an optimizer-step group is
                                    complete when each has stepped).
    ``eval_step_opened(es)``        an evaluation step opened (``es``: its record; the listener's
                                    tensor-method patches add ``h2d_s``/``syncs`` to it while open).
    ``eval_forward(es, site)``      a forward of the open evaluation step.
    ``eval_step_closed(es, ev)``    an evaluation step closed (``es`` None: dropped, not an
                                    evaluation step); ``ev`` its ``eval_step`` event (None when dropped).
    ``eval_finished()``             the run ends: the evaluation side's last word (sync sites).
    """

    def emit_event(self, kind: str, data: dict) -> None: ...
    def step_opened(self, step: Step) -> None: ...
    def step_closed(self, step: Step, ev: dict) -> None: ...
    def first_training(self) -> None: ...
    def optimizer_alive(self) -> bool: ...
    def live_optimizers(self) -> int: ...
    def eval_step_opened(self, es: dict) -> None: ...
    def eval_forward(self, es: dict, site: str | None) -> None: ...
    def eval_step_closed(self, es: dict | None, ev: dict | None) -> None: ...
    def eval_finished(self) -> None: ...


class StepMachine:
    """The step model's state and rules. Times are ``time.perf_counter()`` seconds; ``t0`` is the
    origin of the events' times (the probe's install).

    Read by the probe and its extensions (plain attributes): ``current`` (the open :class:`Step` or
    None), ``done`` (steps closed), ``epoch`` (set by the probe: the highest training-loader pass),
    ``last_boundary`` (where the last step or evaluation pass ended), ``closed_at`` (when closing the
    last step finished: its end plus the listener's work), ``any_optimizer_step``, ``manual_mode``
    (True: the script trains without an optimizer; None until decided), ``eval_passes``,
    ``eval_steps`` (evaluation steps emitted), ``last_batch_samples`` (set by the probe per batch),
    ``loaders`` (loader id -> the probe's record of it: the machine sets its ``role``)."""

    def __init__(self, listener: Listener, *, t0: float = 0.0, loaders: dict[int, dict] | None = None,
                 clock=time.perf_counter):
        self.listener = listener
        self.t0 = t0
        self.clock = clock
        self.loaders: dict[int, dict] = loaders if loaders is not None else {}
        self.current: Step | None = None
        self.done = 0
        self.epoch = 0
        self.last_boundary: float | None = None
        self.closed_at = 0.0
        self.any_optimizer_step = False
        self.manual_mode: bool | None = None
        self.last_batch_samples: int | None = None
        self.optimizers_known = 0            # optimizers the probe has a record of (set by the probe)
        # loader roles and evaluation passes (section 4)
        self.tail: list[dict] = []           # fetches since the last step with no step open
        self.tail_fwd: list[tuple] = []      # evaluation forwards after the tail's last fetch
        self.eval: dict | None = None        # the evaluation pass in progress
        self.eval_passes = 0
        self.closures: dict[Any, list] = {}  # optimizer key -> [closure seconds, calls]
        self._framework_done = False
        self._alive_counted_at = -1
        self._alive = 0
        # evaluation steps (section 5)
        self.es: dict | None = None          # the evaluation step in progress
        self.eval_steps = 0
        self._es_last_end: float | None = None
        self._es_pend_t0: float | None = None   # fetches not yet given to a step (training before any evaluation)
        self._es_pend_dt = 0.0
        self.eval_watched = False            # an evaluation forward was seen: every fetch may begin an evaluation step
        self.finishing = False

    def reset(self, t0: float) -> None:
        """Start again from nothing, with times from ``t0`` (a forked child process that trains)."""
        self.__init__(self.listener, t0=t0, loaders=self.loaders, clock=self.clock)  # type: ignore[misc]

    # ---- steps ---------------------------------------------------------------------------------------
    def open(self, start: float) -> Step:
        if self.last_boundary is not None:
            start = self.last_boundary
        step = self.current = Step(self.done + 1, start)
        self.listener.step_opened(step)
        return step

    def close(self, end: float, kind: str) -> None:
        """Close the open step at ``end`` (``kind``: what ended it, ``optimizer`` or ``manual``)."""
        step = self.current
        if step is None:
            return
        c0 = self.clock()
        self.current = None
        self.last_boundary = end
        self.done = step.index
        total = end - step.start
        other = total - step.data_s - step.forward_s - step.backward_s - step.optimizer_s - step.eval_s
        ev: dict[str, Any] = {
            "index": step.index, "total_s": total, "data_s": step.data_s, "forward_s": step.forward_s,
            "backward_s": step.backward_s, "optimizer_s": step.optimizer_s,
            "other_s": other + step.eval_s, "n_forward": step.n_forward,
            "n_backward": step.n_backward, "samples": step.samples, "tokens": step.tokens,
            "micro_batches": step.micro_batches or None,
            "epoch": self.epoch or None, "ended_by": kind, "instrumented": step.instrumented,
            "extra": step.extra,
        }
        if step.eval_s:
            step.extra["eval_s"] = step.eval_s
        try:
            self.listener.step_closed(step, ev)
        finally:
            # the listener's end-of-step work counts from the step's end (the next step's pre-forward
            # gap starts when it is done: the probe's own work is not the user's)
            self.closed_at = end + (self.clock() - c0)

    def close_group(self) -> None:
        """End the step at its optimizer-step group's end, if it has one."""
        step = self.current
        if step is not None and step.group_end is not None:
            self.close(step.group_end, "optimizer")

    def before_activity(self, t: float) -> None:
        """New data or a new training forward: close a manual step (backward without an optimizer
        step) if that is how this script trains."""
        step = self.current
        if step is None or step.n_backward == 0 or self.any_optimizer_step:
            return
        if self.manual_mode is None:
            self.manual_mode = not self.listener.optimizer_alive()
        if self.manual_mode:
            self.close(t, "manual")

    def before_fetch(self, t: float) -> None:
        """A DataLoader is about to fetch a batch: the next iteration shows itself."""
        step = self.current
        if step is not None and (step.group_end is not None or (step.n_backward and not self.any_optimizer_step)):
            self.close_group()
            self.before_activity(t)

    def begin_training(self, t: float) -> Step:
        """Training activity at ``t`` (a training forward's start, a backward, an optimizer step with a
        closure): the open step, or a new one that takes the tail's fetches as its data."""
        step = self.current
        if step is not None:
            return step
        if not self._framework_done:
            self._framework_done = True
            self.listener.first_training()
        tail = self.tail
        if len(tail) == 1 and not self.tail_fwd and self.es is None and self.eval is None \
                and self.last_boundary is not None and not tail[0].get("ended"):
            # the steady case (issue 28: every step of a plain loop): one fetch waits, nothing of an
            # evaluation is open; what the general path below does, without its calls
            rec = tail[0]
            self.tail = []
            self._es_pend_t0, self._es_pend_dt = None, 0.0
            step = self.open(rec["t0"])
            step.data_s += rec["dt"]
            step.batches += 1
            lid = rec["lid"]
            info = self.loaders.get(lid) if lid is not None else None
            if info is not None and info["role"] != "train":
                info["role"] = "train"
            return step
        if self.tail and self.tail_fwd and self._tail_is_eval():
            # the tail's batches came from an evaluation loader and were evaluated: the end of an
            # evaluation pass, not the data of this training step (section 4)
            self._commit_tail_to_eval()
        self._commit_ended_passes()
        tail, fwd = self.tail, self.tail_fwd
        self.tail, self.tail_fwd = [], []
        start = tail[0]["t0"] if tail else t
        self._es_claimed_by_training(start, bool(tail))
        self._end_eval(start)
        if self.last_boundary is None:
            self.last_boundary = start
        step = self.open(start)
        for rec in tail:
            step.data_s += rec["dt"]
            step.batches += 1
            self._set_role(rec["lid"], "train")
        for _s, dt in fwd:
            step.eval_s += dt
        return step

    # ---- what the hooks saw ----------------------------------------------------------------------------
    def training_forward(self, start: float, end: float, site: str) -> Step:
        """A top-level training forward of call site ``site`` ran from ``start`` to ``end``. Returns
        the step it belongs to; :meth:`counts_samples` then says whether its batch adds to the step's
        samples."""
        step = self.current
        if step is not None:
            if step.group_end is not None and step.batches == 0:
                self.close_group()   # no DataLoader feeds these steps: a training forward begins the next
                step = self.current
            if step is not None and step.n_backward and not self.any_optimizer_step:
                self.before_activity(start)   # a new step begins with its first training forward (manual updates)
                step = self.current
        if step is None:
            step = self.begin_training(start)
        step.forward_s += end - start
        step.n_forward += 1
        if step.n_forward == 1:
            # extra["pre_forward_s"] (checks/dataloader.py): seconds between the previous step's end
            # (when the probe finished closing it) and this step's first training forward, less the
            # DataLoader wait and evaluation forwards in between: the main thread's own batch building
            gap = start - max(step.start, self.closed_at) - step.data_s - step.eval_s
            step.extra["pre_forward_s"] = int(gap * 1e9 + 0.5) / 1e9 if gap > 0 else 0.0
        return step

    def counts_samples(self, step: Step, site: str) -> bool:
        """Does this training forward's batch add to the step's samples: every batch through the call
        site of its first training forward (gradient accumulation: each micro-batch), not a second
        model or a second view, and not a closure re-evaluating the same batch (LBFGS)."""
        return (step.sample_site is None or step.sample_site == site) and not (
            step.sample_site is not None and self.in_repeated_closure())

    def add_samples(self, step: Step, site: str, samples: int | None, tokens: int | None) -> None:
        step.micro_batches += 1
        if step.sample_site is None:
            step.sample_site = site
            step.samples, step.tokens = samples, tokens
        else:
            if samples is not None:
                step.samples = (step.samples or 0) + samples
            if tokens is not None:
                step.tokens = (step.tokens or 0) + tokens

    def bare_forward(self, dt: float, builds_graph: bool) -> None:
        """An outermost forward of a module without parameters (a loss) that ran no model: the step's
        forward when its output can be backpropagated, else a forward of no training (``eval_s``)."""
        step = self.current
        if step is None:
            return
        if builds_graph:
            step.forward_s += dt
        else:
            step.eval_s += dt

    def backward(self, start: float, end: float) -> None:
        step = self.current or self.begin_training(start)
        step.backward_s += end - start
        step.n_backward += 1

    def optimizer_begins(self, key: Any) -> None:
        """An optimizer's ``step()`` is about to run: the same optimizer again ends the previous
        iteration's group."""
        step = self.current
        if step is not None and step.group_end is not None and key in step.group:
            self.close_group()

    def optimizer_stepped(self, key: Any, start: float, end: float) -> None:
        """An optimizer's ``step()`` ran from ``start`` to ``end``: the optimizer phase (less its
        closure), and the step's optimizer-step group (closes the step when it is complete)."""
        self.any_optimizer_step = True
        step = self.current or self.open(start)
        closure = self.closures.pop(key, None) if self.closures else None
        step.optimizer_s += max(end - start - (closure[0] if closure else 0.0), 0.0)
        if step.n_backward > 0:
            # the step ends with its optimizer-step group, when the next iteration shows itself
            step.group.add(key)
            step.group_end = end
            n = self.optimizers_known       # _group_complete, inlined (per step)
            if self._alive_counted_at != n:
                self._alive_counted_at = n
                self._alive = self.listener.live_optimizers()
            if len(step.group) >= max(self._alive, 1):
                self.close(end, "optimizer")

    def _group_complete(self, step: Step) -> bool:
        """Every optimizer alive in the process has stepped in this group: the step can close now (a
        single-optimizer loop closes at its optimizer step). Live optimizers are counted once per newly
        known optimizer."""
        n = self.optimizers_known
        if self._alive_counted_at != n:
            self._alive_counted_at = n
            self._alive = self.listener.live_optimizers()
        return len(step.group) >= max(self._alive, 1)

    def manual_update_may_begin(self) -> bool:
        """A ``no_grad`` block opens outside any forward, fetch or backward: is it the update of a step
        with no optimizer (its time then becomes the step's optimizer phase)?"""
        step = self.current
        if step is None or step.n_backward == 0 or self.any_optimizer_step:
            return False
        if self.manual_mode is None:
            self.manual_mode = not self.listener.optimizer_alive()
        return bool(self.manual_mode)

    def manual_update(self, start: float, end: float) -> None:
        """The update block ran (no forward inside it): the step's optimizer phase, and its end."""
        step = self.current
        if step is None:
            return
        step.optimizer_s += end - start
        self.close(end, "manual")

    # ---- closures ----------------------------------------------------------------------------------
    def wrap_closure(self, key: Any, opt: Any, args: tuple, kwargs: dict | None):
        """(args, kwargs) of an optimizer step with its closure timed, or None when it has no closure.
        ``args`` is what torch hands an optimizer pre-hook: (optimizer, closure?) and the keywords."""
        closure, at = closure_of(opt, args, kwargs)
        if closure is None:
            return None
        rec = self.closures[key] = [0.0, 0]
        return with_closure(args, kwargs, at, timed_closure(closure, rec, self.clock))

    def in_repeated_closure(self) -> bool:
        """Inside the second or later call of an optimizer step's closure (LBFGS re-evaluating)."""
        return any(rec[1] > 1 for rec in self.closures.values()) if self.closures else False

    # ---- fetches, loader passes, evaluation ------------------------------------------------------------
    def fetched(self, lid: int | None, t0: float, dt: float) -> None:
        """A batch of loader ``lid`` arrived (after :meth:`before_fetch`); it was asked for at ``t0``."""
        step = self.current
        if step is not None:
            # inside a training step (gradient accumulation, a prefetching loader): training data
            step.data_s += dt
            step.batches += 1
            self._set_role(lid, "train")
            return
        if self.tail_fwd:
            self._commit_tail_to_eval()
        if self.es is None and self.done and not self.eval_watched:
            # _es_fetch's hot path, inlined (every step of a training run that has not evaluated)
            if self._es_pend_t0 is None:
                self._es_pend_t0 = t0
            self._es_pend_dt += dt
        else:
            self._es_fetch(t0, dt)
        self.tail.append({"lid": lid, "t0": t0, "dt": dt})
        if len(self.tail) > TAIL_MAX:   # a loader iterated without forwards: keep the evidence bounded
            self._commit_tail_to_eval(keep_last=1)

    def eval_forward(self, start: float, dt: float, site: str | None = None, samples=None,
                     tokens=None) -> bool:
        """A forward that does not train. True when it belongs to an evaluation pass (or the tail),
        False when it is part of the open training step (a teacher, an EMA model: the caller adds it
        to the step's ``eval_s``)."""
        step = self.current
        if step is not None:
            if step.group_end is None:
                step.eval_s += dt
                return False
            self.close_group()
        self._es_forward(start, dt, site, samples, tokens)
        if self.tail:
            self.tail_fwd.append((start, dt))
            return True
        ev = self._begin_eval(start)
        ev["forwards"] += 1
        ev["forward_s"] += dt
        ev["last"] = start + dt
        return True

    def wants_eval_batch(self) -> bool:
        """Would a forward that does not train now be counted as evaluation (so its batch size is
        worth reading)?"""
        step = self.current
        return step is None or step.group_end is not None

    def pass_started(self, lid: int | None) -> None:
        """Loader ``lid`` starts a pass with no training step open: the tail's batches from other
        loaders not known to feed training were a pass that stopped early (Lightning's sanity check
        takes 2 validation batches and leaves the iterator), not the next step's data."""
        if self.current is not None or not self.tail:
            return
        for rec in self.tail:
            if rec["lid"] != lid and rec["lid"] is not None:
                info = self.loaders.get(rec["lid"])
                if info is not None and info.get("role") != "train":
                    rec["ended"] = True

    def pass_ended(self, lid: int | None) -> None:
        """Loader ``lid`` finished a pass with no training step open: its batches still in the tail
        were a pass of their own (an evaluation whose forwards the probe did not see, or a loop over
        the data before training), never the next step's data."""
        if lid is None or self.current is not None:
            return
        for rec in self.tail:
            if rec["lid"] == lid:
                rec["ended"] = True

    def _set_role(self, lid: int | None, role: str) -> None:
        info = self.loaders.get(lid) if lid is not None else None
        if info is not None and info["role"] != role and (info["role"] is None or role == "train"):
            info["role"] = role

    def _begin_eval(self, t: float) -> dict:
        if self.eval is None:
            start = self.last_boundary if self.last_boundary is not None else t
            self.eval = {"start": start, "forwards": 0, "forward_s": 0.0, "data_wait_s": 0.0,
                         "batches": 0, "loaders": set(), "last": t}
        return self.eval

    def _commit_tail_to_eval(self, keep_last: int = 0) -> None:
        tail = self.tail[:-keep_last] if keep_last else self.tail
        if not tail and not self.tail_fwd:
            return
        first = tail[0]["t0"] if tail else self.tail_fwd[0][0]
        ev = self._begin_eval(first)
        for rec in tail:
            ev["data_wait_s"] += rec["dt"]
            ev["batches"] += 1
            if rec["lid"] is not None:
                ev["loaders"].add(rec["lid"])
                self._set_role(rec["lid"], "eval")
            ev["last"] = max(ev["last"], rec["t0"] + rec["dt"])
        for start, dt in self.tail_fwd:
            ev["forwards"] += 1
            ev["forward_s"] += dt
            ev["last"] = max(ev["last"], start + dt)
        self.tail = self.tail[-keep_last:] if keep_last else []
        self.tail_fwd = []

    def _end_eval(self, end: float) -> None:
        ev = self.eval
        if ev is None:
            return
        self.eval = None
        if ev["forwards"] == 0 and ev["batches"] == 0:
            return
        self.eval_passes += 1
        end = max(end, ev["start"])
        self.listener.emit_event(E.EVALUATION, {
            "index": self.eval_passes, "after_step": self.done, "start_s": round(ev["start"] - self.t0, 6),
            "time_s": end - ev["start"], "forwards": ev["forwards"], "forward_s": ev["forward_s"],
            "data_wait_s": ev["data_wait_s"], "batches": ev["batches"], "loaders": sorted(ev["loaders"])})
        self.last_boundary = end

    def _commit_ended_passes(self) -> None:
        """The tail's batches of passes that ended: an evaluation pass of their own; the tail keeps the
        rest, and the evaluation forwards after it."""
        ended = [rec for rec in self.tail if rec.get("ended")]
        if not ended:
            return
        rest, fwd = [rec for rec in self.tail if not rec.get("ended")], self.tail_fwd
        self.tail, self.tail_fwd = ended, []
        self._commit_tail_to_eval()
        self.tail, self.tail_fwd = rest, fwd

    def _tail_is_eval(self) -> bool:
        """The tail's fetches all came from loaders already known as evaluation loaders, or, while a
        training loader is known, none of them from a training loader."""
        roles = []
        for rec in self.tail:
            info = self.loaders.get(rec["lid"]) if rec["lid"] is not None else None
            roles.append(info.get("role") if info is not None else None)
        if any(r == "train" for r in roles) or None in [rec["lid"] for rec in self.tail]:
            return False
        if all(r == "eval" for r in roles):
            return True
        return any(i.get("role") == "train" for i in self.loaders.values())

    # ---- evaluation steps (section 5) ---------------------------------------------------------------
    def _es_open(self, t: float) -> dict:
        starts = [x for x in (self._es_last_end, self.last_boundary) if x is not None]
        start = min(max(starts), t) if starts else t
        es = self.es = {"start": start, "data_s": 0.0, "h2d_s": 0.0, "forward_s": 0.0, "forwards": 0,
                        "samples": None, "tokens": None, "site": None, "sites": set(), "syncs": 0,
                        "provisional": False, "sync_at": [], "instrumented": False}
        self.listener.eval_step_opened(es)
        return es

    def _es_fetch(self, t0: float, dt: float) -> None:
        """A batch arrived while no training step is open (provisional until a forward evaluates it)."""
        es = self.es
        if es is None and self.done and not self.eval_watched:
            # a training run that has not evaluated yet (the hot path of every training step): only
            # remember the fetch, in case an evaluation forward comes next
            if self._es_pend_t0 is None:
                self._es_pend_t0 = t0
            self._es_pend_dt += dt
            return
        if es is not None and es["forwards"]:
            self._es_close(t0)
            es = None
        if es is None:
            es = self._es_open(t0)
        es["data_s"] += dt
        es["provisional"] = True

    def _es_forward(self, start: float, dt: float, site: str | None, samples, tokens) -> None:
        es = self.es
        if es is not None and es["forwards"] and site in es["sites"]:
            self._es_close(start)        # the same call site again without a fetch: the next batch
            es = None
        if es is None:
            es = self._es_open(start)
            if self._es_pend_t0 is not None and self._es_pend_t0 >= es["start"]:
                es["data_s"] += self._es_pend_dt      # the fetch of its batch, made before it was known
        self._es_pend_t0, self._es_pend_dt = None, 0.0
        self.eval_watched = True
        es["forwards"] += 1
        es["forward_s"] += dt
        es["provisional"] = False
        if es["site"] is None:
            es["site"], es["samples"], es["tokens"] = site, samples, tokens
        es["sites"].add(site)
        self.listener.eval_forward(es, site)

    def _es_close(self, end: float) -> None:
        es = self.es
        self.es = None
        if es is None or not es["forwards"]:
            self.listener.eval_step_closed(None, None)   # fetches without a forward: not an evaluation step
            return
        end = max(end, es["start"])
        total = end - es["start"]
        other = total - es["data_s"] - es["h2d_s"] - es["forward_s"]
        self.eval_steps += 1
        self._es_last_end = end
        ev = {"index": self.eval_steps, "pass_index": self.eval_passes + 1, "total_s": total,
              "data_s": es["data_s"], "h2d_s": es["h2d_s"], "forward_s": es["forward_s"], "other_s": other,
              "forwards": es["forwards"], "samples": es["samples"], "tokens": es["tokens"], "site": es["site"],
              "host_syncs": es["syncs"], "instrumented": es["instrumented"]}
        self.listener.eval_step_closed(es, ev)

    def _es_claimed_by_training(self, t: float, tail_taken: bool) -> None:
        """Training begins at ``t``: an evaluation step built on fetches that training takes is dropped;
        one that evaluated ends here."""
        self._es_pend_t0, self._es_pend_dt = None, 0.0
        if self.es is None:
            return
        if tail_taken:
            # the tail (its fetches, and the forwards after them: a teacher's) feeds the training step
            self.es = None
            self.listener.eval_step_closed(None, None)
            return
        self._es_close(t)

    def evaluation_only(self) -> bool:
        """No training so far and no optimizer step (the listener rules out optimizer objects):
        ``--steps N`` counts evaluation steps in such a run."""
        return not self.done and not self.any_optimizer_step and not self.optimizers_known

    # ---- the run's end and child processes ------------------------------------------------------------
    def finish(self, t: float) -> None:
        """The run ends at ``t``: the open step closes (at its group's end, or now after a backward),
        an evaluation pass or step still open is emitted. Raises nothing of its own."""
        step = self.current
        if step is not None and step.group_end is not None:
            self.close_group()
        elif step is not None and step.n_backward > 0:
            self.close(t, "manual" if not self.any_optimizer_step else "optimizer")
        self._commit_ended_passes()
        if self.tail_fwd:
            self._commit_tail_to_eval()
        self.finishing = True
        if self.es is not None:
            es = self.es
            last = es["start"] + es["data_s"] + es["h2d_s"] + es["forward_s"]
            ev_last = self.eval["last"] if self.eval is not None else last
            self._es_close(max(last, ev_last))
        self.listener.eval_finished()
        if self.eval is not None:
            self._end_eval(self.eval["last"])

    def close_open_step(self, t: float) -> None:
        """Close what is open now without ending the run (a child process ends its target): the group's
        step at its end, or a step with a backward at ``t``."""
        step = self.current
        if step is not None and step.group_end is not None:
            self.close_group()
        elif step is not None and step.n_backward > 0:
            self.close(t, "manual" if not self.any_optimizer_step else "optimizer")


def closure_of(opt: Any, args: tuple, kwargs: dict | None) -> tuple[Any, int]:
    """The closure an optimizer step's arguments carry, as torch hands them to its pre-hook ((optimizer,
    closure?) and the keywords): ``(closure, at)``, ``at`` its position when it came positionally, -1
    when by keyword; ``(None, -1)`` without one (``step()``, ``step(None)``, ``step(closure=None)``)."""
    closure = kwargs.get("closure") if kwargs else None
    if closure is not None:
        return (closure, -1) if callable(closure) else (None, -1)
    at = 1 if args and args[0] is opt else 0
    if len(args) > at and callable(args[at]):
        return args[at], at
    return None, -1


def timed_closure(closure: Any, rec: list, clock: Any) -> Any:
    """``closure`` timed into ``rec``, an optimizer step's closure record ``[seconds, calls]`` (the step
    machine's :attr:`StepMachine.closures`: the optimizer phase leaves the closure's time out, and a second
    call is a closure re-evaluated)."""
    def timed(*a, **k):
        t0 = clock()
        rec[1] += 1
        try:
            return closure(*a, **k)
        finally:
            rec[0] += clock() - t0

    return timed


def with_closure(args: tuple, kwargs: dict | None, at: int, closure: Any) -> tuple:
    """The step's ``(args, kwargs)`` with ``closure`` in the place :func:`closure_of` found the old one."""
    if at >= 0:
        return tuple(args[:at]) + (closure,) + tuple(args[at + 1:]), kwargs
    kwargs = dict(kwargs or {})
    kwargs["closure"] = closure
    return args, kwargs


__all__ = ["EVAL_FLOPS_STEP", "Listener", "Step", "StepMachine", "closure_of", "timed_closure", "with_closure"]
