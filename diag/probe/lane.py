"""The probe's lane (issue 28): the unsampled steps of a plain training loop, accounted on a short path.

Most steps of most runs look the same: one batch from the same DataLoader iterator (or none: a loop
that builds its batches itself, ``rest`` 1), one forward of
the same model from the same call in the script, one backward, one optimizer step that closes the
step. The step machine (:mod:`diag.probe.stepmachine`) decides all of that from scratch on every step,
and the probe's extensions look at every step; on a short step that work is most of the probe's cost
(docs/performance.md, "Ninth pass"). The lane takes such a step on the probe's *unsampled* steps (the
cost budget, :mod:`diag.probe.budget`: the steps on which the per-step extras do not run):

- **armed** at the close of a step the full path accounted, when the last :data:`STREAK` steps had
  that plain shape with the same iterator, model, call site and optimizer, nothing of an evaluation
  is open, the hand-over is not discovering, every extension's per-step hook is idle or declares
  that it may skip unsampled steps (``LANE = True``), and the budget says the next step is unsampled;
- **on**, each hook checks that what it sees is the next expected event (a fetch, the model's
  forward with the same call-site key, a loss module's forward, the backward, the optimizer's
  step) and records its clock values only (:attr:`Lane.phase` says how far the step got);
  **gradient accumulation** is taken too: after a backward with no optimizer step, a fetch or the
  model's forward begins the step's next micro-batch (:meth:`Lane.push`), and batches fetched ahead
  of their forwards (the Hugging Face Trainer fetches a step's micro-batches first) wait in
  :attr:`Lane.queue`; the close sums the micro-batches as the step machine does
  (:meth:`Lane.accumulated`), and a step handed back is replayed in the order its events ran;
  **the closure mode** takes a step whose forward and backward run in the optimizer step's closure,
  called once (Lightning's automatic optimization): the optimizer's pre-hook wraps the closure
  (``Probe._lane_closure``), its entry begins the forward, its exit after the backward ends it; with
  gradient accumulation (Lightning's ``accumulate_grad_batches`` calls the closure itself for the step's
  first micro-batches) a model forward after the fetch runs a micro-batch outside the closure, and the
  pre-hook wraps the closure for the last one (:attr:`Lane.inclos` once it has);
- **the step closes** in :meth:`Lane.close`: the same ``step`` event, key for key, as the step machine
  would have built from the same clock values, and the same bookkeeping of the probe (loader,
  optimizer, call-site counts, the hand-over's boundary, the budget), with ``sampled: false``. A
  *quiet* step (one on which the budget decides nothing, most of them) keeps its clock values only, as
  one tuple; :meth:`Lane.flush` turns the kept ones into the probe's records (its time on each, the
  budget's lists, the counts) at the next step that decides, the lane's end, an event the probe emits
  (the file keeps the order of emission), ``os._exit``/``exec``, or :data:`QUIET_NS` after the last
  flush, and hands their events to the sink's writer thread as one record, built into lines there;
- **anything else** (another loader, a second forward, an evaluation, a closure where the armed step had
  none, a second call of the closure, ``torch.compile``,
  an exception, the run's end, an extension woken) hands the step back (:meth:`Lane.hand_back`): the
  events it recorded are fed to the step machine in order, with their clock values, exactly as the
  full path would have fed them, and the full path goes on from there. It is armed again only after
  :data:`STREAK` plain steps on the full path.

What a lane step does not do: call the extensions (their hooks are idle or ``LANE``), measure the
probe's time on each hook (its ``probe_s`` is the close's measured time, the hooks' timed wrappers
(``zero_grad``), and each of the lane's hook entries priced by a calibration at install, as the
probe's other estimated parts are; on quiet steps the hooked calls no timer sees, counted between two
flushes, are spread evenly over the steps between them). ``DIAG_PROBE_LANE=0`` turns it off (every step on the full path).

Nothing here imports torch or the probe's core: the probe passes itself in.
"""
from __future__ import annotations

import json
import threading
import time
from itertools import repeat
from operator import add, sub, truediv
from typing import Any

from diag.evidence import events as E
from diag.probe.hooks import DiagStop, env_on
from diag.probe.stepmachine import closure_of

STREAK = 2            # plain steps on the full path, in a row, before the lane is armed
ARM_FROM = 6          # never before this step (the probe's first steps carry its one-off work)
CORES = 16            # the lane steps whose median probe time is the budget's core (Lane.core_ns)
QUIET_NS = 100_000_000   # a quiet step's record waits at most this long on the step's thread (Lane.flush): what a
#                          script that hangs inside C code, and is then killed, can lose of them (the writer's
#                          thread writes every other waiting step event while the script's thread hangs)
ENTRIES = 5           # the lane's hook entries a step priced by the calibration (fetch, zero_grad, forward, backward,
#                       optimizer)
# the extension hooks that run during a step (a step's end included): each live one must be LANE
# (not on_optimizer: it runs at an optimizer's first step, which the lane never takes)
PER_STEP = ("on_data", "on_forward_start", "on_forward", "on_step_start", "on_step_end", "on_optimizer_step",
            "on_eval_forward", "on_graph_forward")

_ns = time.perf_counter_ns
_pc = time.perf_counter


def lane_enabled() -> bool:
    return env_on("DIAG_PROBE_LANE")


