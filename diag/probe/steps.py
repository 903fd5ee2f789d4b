"""The step model's rules that are not hooks themselves (docs/steps.md): optimizer-step groups,
closures, which DataLoader feeds training, and evaluation passes as their own phase of the run.

:class:`StepRules` is a mixin of :class:`diag.probe.core.Probe`; it uses the probe's step state
(``current_step``, ``_last_boundary``, ``_close_step``, ``_open_step``, ``emit``) and keeps its own:

- **groups**: an optimizer step after a backward does not end the step; it marks the group's end
  (``step.group_end``) and the optimizers in it. The step ends there when the next iteration shows
  itself: a DataLoader delivers its next batch, an optimizer of the group steps again, a training
  forward starts in a step that had no DataLoader batch, an evaluation forward, or the run ends.
  When every optimizer alive in the process has stepped (a loop with one optimizer), the group is
  complete and the step closes at once. A GAN (optimizerD.step(), then optimizerG.step(), one batch) is one step.
- **closures**: ``optimizer.step(closure)`` runs forwards and backwards inside the optimizer step
  (LBFGS, Lightning's automatic optimization). The closure is timed; the optimizer phase is the
  step's span minus the closure's time; the closure's forwards and backwards stay in their phases,
  and its remaining time (a framework's hooks) is "other". Repeated closure calls of one optimizer
  step evaluate the same batch: they do not add samples.
- **loader roles and evaluation**: a batch fetched while no training step is open is held in a
  *tail* until what follows decides: a training activity (forward, backward, optimizer step) makes
  the tail's loaders training loaders and its waits the new step's data phase; an evaluation
  forward followed by another fetch makes them evaluation loaders, and the time from the previous
  step's end to the first fetch of the batch that trains next is an *evaluation pass*: emitted as an
  ``evaluation`` event (how long, how many forwards, its own data wait), never part of a step.
"""
from __future__ import annotations

import time

from diag.evidence import events as E
from diag.probe.evalsteps import EvalStepRules


from diag.probe import tensors as _tensors


def batch_samples(batch) -> int | None:
    """The number of samples in a batch a DataLoader delivered: collated batches stack samples at
    dim 0 of every tensor (a tensor, a tuple/list or dict of tensors, a dataclass); a plain list of
    non-tensors (strings, ids) is one sample per item."""
    try:
        first = batch[0] if type(batch) in (list, tuple) and batch else batch
        if type(first) is (_tensors._TENSOR or _tensors._tensor_cls()):   # the common case, per batch
            shape = first.shape
            if shape:
                return shape[0]
        t = _tensors.first_tensor(batch)
        if t is not None and t.dim() > 0:
            return int(t.shape[0])
        if isinstance(batch, list) and batch and not isinstance(batch[0], (list, tuple, dict)):
            return len(batch)
    except Exception:
        pass
    return None


