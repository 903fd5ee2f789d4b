"""The step machine on synthetic event sequences, without torch (diag/probe/stepmachine.py, issue 28).

Each test feeds the machine what the probe's hooks would have seen (times in seconds on a scripted
clock) and checks the events it concludes: steps and their phases, optimizer-step groups, closures,
manual updates, loader roles, evaluation passes and evaluation steps."""
from __future__ import annotations

import subprocess
import sys

import pytest

from diag.evidence import events as E
from diag.probe.stepmachine import StepMachine


class Recorder:
    """A Listener that records what the machine concludes."""

    def __init__(self, optimizers: int = 1, optimizer_alive: bool = True):
        self.events: list[tuple[str, dict]] = []
        self.opened: list[int] = []
        self.first = 0
        self._optimizers = optimizers
        self._alive = optimizer_alive
        self.eval_opened = 0

    def emit_event(self, kind, data):
        self.events.append((kind, data))

    def step_opened(self, step):
        self.opened.append(step.index)

    def step_closed(self, step, ev):
        self.events.append((E.STEP, ev))

    def first_training(self):
        self.first += 1

    def optimizer_alive(self):
        return self._alive

    def live_optimizers(self):
        return self._optimizers

    def eval_step_opened(self, es):
        self.eval_opened += 1

    def eval_forward(self, es, site):
        pass

    def eval_step_closed(self, es, ev):
        if ev is not None:
            self.events.append((E.EVAL_STEP, ev))

    def eval_finished(self):
        pass

    def of(self, kind):
        return [d for k, d in self.events if k == kind]


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def machine(**kw):
    rec = Recorder(**kw)
    clock = Clock()
    loaders = {1: {"id": 1, "role": None}, 2: {"id": 2, "role": None}}
    return StepMachine(rec, t0=0.0, loaders=loaders, clock=clock), rec


def train_iteration(sm, t, lid=1, fetch=0.010, fwd=0.020, bwd=0.030, opt=0.005, site="s1", samples=8):
    """One loader-fed iteration starting at ``t``: fetch, forward, backward, optimizer step."""
    sm.before_fetch(t)
    sm.fetched(lid, t, fetch)
    t += fetch
    step = sm.training_forward(t, t + fwd, site)
    if sm.counts_samples(step, site):
        sm.add_samples(step, site, samples, None)
    t += fwd
    sm.backward(t, t + bwd)
    t += bwd
    sm.optimizer_begins("opt")
    sm.optimizer_stepped("opt", t, t + opt)
    return t + opt