def lane_call_enabled() -> bool:
    """``DIAG_PROBE_LANE_CALL=0``: the lane's model keeps the probe's hooks (torch's hooked path) on the lane."""
    return env_on("DIAG_PROBE_LANE_CALL")


def calibrate_entry_ns(rounds: int = 5, calls: int = 64) -> float:
    """What one of the lane's hook entries costs beyond the hook call itself, warm: a clock read and
    a few stores on a slotted object (the lowest of ``rounds`` runs of ``calls``)."""
    rec = Lane()
    pc = _pc

    def entry(x):
        rec.f_end = pc()
        rec.phase = 2
        rec.samples = x

    best = float("inf")
    for _ in range(rounds):
        t0 = _ns()
        for i in range(calls):
            entry(i)
        best = min(best, (_ns() - t0) / calls)
    return best


def no_closure(opt: Any, args: tuple, kwargs: dict | None) -> bool:
    """An optimizer step's arguments (as torch hands its pre-hook) carry no closure: what
    ``StepMachine.wrap_closure`` finds nothing to time in (``step(closure=None)``, ``step(None)``)."""
    return closure_of(opt, args, kwargs)[0] is None


def _dead():
    return None


def _first(e: tuple) -> Any:
    return e[0]


def step_event(idx: int, total: float, data: float, fwd: float, bwd: float, opt: float, samples: Any, tokens: Any,
               epoch: Any, gap: float, k: int = 1) -> dict:
    """A lane step's event up to ``sampled`` (what the extensions' ``on_step_end`` gets): the keys, their
    order and rounding of ``StepMachine.close``'s event for such a step (``k`` micro-batches)."""
    if opt < 0.0:
        opt = 0.0
    return {"index": idx, "total_s": total, "data_s": data, "forward_s": fwd, "backward_s": bwd, "optimizer_s": opt,
            "other_s": total - data - fwd - bwd - opt, "n_forward": k, "n_backward": k, "samples": samples,
            "tokens": tokens, "micro_batches": k, "epoch": epoch, "ended_by": "optimizer", "instrumented": False,
            "extra": {"pre_forward_s": int(gap * 1e9 + 0.5) / 1e9 if gap > 0 else 0.0}, "sampled": False}


def build_step(rec: tuple) -> dict:
    """A quiet lane step's event from its record (:meth:`Lane.close`): the event :meth:`Lane.close`'s other
    path and the full path write (``StepMachine.close``, ``Probe.step_closed``, ``Probe.write_step``), key
    for key, same rounding."""
    (_, idx, total, data, fwd, bwd, opt, samples, tokens, epoch, gap, probe_ns, window, skey, n, n0, t0, rank,
     tags, k) = rec
    ev = step_event(idx, total, data, fwd, bwd, opt, samples, tokens, epoch, gap, k)
    ev["probe_s"] = int(probe_ns + 0.5) / 1e9
    if window:
        ev["probe_window"] = True
    ev["forward_counts"] = {skey: n}
    ev["kind"] = E.STEP
    ev["t"] = int((n0 * 1e-9 - t0) * 1e6 + 0.5) / 1e6
    ev["rank"] = rank
    if tags:
        ev.update(tags)
    return ev


# the line json.JSONEncoder writes for build_step's event (default separators; floats as repr, as it does)
_LINE = ('{"index": %d, "total_s": %r, "data_s": %r, "forward_s": %r, "backward_s": %r, "optimizer_s": %r, '
         '"other_s": %r, "n_forward": %d, "n_backward": %d, "samples": %s, "tokens": %s, "micro_batches": %d, '
         '"epoch": %s, "ended_by": "optimizer", "instrumented": false, "extra": {"pre_forward_s": %r}, '
         '"sampled": false, "probe_s": %r%s, "forward_counts": {%s: %d}, "kind": "' + E.STEP + '", "t": %r, '
         '"rank": %d%s}')
_FRAGMENTS: dict = {}   # id(tags) -> (tags, their JSON fragment); id(skey) -> (skey, its JSON string)


def _fragment(obj: Any, tags: bool) -> str:
    got = _FRAGMENTS.get(id(obj))
    if got is None or got[0] is not obj:
        text = json.dumps(obj)
        got = _FRAGMENTS[id(obj)] = (obj, (", " + text[1:-1]) if tags and obj else "" if tags else text)
    return got[1]


def step_line(rec: tuple) -> dict | str:
    """A quiet lane step's event as the JSON line the sink writes (on the sink's writer thread:
    :class:`diag.probe.sink.FileSink`), without building the dict and encoding it: the same text the
    encoder writes for :func:`build_step`'s event. The event itself where a value is not a plain int,
    None or finite float (the encoder's rules apply then)."""
    (_, idx, total, data, fwd, bwd, opt, samples, tokens, epoch, gap, probe_ns, window, skey, n, n0, t0, rank,
     tags, k) = rec
    if opt < 0.0:
        opt = 0.0
    x = total + data + fwd + bwd + opt + gap + probe_ns
    if (x - x != 0.0 or type(idx) is not int or type(n) is not int or type(rank) is not int
            or (samples is not None and type(samples) is not int) or (tokens is not None and type(tokens) is not int)
            or (epoch is not None and type(epoch) is not int) or type(skey) is not str):
        return build_step(rec)
    return _LINE % (idx, total, data, fwd, bwd, opt, total - data - fwd - bwd - opt, k, k,
                    "null" if samples is None else samples, "null" if tokens is None else tokens, k,
                    "null" if epoch is None else epoch, int(gap * 1e9 + 0.5) / 1e9 if gap > 0 else 0.0,
                    int(probe_ns + 0.5) / 1e9, ', "probe_window": true' if window else "", _fragment(skey, False), n,
                    int((n0 * 1e-9 - t0) * 1e6 + 0.5) / 1e6, rank, _fragment(tags, True))


