"""The probe-extension interface: what an extension may call (``ProbeContext``) and what it may
implement (``Extension``).

An extension is any object with some of the ``Extension`` hooks (each is optional). The probe calls
them with a ``ProbeContext`` as first argument; the context is the whole of what an extension may
use of the probe: emitting events, reporting its own errors, the current step, the models and
optimizers seen, and a way to pause the probe while it runs its own forwards. Nothing else of the
probe is public. An extension that raises is disabled and reported once (a ``probe_error`` event);
the user's run goes on.

A minimal extension::

    from diag.evidence import events as E    # the event kinds, spelled once

    class CountForwards:
        def __init__(self):
            self.n = 0

        def on_forward(self, ctx, module, args, kwargs, output, training):
            self.n += 1

        def on_step_end(self, ctx, step):
            step["extra"]["forwards_so_far"] = self.n          # rides on the step event
            if step["index"] % 10 == 0:
                ctx.emit(E.SET, path="extras.forwards", value=self.n)

Installed by default from :mod:`diag.probe.extensions` (``"module:Class"`` paths), or passed to
``Probe(..., extensions=[...])``.

Events an extension emits are folded into Evidence by :mod:`diag.fold`: ``set`` / ``merge`` /
``append`` with a dotted ``path`` (``extras.<name>``, ``memory.*``, ``flops.*``, ...) and a ``value``.

Hot path: ``on_forward`` runs once per top-level training forward and ``on_step_end`` once per
step. Keep them to a few attribute reads; the context's plain attributes (``current_step``,
``steps_done``, ``forward_start``, ...) cost nothing more than reading a field.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable


class StepState(Protocol):
    """The step in progress (``ProbeContext.current_step``). Extensions may set ``instrumented``
    (the step ran under extra instrumentation: timing statistics leave it out) and add keys to
    ``extra`` (they ride on the step event); the rest is read-only."""

    index: int             # 1-based
    start: float           # time.perf_counter() when it began
    data_s: float          # seconds waiting for DataLoader batches so far
    forward_s: float
    backward_s: float
    optimizer_s: float
    eval_s: float          # forwards outside training (evaluation) inside the step
    n_forward: int         # training forwards so far
    n_backward: int
    samples: int | None
    tokens: int | None
    micro_batches: int
    instrumented: bool
    extra: dict


class ProbeContext(Protocol):
    """What an extension may use of the probe.

    Plain attributes (read them, never assign them):

    ``rank``, ``local_rank``, ``world_size``  this process's place in a distributed run (0, 0, 1 alone).
    ``max_steps``             the step limit diag stops the script at (None: none).
    ``steps_done``            steps closed so far.
    ``epoch``                 the highest DataLoader epoch seen (0 before the first).
    ``current_step``          the ``StepState`` in progress, or None between steps.
    ``forward_start``         ``time.perf_counter()`` when the current (or last) top-level model forward began.
    ``step_closed_at``        ``time.perf_counter()`` when the probe finished closing the last step.
    ``forward_counts_samples`` whether the training forward being reported adds to the step's samples
                              (False for a second model's forward in the same step, e.g. a GAN's).
    ``manual_mode``           True when the script trains without an optimizer step (steps end at the
                              next batch), False when not, None until decided.
    ``sampled``               whether the step in progress is a sampled one: an extension does its
                              per-step extras (device timeline, allocator reads, ...) only on sampled
                              steps, so that the probe's cost stays within its budget (issue 28). The
                              probe's core step accounting runs on every step either way.
    """

    rank: int
    local_rank: int
    world_size: int
    max_steps: int | None
    steps_done: int
    epoch: int
    current_step: StepState | None
    forward_start: float
    step_closed_at: float
    forward_counts_samples: bool
    sampled: bool

    @property
    def manual_mode(self) -> bool | None: ...

    def now(self) -> float:
        """Seconds since the probe was installed (the ``t`` of events)."""
        ...

    def emit(self, kind: str, **data: Any) -> None:
        """Send one event (``kind``, ``t`` and ``rank`` are added). Silent in forked children."""
        ...

    def report_error(self, where: str, error: BaseException) -> None:
        """Record a ``probe_error`` event for ``where`` (once per ``where``); never raises."""
        ...

    def is_live(self) -> bool:
        """Installed, not paused, and not in a forked child (DataLoader workers inherit the hooks)."""
        ...

    def model_id(self, module: Any) -> int | None:
        """The id the probe gave ``module`` in its ``model`` event (None: not a model it has seen)."""
        ...

    def models(self) -> list:
        """The model modules seen so far that are still alive, in the order first seen."""
        ...

    def last_model(self) -> Any:
        """The module of the last top-level training forward (None: none yet, or gone)."""
        ...

    def optimizer_info(self, optimizer: Any, create: bool = True) -> dict | None:
        """The probe's record of ``optimizer`` (its ``optimizer`` event: ``id``, ``cls``, ``steps``,
        ``zero_grad_set_to_none``, ...); created when ``create`` and not seen yet, else None."""
        ...

    def is_top_forward(self, module: Any) -> bool:
        """Is ``module`` the outermost model forward now running (for a forward pre-hook of the
        extension's own, which runs after the probe's)?"""
        ...

    def phase(self) -> str:
        """What the script is doing now: ``"data"`` (waiting for a batch), ``"backward"``,
        ``"forward"`` or ``"other"``."""
        ...

    def paused(self) -> AbstractContextManager:
        """A context manager during which the probe records nothing (for an extension that runs
        forwards or optimizer steps of its own, e.g. the memory replay)."""
        ...

    def disable(self, extension: Any) -> None:
        """Stop calling ``extension``'s hooks (its ``uninstall`` is still called)."""
        ...

    def idle(self, extension: Any, method: str) -> None:
        """Stop calling one of ``extension``'s hooks (``"on_forward"``, ...) for the rest of the run:
        it has nothing more to do there. The per-step path stays short (each call on it costs several
        times its warm cost after a step's work evicted the caches: docs/performance.md)."""
        ...

    def wake(self, extension: Any, method: str) -> None:
        """Call that hook again (an extension idles a per-step hook until what it needs shows up, and
        wakes it then: e.g. on a DDP model in ``on_model``)."""
        ...