def test_module_imports_no_torch():
    code = ("import sys; import diag.probe.stepmachine; "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_loader_fed_steps_and_phases_add_up():
    sm, rec = machine()
    sm.optimizers_known = 1
    t = 0.0
    for _ in range(3):
        t = train_iteration(sm, t)
    steps = rec.of(E.STEP)
    assert [s["index"] for s in steps] == [1, 2, 3]
    assert rec.first == 1 and rec.opened == [1, 2, 3]
    for s in steps:
        assert s["ended_by"] == "optimizer"
        assert s["data_s"] == pytest.approx(0.010) and s["forward_s"] == pytest.approx(0.020)
        assert s["backward_s"] == pytest.approx(0.030) and s["optimizer_s"] == pytest.approx(0.005)
        parts = s["data_s"] + s["forward_s"] + s["backward_s"] + s["optimizer_s"] + s["other_s"]
        assert parts == pytest.approx(s["total_s"])
        assert s["samples"] == 8 and s["micro_batches"] == 1
    assert sm.done == 3 and sm.current is None
    assert sm.loaders[1]["role"] == "train"


def test_gradient_accumulation_is_one_step_with_all_micro_batches():
    sm, rec = machine()
    sm.optimizers_known = 1
    t = 0.0
    for i in range(4):     # four micro-batches, one optimizer step
        sm.before_fetch(t)
        sm.fetched(1, t, 0.001)
        t += 0.001
        step = sm.training_forward(t, t + 0.002, "s1")
        if sm.counts_samples(step, "s1"):
            sm.add_samples(step, "s1", 4, 40)
        t += 0.002
        sm.backward(t, t + 0.003)
        t += 0.003
    sm.optimizer_stepped("opt", t, t + 0.001)
    (s,) = rec.of(E.STEP)
    assert s["samples"] == 16 and s["tokens"] == 160 and s["micro_batches"] == 4
    assert s["n_forward"] == 4 and s["n_backward"] == 4


def test_two_optimizers_one_batch_is_one_step_closed_when_both_stepped():
    sm, rec = machine(optimizers=2)
    sm.optimizers_known = 2
    t = 0.0
    sm.before_fetch(t)
    sm.fetched(1, t, 0.001)
    t += 0.001
    sm.training_forward(t, t + 0.002, "d")
    sm.backward(t + 0.002, t + 0.003)
    sm.optimizer_stepped("D", t + 0.003, t + 0.004)
    assert rec.of(E.STEP) == []            # the group is not complete: G has not stepped
    sm.training_forward(t + 0.004, t + 0.005, "g")
    sm.backward(t + 0.005, t + 0.006)
    sm.optimizer_stepped("G", t + 0.006, t + 0.007)
    (s,) = rec.of(E.STEP)                  # both stepped: complete, closed at G's end
    assert s["n_forward"] == 2 and s["total_s"] == pytest.approx(0.008)   # from its fetch to G's end


def test_an_incomplete_group_closes_when_the_same_optimizer_steps_again():
    sm, rec = machine(optimizers=2)        # a second optimizer exists but never steps
    sm.optimizers_known = 2
    t = 0.0
    for _ in range(2):
        sm.optimizer_begins("opt")
        sm.training_forward(t, t + 0.002, "s1")
        sm.backward(t + 0.002, t + 0.004)
        sm.optimizer_stepped("opt", t + 0.004, t + 0.005)
        t += 0.010
    assert [s["index"] for s in rec.of(E.STEP)] == [1]
    sm.finish(t)
    assert [s["index"] for s in rec.of(E.STEP)] == [1, 2]


def test_closure_time_is_taken_out_of_the_optimizer_phase_and_repeats_add_no_samples():
    sm, rec = machine()
    sm.optimizers_known = 1
    clock = sm.clock
    calls = []

    def closure():
        # what the closure's forward and backward would report, on the scripted clock
        step = sm.training_forward(clock.t, clock.t + 0.002, "s1")
        if sm.counts_samples(step, "s1"):
            sm.add_samples(step, "s1", 8, None)
        sm.backward(clock.t + 0.002, clock.t + 0.005)
        clock.t += 0.006
        calls.append(1)
        return 1.0

    opt = object()
    wrapped = sm.wrap_closure("lbfgs", opt, (opt, closure), {})
    assert wrapped is not None
    args, kwargs = wrapped
    sm.begin_training(clock.t)
    start = clock.t
    for _ in range(3):                     # LBFGS evaluates the closure three times
        args[1]()
    clock.t += 0.001                       # the optimizer's own arithmetic
    sm.optimizer_stepped("lbfgs", start, clock.t)
    (s,) = rec.of(E.STEP)
    assert len(calls) == 3
    assert s["samples"] == 8               # one batch, evaluated three times
    assert s["optimizer_s"] == pytest.approx(0.001)
    assert s["forward_s"] == pytest.approx(0.006) and s["backward_s"] == pytest.approx(0.009)


def test_manual_update_without_an_optimizer():
    sm, rec = machine(optimizer_alive=False)
    t = 0.0
    for _ in range(2):
        sm.before_fetch(t)
        sm.fetched(1, t, 0.001)
        sm.training_forward(t + 0.001, t + 0.003, "s1")
        sm.backward(t + 0.003, t + 0.006)
        assert sm.manual_update_may_begin()
        sm.manual_update(t + 0.006, t + 0.008)
        t += 0.010
    steps = rec.of(E.STEP)
    assert [s["ended_by"] for s in steps] == ["manual", "manual"]
    assert all(s["optimizer_s"] == pytest.approx(0.002) for s in steps)
    assert sm.manual_mode is True


def test_manual_steps_end_at_the_next_batch_without_an_update_block():
    sm, rec = machine(optimizer_alive=False)
    t = 0.0
    for _ in range(3):
        sm.before_fetch(t)
        sm.fetched(1, t, 0.001)
        sm.training_forward(t + 0.001, t + 0.003, "s1")
        sm.backward(t + 0.003, t + 0.006)
        t += 0.010
    sm.finish(t)
    steps = rec.of(E.STEP)
    assert [s["index"] for s in steps] == [1, 2, 3]
    assert [s["ended_by"] for s in steps] == ["manual", "manual", "manual"]


def test_an_evaluation_pass_between_epochs_is_not_a_step_and_its_loader_is_an_evaluation_loader():
    sm, rec = machine()
    sm.optimizers_known = 1
    t = train_iteration(sm, 0.0)
    t = train_iteration(sm, t)
    # evaluation: three batches of loader 2, each evaluated
    sm.pass_started(2)
    for _ in range(3):
        sm.before_fetch(t)
        sm.fetched(2, t, 0.004)
        t += 0.004
        assert sm.eval_forward(t, 0.006, "e1", 16, None)
        t += 0.006
    sm.pass_ended(2)
    sm.pass_started(1)
    t = train_iteration(sm, t)
    sm.finish(t)
    steps = rec.of(E.STEP)
    (ev,) = rec.of(E.EVALUATION)
    assert [s["index"] for s in steps] == [1, 2, 3]
    assert ev["forwards"] == 3 and ev["batches"] == 3 and ev["loaders"] == [2] and ev["after_step"] == 2
    assert ev["data_wait_s"] == pytest.approx(0.012) and ev["time_s"] == pytest.approx(0.030)
    assert steps[2]["data_s"] == pytest.approx(0.010)     # the third step's data is its own batch only
    assert sm.loaders[2]["role"] == "eval" and sm.loaders[1]["role"] == "train"
    es = rec.of(E.EVAL_STEP)
    assert [e["index"] for e in es] == [1, 2, 3]
    assert all(e["forwards"] == 1 and e["samples"] == 16 for e in es)
    for e in es:
        parts = e["data_s"] + e["h2d_s"] + e["forward_s"] + e["other_s"]
        assert parts == pytest.approx(e["total_s"])


def test_a_teacher_forward_inside_the_step_is_its_eval_time():
    sm, rec = machine()
    sm.optimizers_known = 1
    sm.before_fetch(0.0)
    sm.fetched(1, 0.0, 0.001)
    sm.training_forward(0.001, 0.003, "student")
    assert sm.eval_forward(0.003, 0.002, "teacher") is False
    sm.backward(0.005, 0.007)
    sm.optimizer_stepped("opt", 0.007, 0.008)
    (s,) = rec.of(E.STEP)
    assert s["extra"]["eval_s"] == pytest.approx(0.002)
    assert rec.of(E.EVALUATION) == []


def test_evaluation_only_run_makes_evaluation_steps_and_no_training_step():
    sm, rec = machine(optimizers=0, optimizer_alive=False)
    t = 0.0
    for _ in range(4):
        sm.fetched(1, t, 0.002)
        t += 0.002
        sm.eval_forward(t, 0.005, "e1", 32, None)
        t += 0.005
    sm.finish(t)
    assert rec.of(E.STEP) == []
    assert len(rec.of(E.EVAL_STEP)) == 4
    assert sm.evaluation_only()
    assert rec.first == 0


def test_pre_forward_gap_is_the_main_threads_own_batch_building():
    sm, rec = machine()
    sm.optimizers_known = 1
    t = train_iteration(sm, 0.0)
    # no DataLoader: the script builds its batch by hand for 4 ms, then trains
    step = sm.training_forward(t + 0.004, t + 0.006, "s1")
    assert step.extra["pre_forward_s"] == pytest.approx(0.004)


def test_reset_starts_again_from_nothing():
    sm, rec = machine()
    sm.optimizers_known = 1
    train_iteration(sm, 0.0)
    sm.reset(5.0)
    assert sm.done == 0 and sm.current is None and sm.t0 == 5.0 and sm.listener is rec
    assert 1 in sm.loaders