def quiet_records(batch: tuple):
    """A batch of quiet steps (:meth:`Lane.flush`) as :func:`step_line`'s records, in order: each from the
    clock values :meth:`Lane.close` kept (one micro-batch's, or gradient accumulation's sums), the
    probe's time on the step and the call site's count after it."""
    _, recs, probes, n, skey, t0, rank, tags = batch
    for r, probe_ns in zip(recs, probes):
        if len(r) == 17:
            end, n0, _own, start, closed, o_start, epoch, window, idx, d0, f0, f_end, bare_s, b_start, b_end, \
                samples, tokens = r
            data = d0
            fwd = f_end - f0 + bare_s
            bwd = b_end - b_start
            k = 1
        else:
            end, n0, _own, start, closed, o_start, epoch, window, idx, k, data, fwd, bwd, samples, tokens, d0, f0, \
                _acc = r
        n += k
        gap = f0 - (start if start > closed else closed) - d0     # (pre_forward_s: the step machine's)
        yield (step_line, idx, end - start, data, fwd, bwd, end - o_start, samples, tokens, epoch or None, gap,
               probe_ns, window, skey, n, n0, t0, rank, tags, k)


def quiet_lines(batch: tuple) -> list:
    """The writer thread's side of :meth:`Lane.flush`: a batch of quiet steps' lines (or events, where
    :func:`step_line` leaves one to the encoder)."""
    return [step_line(rec) for rec in quiet_records(batch)]


quiet_lines.count = lambda batch: len(batch[1])     # type: ignore[attr-defined]  # (lines: the sink's CHUNK)