@runtime_checkable
class Extension(Protocol):
    """The hooks an extension may implement; each is optional (the probe calls only those present).

    ``install(ctx)``                                 when the probe installs (before the script runs).
    ``uninstall(ctx)``                               when it uninstalls: undo every hook and patch.
    ``on_model(ctx, module, info)``                  a model seen for the first time (``info``: its
                                                     ``model`` event).
    ``on_forward_start(ctx, module)``                a model's top-level forward begins (keep it cheap:
                                                     it runs on every outermost forward).
    ``on_forward(ctx, module, args, kwargs, output, training)``  a top-level training forward ended.
    ``on_graph_forward(ctx, module, args, kwargs, output, site)`` a top-level forward outside training
                                                     built an autograd graph (eval mode, grad enabled;
                                                     ``site``: the ``forward_site`` record).
    ``on_eval_forward(ctx, module, args, kwargs, output, site)`` one of the first 8 top-level forwards
                                                     of an evaluation pass (not inside a training step).
    ``on_data(ctx, edge)``                           around each training-loop ``DataLoader.__next__``:
                                                     ``edge`` is ``"start"`` (before the fetch) or ``"end"``
                                                     (the batch arrived, before the step is opened for it).
    ``on_optimizer(ctx, optimizer)``                 an optimizer is about to take its first step (once
                                                     per optimizer).
    ``on_optimizer_step(ctx, optimizer)``            an optimizer's ``step()`` is about to run, every step
                                                     (from the probe's own optimizer pre-hook: an extension
                                                     needs no global optimizer hook of its own, each of
                                                     which torch dispatches on every step).
    ``on_step_start(ctx, index)``                    a step opened (``ctx.current_step`` is it).
    ``on_step_end(ctx, step)``                       a step closed; ``step`` is the step event, still
                                                     mutable: add keys to ``step["extra"]``.
    ``on_exit(ctx, status)``                         the script ended (``completed``, ``failed``, ``oom``,
                                                     ``stopped``, ``interrupted``), before the ``end`` event.

    This protocol names the common pair; ``isinstance(obj, Extension)`` is true of any object with
    ``install`` and ``uninstall``.
    """

    def install(self, ctx: ProbeContext) -> None: ...

    def uninstall(self, ctx: ProbeContext) -> None: ...


HOOKS = ("install", "uninstall", "on_model", "on_forward_start", "on_forward", "on_graph_forward", "on_eval_forward",
         "on_data", "on_optimizer", "on_optimizer_step",
         "on_step_start", "on_step_end", "on_exit")


__all__ = ["Extension", "HOOKS", "ProbeContext", "StepState"]