class StepRules(EvalStepRules):
    """Mixin of Probe: groups, closures, loader roles, evaluation passes (and their steps:
    :mod:`diag.probe.evalsteps`)."""

    def _init_step_rules(self) -> None:
        self._init_eval_steps()
        self._tail: list[dict] = []          # fetches since the last step with no step open
        self._tail_fwd: list[tuple] = []     # evaluation forwards after the tail's last fetch
        self._eval: dict | None = None       # the evaluation pass in progress
        self._eval_passes = 0
        self._closure: dict[int, list] = {}  # id(optimizer) -> [closure seconds, calls]
        self.last_batch_samples: int | None = None
        self._framework_done = False
        self._alive_counted_at = -1
        self._alive_optimizers = 0

    # ---- groups ------------------------------------------------------------------------------------
    def _close_group(self) -> None:
        """End the step at its optimizer-step group's end, if the group is complete."""
        step = self.current_step
        if step is not None and step.group_end is not None:
            self._close_step(step.group_end, "optimizer")

    def _group_complete(self, step) -> bool:
        """Every optimizer alive in the process has stepped in this group: the step can close now
        (a single-optimizer loop closes at its optimizer step, as a step's end is then certain).
        Live optimizers are counted (a gc scan) once per newly seen optimizer. (Probe._opt_post inlines
        the case with nothing new to count: change both.)"""
        n = len(self._optimizers)
        if self._alive_counted_at != n:
            self._alive_counted_at = n
            try:
                import gc

                import torch

                cls = torch.optim.Optimizer
                self._alive_optimizers = sum(1 for o in gc.get_objects() if issubclass(type(o), cls))
            except Exception:
                self._alive_optimizers = 0
        return len(step.group) >= max(self._alive_optimizers, 1)

    # ---- closures ----------------------------------------------------------------------------------
    def _wrap_closure(self, opt, args, kwargs):
        """(args, kwargs) with the closure timed, or None when the step has no closure."""
        # torch hands the hook the step's own arguments: (optimizer, closure?) and the keywords
        closure = kwargs.get("closure") if kwargs else None
        at = 1 if args and args[0] is opt else 0
        positional = closure is None and len(args) > at and callable(args[at])
        if positional:
            closure = args[at]
        if closure is None or not callable(closure):
            return None
        probe = self
        key = id(opt)
        probe._closure[key] = [0.0, 0]

        def timed_closure(*a, **k):
            rec = probe._closure.get(key)
            t0 = time.perf_counter()
            if rec is not None:
                rec[1] += 1
            try:
                return closure(*a, **k)
            finally:
                if rec is not None:
                    rec[0] += time.perf_counter() - t0

        if positional:
            return tuple(args[:at]) + (timed_closure,) + tuple(args[at + 1:]), kwargs
        kwargs = dict(kwargs)
        kwargs["closure"] = timed_closure
        return args, kwargs

    def in_repeated_closure(self) -> bool:
        """Inside the second or later call of an optimizer step's closure (LBFGS re-evaluating)."""
        return any(rec[1] > 1 for rec in self._closure.values())

    def _closure_time(self, opt) -> float:
        rec = self._closure.pop(id(opt), None)
        return rec[0] if rec else 0.0

    # ---- fetches, training activity, evaluation ------------------------------------------------------
    def _loader_by_id(self, lid):
        return self._loaders_by_lid.get(lid) if lid is not None else None

    def _set_role(self, lid, role: str) -> None:
        info = self._loaders_by_lid.get(lid) if lid is not None else None
        if info is not None and info["role"] != role and (info["role"] is None or role == "train"):
            info["role"] = role

    def _fetched(self, lid, t0: float, dt: float) -> None:
        """A batch arrived (after ``_before_data`` closed a finished step)."""
        step = self.current_step
        if step is not None:
            # inside a training step (gradient accumulation, a prefetching loader): training data
            step.data_s += dt
            step.batches += 1
            self._set_role(lid, "train")
            return
        if self._tail_fwd:
            self._commit_tail_to_eval()
        self._es_fetch(t0, dt, provisional=True)
        self._tail.append({"lid": lid, "t0": t0, "dt": dt})
        if len(self._tail) > 64:   # a loader iterated without forwards: keep the evidence bounded
            self._commit_tail_to_eval(keep_last=1)

    def _eval_forward(self, start: float, dt: float, site: str | None = None, samples=None,
                      tokens=None) -> bool:
        """A forward that does not train. Returns True when it belongs to an evaluation pass (or the
        tail), False when it is part of the open training step (a teacher, an EMA model)."""
        step = self.current_step
        if step is not None:
            if step.group_end is None:
                return False
            self._close_group()
        self._es_forward(start, dt, site, samples, tokens)
        if self._tail:
            self._tail_fwd.append((start, dt))
            return True
        ev = self._begin_eval(start)
        ev["forwards"] += 1
        ev["forward_s"] += dt
        ev["last"] = start + dt
        return True

    def _begin_eval(self, t: float) -> dict:
        if self._eval is None:
            start = self._last_boundary if self._last_boundary is not None else t
            self._eval = {"start": start, "forwards": 0, "forward_s": 0.0, "data_wait_s": 0.0,
                          "batches": 0, "loaders": set(), "last": t}
        return self._eval

    def _commit_tail_to_eval(self, keep_last: int = 0) -> None:
        tail = self._tail[:-keep_last] if keep_last else self._tail
        if not tail and not self._tail_fwd:
            return
        first = tail[0]["t0"] if tail else self._tail_fwd[0][0]
        ev = self._begin_eval(first)
        for rec in tail:
            ev["data_wait_s"] += rec["dt"]
            ev["batches"] += 1
            if rec["lid"] is not None:
                ev["loaders"].add(rec["lid"])
                self._set_role(rec["lid"], "eval")
            ev["last"] = max(ev["last"], rec["t0"] + rec["dt"])
        for start, dt in self._tail_fwd:
            ev["forwards"] += 1
            ev["forward_s"] += dt
            ev["last"] = max(ev["last"], start + dt)
        self._tail = self._tail[-keep_last:] if keep_last else []
        self._tail_fwd = []

    def _end_eval(self, end: float) -> None:
        ev = self._eval
        if ev is None:
            return
        self._eval = None
        if ev["forwards"] == 0 and ev["batches"] == 0:
            return
        self._eval_passes += 1
        end = max(end, ev["start"])
        self.emit(E.EVALUATION, index=self._eval_passes, after_step=self.steps_done,
                  start_s=round(ev["start"] - self.t0, 6), time_s=end - ev["start"],
                  forwards=ev["forwards"], forward_s=ev["forward_s"], data_wait_s=ev["data_wait_s"],
                  batches=ev["batches"], loaders=sorted(ev["loaders"]))
        self._last_boundary = end

    def _pass_ended(self, lid) -> None:
        """Loader ``lid`` finished a pass with no training step open: its batches still in the tail
        were a pass of their own (an evaluation whose forwards the probe did not see, e.g. inside
        compiled code, or a loop over the data before training), never the next step's data."""
        if lid is None or self.current_step is not None:
            return
        for rec in self._tail:
            if rec["lid"] == lid:
                rec["ended"] = True

    def _pass_started(self, lid) -> None:
        """Loader ``lid`` starts a pass with no training step open: the tail's batches from other
        loaders not known to feed training were a pass that stopped early (Lightning's sanity check
        takes 2 validation batches and leaves the iterator), not the next step's data."""
        if self.current_step is not None or not self._tail:
            return
        for rec in self._tail:
            if rec["lid"] != lid and rec["lid"] is not None:
                info = self._loader_by_id(rec["lid"])
                if info is not None and info.get("role") != "train":
                    rec["ended"] = True

    def _commit_ended_passes(self) -> None:
        """The tail's batches of passes that ended (``_pass_ended``, ``_pass_started``): an evaluation
        pass of their own; the tail keeps the rest, and the evaluation forwards after it."""
        ended = [rec for rec in self._tail if rec.get("ended")]
        if not ended:
            return
        rest, fwd = [rec for rec in self._tail if not rec.get("ended")], self._tail_fwd
        self._tail, self._tail_fwd = ended, []
        self._commit_tail_to_eval()
        self._tail, self._tail_fwd = rest, fwd

    def _begin_training(self, t: float):
        """Training activity at ``t`` (a training forward's start, a backward, an optimizer step with a
        closure): the open step, or a new one that takes the tail's fetches as its data."""
        step = self.current_step
        if step is not None:
            return step
        if not self._framework_done:
            self._detect_framework()
        if self._tail and self._tail_fwd and self._tail_is_eval():
            # the tail's batches came from an evaluation loader and were evaluated: the end of an
            # evaluation pass, not the data of this training step (docs/steps.md, section 4)
            self._commit_tail_to_eval()
        self._commit_ended_passes()
        tail, fwd = self._tail, self._tail_fwd
        self._tail, self._tail_fwd = [], []
        start = tail[0]["t0"] if tail else t
        self._es_claimed_by_training(start, bool(tail))
        self._end_eval(start)
        if self._last_boundary is None:
            self._last_boundary = start
        step = self._open_step(start)
        for rec in tail:
            step.data_s += rec["dt"]
            step.batches += 1
            self._set_role(rec["lid"], "train")
        for _s, dt in fwd:
            step.eval_s += dt
        return step

    def _tail_is_eval(self) -> bool:
        """The tail's fetches all came from loaders already known as evaluation loaders, or, while a
        training loader is known, none of them from a training loader."""
        roles = []
        for rec in self._tail:
            info = self._loader_by_id(rec["lid"])
            roles.append(info.get("role") if info is not None else None)
        if any(r == "train" for r in roles) or None in [rec["lid"] for rec in self._tail]:
            return False
        if all(r == "eval" for r in roles):
            return True
        return any(i.get("role") == "train" for i in self._loaders.values())

    def _finish_step_rules(self) -> None:
        """At the end of the run: an evaluation pass (or unconsumed fetches after evaluation) still
        open is emitted."""
        self._commit_ended_passes()
        if self._tail_fwd:
            self._commit_tail_to_eval()
        try:
            self._es_finish()
        except Exception as e:
            self.report_error("eval_steps", e)
        if self._eval is not None:
            self._end_eval(self._eval["last"])

    # ---- manual updates (no optimizer) -----------------------------------------------------------------
    def _install_manual_update(self, torch) -> None:
        """In a loop without torch.optim (``p -= lr * p.grad`` under ``torch.no_grad()``), the
        ``no_grad`` block that follows the step's backward is its update: the optimizer phase, and the
        step ends when it exits (so the next batch's building is the next step's own work)."""
        cls = torch.autograd.grad_mode.no_grad
        orig_enter, orig_exit = cls.__enter__, cls.__exit__
        probe = self
        probe._update = None

        def __enter__(ng):
            out = orig_enter(ng)
            if probe._update is None and probe.active and not probe._forked:
                try:
                    probe._update_enter(ng)
                except Exception as e:
                    probe.report_error("no_grad.__enter__", e)
            return out

        def __exit__(ng, *exc):
            out = orig_exit(ng, *exc)
            if probe._update is not None and probe._update[0] is ng:
                probe._update_exit(exc[0] if exc else None)
            return out

        __enter__.__wrapped__ = orig_enter
        __exit__.__wrapped__ = orig_exit
        self._patch(cls, "__enter__", __enter__)
        self._patch(cls, "__exit__", __exit__)

    def _update_enter(self, ng) -> None:
        step = self.current_step
        if (step is None or step.n_backward == 0 or self._any_optimizer_step or self._in_backward
                or self._depth > 0 or self._in_data):
            return
        if self._manual_mode is None:
            from diag.probe.core import _optimizer_alive

            self._manual_mode = not _optimizer_alive()
        if not self._manual_mode:
            return
        self._update = (ng, time.perf_counter(), sum(self._site_counts.values()))

    def _update_exit(self, exc_type) -> None:
        ng, t0, forwards = self._update
        self._update = None
        end = time.perf_counter()
        step = self.current_step
        if step is None or exc_type is not None or sum(self._site_counts.values()) != forwards:
            return      # a forward ran inside: evaluation under no_grad, not the update
        step.optimizer_s += end - t0
        self._close_step(end, "manual")

    # ---- framework ------------------------------------------------------------------------------------
    def _detect_framework(self) -> None:
        """Once, at the first training activity: is a known framework driving the loop? Its frames are
        on the stack (transformers' Trainer, Lightning's Trainer, accelerate). Emits a ``framework``
        event with the user's line that called into it."""
        if self._framework_done:
            return
        self._framework_done = True
        import sys

        from diag.probe.frames import frame_location, user_frame

        found = None
        f = sys._getframe(1)
        while f is not None:
            fn = f.f_code.co_filename.replace("\\", "/")
            for marker, name, package in _FRAMEWORKS:
                if marker in fn:
                    found = (name, package)   # the outermost one wins (Trainer over accelerate)
                    break
            f = f.f_back
        if found is None:
            return
        name, package = found
        version = None
        try:
            from importlib.metadata import version as _version

            version = _version(package)
        except Exception:
            pass
        self.emit(E.FRAMEWORK, name=name, version=version, entry=frame_location(user_frame(2)))


# (a path fragment of the framework's own loop, its name in Evidence, its distribution)
_FRAMEWORKS = (
    ("/transformers/trainer", "transformers", "transformers"),
    ("/lightning/pytorch/", "lightning", "lightning"),
    ("/pytorch_lightning/", "lightning", "pytorch-lightning"),
    ("/accelerate/", "accelerate", "accelerate"),
)