class Lane:
    """The lane's state: whether it is on, what it expects (set when armed), what this step recorded."""

    # what a lane step reads and writes first, in the order it does (hooks.hot_first: the same for a dict)
    __slots__ = ("on", "phase", "it_id", "rest", "pf", "nb", "wsum", "wmax", "t_fetch", "dt_fetch", "queue", "acc",
                 "mref", "code", "lasti", "dev", "acd", "samples", "tokens", "f_start", "f_end", "bare_s",
                 "b_start", "b_end", "oref", "o_start", "onest", "alive", "opt_id", "zg_n", "zg_ns", "zg_none",
                 "quiet", "fast", "inclos", "qbuf", "pend", "ofw", "q_due", "cmode", "lead", "mbs", "allowed",
                 "rec", "info", "lid", "mid", "skey", "site_depth", "oinfo", "o_end", "streak", "sig", "entry_ns",
                 "core_ns", "steps", "handed_back", "ext_ver", "lane_exts", "fwd", "fetch", "optc", "opt_plain",
                 "q_tot", "q_core", "cores", "n_site", "bid", "bref", "crec", "o_real", "oclos", "call_ok",
                 "q_extra", "tid")

    def __init__(self, allowed: bool = False):
        self.allowed = allowed
        self.call_ok = lane_call_enabled()   # the model called through the lane's call (HandOver.take_call)
        self.on = False
        self.phase = 0           # 0 awaiting the fetch, 1 fetched, 2 forwarded, 3 backward done, 4 optimizer running,
        #                          5 optimizer stepped, the group open until the next fetch (other optimizers alive)
        self.rest = 0            # the phase between steps: 0, or 1 in a loop that fetches no batch from a
        #                          DataLoader (its batches built by the script: a step begins at its forward)
        self.it_id = 0           # id() of the step's DataLoader iterator (0: a loop without one)
        self.rec: Any = None     # the probe's record of the iterator, and of its loader
        self.info: Any = None
        self.lid: Any = None
        self.mref: Any = _dead   # weak references to the model and the optimizer (the lane keeps no user object alive)
        self.mid = 0             # id() of the model (compared in the forward's pre-hook; its post-hook checks mref)
        # the parameterless outermost module called after the model forward (a loss module), once one lane
        # step took it through the full hooks (Probe.fwd_post): later steps take it in the hand-over's
        # trampolines, two clock reads (HandOver._local_pre / _local_post)
        self.bid = 0
        self.bref: Any = _dead
        # gradient accumulation: the step's micro-batches before the one being taken, each as
        # (t_fetch, dt_fetch, f_start, f_end, bare_s, samples, tokens, b_start, b_end) (push)
        self.mbs: list = []
        self.queue: list = []    # (t0, dt) of batches fetched ahead of their forward (the Trainer fetches a
        #                          step's micro-batches first), taken in order by the forwards
        self.lead = 0.0          # the wait of the batches fetched ahead before the step's first forward
        self.acc = False         # this step has more than one fetch or forward (mbs, queue, lead in use)
        # the closure mode (a Lightning loop: the optimizer step runs the forward and the backward in its
        # closure): a fetch leaves the phase at 8 (pf), the optimizer's pre-hook wraps the closure (phase 6),
        # the closure's entry sets 1, its exit (after the backward) 4 and moves o_start on by the closure's
        # time (the optimizer phase leaves it out, as the step machine's does)
        self.cmode = False
        self.pf = 1              # the phase a fetch leaves: 1, or 8 in the closure mode
        self.crec: Any = None    # the closure's [time, calls] (the step machine's record once handed back)
        self.o_real = 0.0        # the optimizer step's start (o_start less the closure's time)
        self.inclos = False      # the closure mode, past the optimizer's pre-hook (the closure wrapped); with
        #                          gradient accumulation (Lightning's accumulate_grad_batches) the micro-batches
        #                          before the last one run outside it: a forward at phase 8 begins one
        self.oclos: Any = None   # what the full path saw: the closure's record of the step being closed
        self.onest = 0           # the optimizer's steps running inside its step (a subclass's step() calling
        #                          super().step(): torch fires the step hooks at each level), their hooks left out
        self.skey = ""
        self.site_depth = 0      # sys._getframe depth of the call site, counted from HandOver._local_post
        self.code: Any = None
        self.lasti = -1          # the call site's instruction in its code (f_lasti: f_lineno walks the line table)
        self.dev = "cpu"
        self.acd: Any = None     # the autocast dtype of the call site (None: no autocast)
        self.oref: Any = _dead
        self.opt_id = 0
        self.oinfo: Any = None
        self.t_fetch = self.dt_fetch = self.f_start = self.f_end = self.bare_s = 0.0
        self.b_start = self.b_end = self.o_start = self.o_end = 0.0
        self.samples: Any = None
        self.tokens: Any = None
        self.alive = 1           # live optimizers when armed: with more, the step's group ends at the next fetch
        self.streak = 0
        self.sig: Any = None
        self.entry_ns = 0.0      # one hook entry's calibrated cost (calibrate_entry_ns)
        self.core_ns: float | None = None   # the lane steps' probe time, their median (the budget's core)
        self.cores: list = []    # the last lane steps' probe times (core_ns is their median, taken at off())
        # a quiet step's close (Lane.close) leaves three records of the probe to off() (Lane.settle): the
        # optimizer's step count, the hand-over's forwards at its last step, the call site's count
        self.pend = 0            # quiet steps not yet counted in those records
        # and the quiet steps' records (Lane.close: their clock values), turned into the probe's records at
        # the next decision, the lane's end, an event the probe emits, or QUIET_NS after the last (flush)
        self.qbuf: list = []
        self.q_due = 0
        self.q_extra = 0         # their micro-batches beyond one a step (gradient accumulation's)
        self.tid = 0             # the thread that armed the lane (the step's: only it flushes from emit)
        # the lane's fetches not yet counted in the loader's record (its batches, their wait, the longest
        # wait) and in the iterator's batch count: counted at off() (settle_counts), before anything reads them
        self.nb = 0
        self.wsum = self.wmax = 0.0
        # and the lane optimizer's zero_grad() calls (their count, their time in ns, the last set_to_none)
        self.zg_n = self.zg_ns = 0
        self.zg_none: Any = None
        self.n_site = 0          # the call site's count after the last lane step
        self.ofw = 0             # the hand-over's outermost forwards at the last lane step
        self.fast: Any = None    # (the sink, the file sink under it, its tags): the writer's queue (Probe._step_path)
        self.steps = 0           # steps the lane closed
        self.handed_back = 0     # steps it handed back to the full path
        self.ext_ver = -1        # the probe's extension version when lane_exts was listed
        self.lane_exts: list = []   # the extensions with a live per-step hook
        # what the full path saw in the step being closed (filled by its hooks, read when arming)
        self.fwd: Any = None     # (model's weakref, call-site key, frame depth, code, instruction (f_lasti), device, autocast dtype)
        self.fetch: Any = None   # (id(iterator), its record, its loader's record)
        self.optc: Any = None    # (the optimizer's weak reference, the probe's record of it)
        self.opt_plain = False   # the optimizer step ran without a closure
        self.quiet = 0           # steps up to this index are fed to the budget later, together (Budget.quiet_until)
        self.q_tot: list = []    # their wall times, and the core times they are fed with
        self.q_core: list = []

    # ---- arming (at the close of a step on the full path) ----------------------------------------------
    def consider(self, p, step, ev: dict) -> None:
        """A step closed on the full path (``ev`` its event, complete): count it towards the streak, and
        arm the lane when the streak is long enough and the next step is unsampled."""
        fwd, fetch, opt, clos = self.fwd, self.fetch, self.optc, self.oclos
        self.fwd = self.fetch = self.optc = self.oclos = None
        sm = p.steps
        ho = p._handover
        model = fwd[0]() if fwd is not None else None
        optimizer = opt[0]() if opt is not None and opt[0] is not None else None
        # a step with one batch from a DataLoader, or (``rest`` 1) with none and one optimizer alive (its
        # optimizer step is the step's end: a second optimizer's group would end at a fetch that never comes)
        # (gradient accumulation: k micro-batches, each one fetch, one forward, one backward, the fetches
        # in their micro-batch or ahead of the forwards, then the optimizer step: the lane checks the order
        # as the steps come)
        k = step.micro_batches
        if fetch is not None:
            fetched = step.batches == k and fetch[1][2] is False and fetch[2] is p._loaders_by_lid.get(fetch[1][1])
        else:
            fetched = step.batches == 0 and sm._alive <= 1
        # (the closure mode: micro-batches from a DataLoader, the last one's forward and backward in the
        # optimizer step's closure, called once, the ones before it (gradient accumulation: Lightning's
        # accumulate_grad_batches calls the closure itself) outside it, and the step closed by that
        # optimizer alone)
        in_closure = (not self.opt_plain and clos is not None and clos[1] == 1 and fetch is not None
                      and sm._alive <= 1)
        plain = (model is not None and fetched and optimizer is not None and (self.opt_plain or in_closure)
                 and ev.get("ended_by") == "optimizer" and step.n_forward == k and step.n_backward == k and k >= 1
                 and not step.eval_s and not step.instrumented
                 and len(step.group) == 1 and len(step.extra) == 1
                 and not sm.tail and not sm.tail_fwd and sm.es is None and sm.eval is None
                 and not sm.closures
                 and step.sample_site == fwd[1])
        if not plain:
            self.streak = 0
            self.sig = None
            return
        sig = (id(model), fwd[1], fwd[2], fwd[3], fwd[4], fwd[6], fetch[0] if fetch is not None else 0, id(optimizer))
        if sig != self.sig:
            self.sig = sig
            self.streak = 1
        else:
            self.streak += 1
        if (self.streak < STREAK or step.index < ARM_FROM or p.sampled or p._budget is None
                or ho is None or not ho.active or ho.discovering or ho._pending is not None
                or not p._bwd_wrapped or p._forked or not p.active or p._finishing or p.depth or p._in_data
                or p.in_backward or id(model) not in ho.known or not self.extensions_ok(p)):
            return
        self.mref, self.skey, depth, self.code, self.lasti, self.dev, self.acd = fwd
        self.bid, self.bref = 0, _dead
        self.mbs, self.queue, self.lead, self.acc = [], [], 0.0, False
        self.cmode = in_closure
        self.pf = 8 if in_closure else 1
        self.crec = None
        self.inclos = False
        self.onest = 0
        self.site_depth = depth - 1     # (counted from fwd_post; the lane reads it one frame out, in _local_post)
        self.mid = id(model)
        if fetch is not None:
            self.it_id, self.rec, self.info = fetch
            self.lid = fetch[1][1]
            self.rest = 0
        else:
            self.it_id, self.rec, self.info, self.lid = 0, None, None, None
            self.rest = 1
            self.t_fetch = self.dt_fetch = 0.0
        self.oref, self.oinfo = opt
        self.opt_id = id(optimizer)
        self.alive = sm._alive
        self.n_site = p._site_counts.get(self.skey, 0)
        self.pend = 0
        fast = p._step_sink
        if fast is None or fast[0] is not p.sink:
            fast = p._step_path()
        self.fast = fast if fast[1] is not None else None
        self.phase = self.rest
        self.quiet = 0
        self.tid = threading.get_ident()
        self.on = True
        if self.call_ok:
            ho.take_call(model, self)     # its model called without torch's hooked path (HandOver.take_call)

    def extensions_ok(self, p) -> bool:
        """Every extension's per-step hook is idle, or its extension may skip unsampled steps (a class or
        instance attribute ``LANE``, read each time: an extension may need every step for a while)."""
        ver = p._ext_ver
        if ver != self.ext_ver:
            self.ext_ver = ver
            idle = p._ext_idle
            self.lane_exts = [ext for ext in p._extensions
                              if any(getattr(ext, m, None) is not None and (id(ext), m) not in idle for m in PER_STEP)]
        return all(getattr(ext, "LANE", False) for ext in self.lane_exts)

    # ---- handing a step back to the full path ------------------------------------------------------------
    def off(self, p) -> None:
        """Turn the lane off at a step's boundary: the budget gets the steps still waiting in its list."""
        self.on = False
        ho = p._handover
        if ho is not None and ho._call is not None:
            ho.give_call()
        if self.nb or self.zg_n:
            self.settle_counts()
        if self.pend:
            self.settle(p)
        if self.q_tot:
            p._budget.feed_quiet(self.q_tot, self.q_core)
            self.q_tot, self.q_core = [], []
        cores = self.cores
        if cores:
            # the budget's core: the median of the last lane steps, not the last one alone (a step a
            # collection or a page fault slowed would make every full-path step's extras look free, and
            # the budget would sample every step: issue 28, found on bench_depth's 11-call step)
            if len(cores) > CORES:
                del cores[:-CORES]
            v = sorted(cores)
            n = len(v)
            self.core_ns = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2

    def settle_counts(self) -> None:
        """The lane's fetches since it was armed, into the loader's record and the iterator's count; its
        optimizer's zero_grad() calls, into the optimizer's record."""
        if self.nb:
            info = self.info
            info["batches"] += self.nb
            info["wait_s"] += self.wsum
            if self.wmax > info["max_wait_s"]:
                info["max_wait_s"] = self.wmax
            self.rec[3] += self.nb
            self.nb = 0
            self.wsum = self.wmax = 0.0
        if self.zg_n:
            info = self.oinfo
            info["zero_grad_calls"] += self.zg_n
            info["zero_grad_s"] += self.zg_ns / 1e9
            info["zero_grad_set_to_none"] = bool(self.zg_none)
            self.zg_n = self.zg_ns = 0

    def settle(self, p) -> None:
        """The records a quiet step's close leaves for later (:meth:`close`): its event and the probe's
        time on it (:meth:`flush`), the optimizer's step count, the hand-over's forwards at the optimizer's
        last step, the call site's forward count."""
        if self.qbuf:
            self.flush(p)
        k, self.pend = self.pend, 0
        self.steps += k
        self.oinfo["steps"] += k
        p._handover._opts[self.opt_id] = self.ofw
        p._site_counts[self.skey] = self.n_site

    def flush(self, p) -> None:
        """The quiet steps closed since the last flush (:meth:`close` keeps each one's clock values): the
        probe's time on each (as :meth:`own` takes it at a step's close; the hooked calls no timer sees,
        counted since the last step event, spread evenly over them), the budget's lists (each step's wall
        time, the core time of the step before it), the lane's cores, the call site's count; their events
        onto the writer's queue in one record (:func:`quiet_lines`: the writer thread builds the lines),
        or, where the writer cannot take them now, through the sink's call."""
        buf = self.qbuf
        if not buf:
            return
        self.qbuf = []
        n = len(buf)
        self.q_due = buf[-1][1] + QUIET_NS
        ho = p._handover
        w0, h0, b0 = p._est_marks
        w1, h1, b1 = ho.window_calls, ho.local_calls, p._bwd_calls
        p._est_marks = (w1, h1, b1)
        est = (((w1 - w0) * p.slow_path_ns + (h1 - h0) * p.hooked_call_ns + (b1 - b0) * p.autograd_hook_ns) / n
               + ENTRIES * self.entry_ns)
        p._est_ns += est * n
        # (the buffer's columns, the arithmetic over them in C: no bytecodes a step)
        cols = tuple(zip(*buf))
        owns = cols[2]
        probes = list(map(add, map(sub, owns, (p._own_mark,) + owns[:-1]), repeat(est, n)))
        p._own_mark = owns[-1]
        self.q_tot.extend(map(sub, cols[0], cols[3]))
        q_core = self.q_core
        q_core.append(p._last_core_s)
        q_core.extend(map(truediv, probes[:-1], repeat(1e9, n - 1)))
        p._last_core_s = probes[-1] / 1e9
        p._last_extras_s = 0.0
        self.cores.extend(probes)
        n_site = self.n_site
        self.n_site = n_site + n + self.q_extra
        self.q_extra = 0
        fast = self.fast
        if fast is not None and fast[0] is p.sink and fast[1].ready and not p._forked:
            fast[1].defer((quiet_lines, buf, probes, n_site, self.skey, p.t0, p.rank, fast[2]))
            return
        if p._forked:
            return
        # (a writer that failed, a sink replaced: each event through the sink's call, which raises the
        # writer's error for the probe to report, and adds the sink's tags)
        for rec in quiet_records((None, buf, probes, n_site, self.skey, p.t0, p.rank, None)):
            try:
                p.sink(build_step(rec))
            except Exception as e:
                p.report_error("sink", e)

    def micro_batch(self) -> tuple:
        """The micro-batch being taken, as :attr:`mbs` keeps one: ``(t_fetch, dt_fetch, f_start, f_end,
        bare_s, samples, tokens, b_start, b_end)``."""
        return (self.t_fetch, self.dt_fetch, self.f_start, self.f_end, self.bare_s, self.samples, self.tokens,
                self.b_start, self.b_end)

    def push(self) -> None:
        """A micro-batch of the step begins (gradient accumulation: a fetch, or the model's forward on a
        batch fetched ahead or built by the script, after the last one's backward): the last one's clock
        values are kept."""
        self.mbs.append(self.micro_batch())
        self.phase = 1
        self.acc = True

    def accumulated(self) -> tuple:
        """A step of k micro-batches (gradient accumulation), closing: ``(k, data, forward, backward,
        samples, tokens, the fetch wait before its first forward, that forward's start)``, the sums in the
        order the step machine adds them (StepMachine.fetched, training_forward, bare_forward, backward,
        add_samples); the micro-batches and the batches fetched ahead are let go."""
        mbs = self.mbs
        mbs.append(self.micro_batch())
        data = fwd = bwd = 0.0
        samples, tokens = mbs[0][5], mbs[0][6]
        for j, (_t, dt_fetch, f_start, f_end, bare_s, s_j, t_j, b_start, b_end) in enumerate(mbs):
            data += dt_fetch
            fwd += f_end - f_start
            if bare_s:
                fwd += bare_s
            bwd += b_end - b_start
            if j:
                if s_j is not None:
                    samples = (samples or 0) + s_j
                if t_j is not None:
                    tokens = (tokens or 0) + t_j
        for _t, dt in self.queue:       # fetched in the step and not forwarded: its data all the same
            data += dt
        lead = mbs[0][1] + self.lead
        self.mbs, self.queue, self.lead, self.acc = [], [], 0.0, False
        return len(mbs), data, fwd, bwd, samples, tokens, lead, mbs[0][2]

    def hand_back(self, p) -> None:
        """Turn the lane off; the events of the step it was taking go to the step machine, in order, with
        their clock values, as the full path's hooks would have fed them."""
        self.off(p)
        ph, self.phase = self.phase, 0
        inclos, self.inclos = self.inclos, False
        self.streak = 0
        self.sig = None
        if self.onest:
            # inside a step inside the optimizer's step: the full path leaves its post-hook out too
            p._opt_inner[self.opt_id] = self.onest
            self.onest = 0
        if ph <= self.rest and not self.acc:
            return
        self.handed_back += 1
        sm = p.steps
        skey = self.skey
        # the step's fetches, forwards and backwards, in the order they ran (their start times): one
        # micro-batch's, or gradient accumulation's (batches fetched ahead of their forwards included)
        evs: list = []
        cur = self.micro_batch()
        if inclos:
            # the closure mode, past the optimizer's pre-hook: what Probe._opt_pre did (the step opened, the
            # closure's record the step machine's, the optimizer's start)
            evs.append((self.o_real, 3, None))
            if ph == 6:
                ph = 1
        elif ph == 8:
            ph = 1
        for j, m in enumerate(self.mbs + [cur]):
            done = 3 if j < len(self.mbs) else ph     # (the current micro-batch: as far as it came)
            if not self.rest and done >= 1:
                evs.append((m[0], 0, m))
            if done >= 2:
                evs.append((m[2], 1, m))
            if done >= 3:
                evs.append((m[7], 2, m))
        for t0, dt in self.queue:
            evs.append((t0, 0, (t0, dt)))
        self.mbs, self.queue, self.lead, self.acc = [], [], 0.0, False
        evs.sort(key=_first)
        first = True
        for _t, kind, m in evs:
            if kind == 0:
                sm.fetched(self.lid, m[0], m[1])
            elif kind == 3:
                sm.closures[self.opt_id] = self.crec
                self.opt_plain = False
                sm.begin_training(self.o_real)
                p._opt_start[self.opt_id] = self.o_real
            elif kind == 1:
                step = sm.training_forward(m[2], m[3], skey)
                p._site_counts[skey] += 1
                p._site_dirty.add(skey)
                if first:
                    step.micro_batches += 1
                    step.sample_site = skey
                    step.samples, step.tokens = m[5], m[6]
                    first = False
                else:
                    sm.add_samples(step, skey, m[5], m[6])
                if m[4]:
                    sm.bare_forward(m[4], True)
            else:
                sm.backward(m[7], m[8])
        if ph < 4:
            return
        if ph == 4:
            p._opt_start[self.opt_id] = self.o_real if self.cmode else self.o_start
            return
        # 5: the optimizer stepped (what Probe._opt_post does), its group still open
        self.oinfo["steps"] += 1
        ho = p._handover
        ho._opts[self.opt_id] = ho.outermost_forwards
        sm.optimizer_stepped(self.opt_id, self.o_start, self.o_end)

    # ---- the step's close (the optimizer's post-hook) ----------------------------------------------------
    def own(self, p, ho, n0: int) -> float:
        """The probe's time in this step (ns): its timed parts since the last step event (the timed
        wrappers', this close's up to now) and the parts no timer sees (the hand-over's hooked calls, the
        backward's hooks, the lane's hook entries), priced by the calibrations at install."""
        own = p.own_ns + (_ns() - n0)
        probe_ns = own - p._own_mark
        p._own_mark = own
        w0, h0, b0 = p._est_marks
        w1, h1, b1 = ho.window_calls, ho.local_calls, p._bwd_calls
        p._est_marks = (w1, h1, b1)
        est = ((w1 - w0) * p.slow_path_ns + (h1 - h0) * p.hooked_call_ns + (b1 - b0) * p.autograd_hook_ns
               + ENTRIES * self.entry_ns)
        p._est_ns += est
        return probe_ns + est

    def close(self, p, n0: int, end: float | None = None) -> bool:
        """Close the step the lane took, at ``n0`` (``perf_counter_ns``): its event, the probe's
        bookkeeping, the budget; the lane stays on when the next step is unsampled too. ``end``: where the
        step ends when that is not now (its optimizer-step group's end, closed at the next fetch). False
        (the step handed back, for the full path to close) when an optimizer became known during the
        step: the step machine counts the live optimizers again then, and the group may not be complete."""
        sm = p.steps
        if sm.optimizers_known != sm._alive_counted_at:
            self.hand_back(p)
            return False
        if end is None:
            end = n0 * 1e-9
        self.phase = self.rest
        self.inclos = False
        idx = sm.done + 1
        try:
            if idx <= self.quiet and not p._last_sampled and self.fast is not None and not p._site_dirty:
                # a quiet step (no decision of the budget, no extension, a writer thread to write its event):
                # its clock values kept, as one tuple (flush: the probe's
                # records, the budget's lists and the step's event from it later, the event built on the
                # sink's writer thread, build_step's key for key); the probe's records it touches are
                # counted at off() (settle)
                ho = p._handover
                s = ho.steps + 1
                if s < ho.next_periodic and not ho.step_in_window and not ho.discovering and ho._pending is None:
                    ho.steps = s        # (HandOver.boundary's common case: no window open, none due)
                    window = stop = False
                else:
                    window = ho.boundary()
                    stop = ho.discovering or ho._pending is not None
                if self.acc:
                    k, data, fwd, bwd, samples, tokens, d0, f0 = self.accumulated()
                    self.q_extra += k - 1
                    self.qbuf.append((end, n0, p.own_ns, sm.last_boundary, sm.closed_at, self.o_start, sm.epoch,
                                      window, idx, k, data, fwd, bwd, samples, tokens, d0, f0, True))
                else:
                    # (one micro-batch: its clock values as they are, the parts worked out by the writer)
                    self.qbuf.append((end, n0, p.own_ns, sm.last_boundary, sm.closed_at, self.o_start, sm.epoch,
                                      window, idx, self.dt_fetch, self.f_start, self.f_end, self.bare_s, self.b_start,
                                      self.b_end, self.samples, self.tokens))
                sm.last_boundary = end
                sm.done = idx
                self.pend += 1          # (self.steps counts it at settle)
                p.depth = 0
                p._seek_model = False
                self.ofw = ho.outermost_forwards
                if stop:
                    self.off(p)
                    self.streak = 0
                elif n0 > self.q_due:
                    self.flush(p)
            else:
                if self.pend:
                    self.settle(p)
                start = sm.last_boundary
                if self.acc:
                    k, data, fwd, bwd, samples, tokens, d0, f0 = self.accumulated()
                else:
                    k = 1
                    d0 = data = self.dt_fetch
                    fwd = self.f_end - self.f_start + self.bare_s
                    bwd = self.b_end - self.b_start
                    samples, tokens = self.samples, self.tokens
                    f0 = self.f_start
                closed = sm.closed_at
                total = end - start
                gap = f0 - (start if start > closed else closed) - d0     # (pre_forward_s: the step machine's)
                opt = end - self.o_start        # (step_event clamps it at 0)
                sm.last_boundary = end
                sm.done = idx
                self.steps += 1
                p.depth = 0
                p._seek_model = False
                self.oinfo["steps"] += 1
                ho = p._handover
                ho._opts[self.opt_id] = ho.outermost_forwards
                counts = p._site_counts
                skey = self.skey
                n = counts[skey] = self.n_site = counts[skey] + k
                # the budget: a step that needs no decision waits in a list, fed with the next one that does
                # (Budget.quiet_until: the steps before a review or a sampled step); each fed with the last
                # step's core time, as the full path feeds it
                b = p._budget
                if idx <= self.quiet and not p._last_sampled:
                    self.q_tot.append(total)
                    self.q_core.append(p._last_core_s)
                    nxt = False
                else:
                    if self.q_tot:
                        b.feed_quiet(self.q_tot, self.q_core)
                        self.q_tot, self.q_core = [], []
                    p.sampled = nxt = b.after_step(total, p._last_core_s, p._last_extras_s, p._last_sampled)
                    if b.changes:
                        for change in b.pop_changes():
                            p.emit(E.PROBE_SAMPLING, **change)
                    self.quiet = 0 if nxt else b.quiet_until()
                # the step event, its keys in the full path's order (StepMachine.close, Probe.step_closed)
                ev = step_event(idx, total, data, fwd, bwd, opt, samples, tokens, sm.epoch or None, gap, k)
                ext_ns = 0
                if nxt and p._ext_live.get("on_step_end", True):
                    # the last unsampled step before a sampled one: the extensions' step end (a LANE
                    # extension marks it there: the device timeline measures the sampled step's gap from it);
                    # the probe's time on this step, not the lane's core (the budget prices sampling with it)
                    e0 = _ns()
                    p._ext("on_step_end", ev)
                    ext_ns = _ns() - e0
                probe_ns = self.own(p, ho, n0)
                core = probe_ns - ext_ns
                q = self.core_ns
                if (nxt or p._last_sampled) and q is not None:
                    # next to a sampled step: what it costs beyond the lane's other steps is sampling's (the
                    # sampled step's close spills into the step after it; the extensions' step end and a
                    # close that decides run in the one before it): extras, priced with the sampled step
                    # (Budget._review), and not the core (at 1 step in 2 every lane step is such a step, and
                    # a core that rose and fell with the period made the budget go 2, 4, 2, 4 ...)
                    extra = core - q if core > q else 0.0
                    core -= extra
                else:
                    extra = 0.0
                    self.cores.append(core)
                p._last_core_s = core / 1e9
                p._last_extras_s = (ext_ns + extra) / 1e9
                p._last_sampled = False
                ev["probe_s"] = int(probe_ns + 0.5) / 1e9
                if ho.boundary():
                    ev["probe_window"] = True
                ev["forward_counts"] = {skey: n}
                p.write_step(ev)
                p._site_dirty.discard(skey)
                if nxt or ho.discovering or ho._pending is not None or p._site_dirty:
                    self.off(p)   # (for a sampled step only, the streak stays: armed again after it)
                    if ho.discovering or ho._pending is not None or p._site_dirty:
                        self.streak = 0
            n2 = _ns()
            sm.closed_at = end + (n2 - n0) * 1e-9
            p.own_ns += n2 - n0
        except Exception as e:
            self.off(p)
            self.streak = 0
            p.report_error("lane", e)
            return True
        if p.max_steps is not None and idx >= p.max_steps and not p._finishing:
            raise DiagStop(f"--steps {p.max_steps} reached", "stopped")
        return True
