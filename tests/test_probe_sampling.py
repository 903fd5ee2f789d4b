"""The probe's extensions do their per-step extras on sampled steps only (issue 28 cost budget): the
device timeline (diag/probe/timeline.py, on the scripted CUDA clock of tests/timeline_support.py) and
the allocator reads (diag/probe/memory.py, a scripted allocator). On an unsampled step they record
nothing; a sampled step after unsampled ones is measured as in a fully sampled run; the judgement over
sampled steps matches the one over every step; the reports say the rate.

The protocol (what the probe does, diag/probe/core.py): ``ctx.sampled`` is the step in progress's
flag, and before the extensions' ``on_step_end(k)`` it already holds step k+1's; the step event says
step k's as ``"sampled": False`` (absent: sampled)."""
from __future__ import annotations

import pytest
from timeline_support import LoopSim

from diag.timeline import summarize


def _sampled(i: int) -> bool:
    return i <= 4 or i % 4 == 0


class SampledLoop(LoopSim):
    """LoopSim with the probe's sampling protocol (``protocol=False``: a probe that updates
    ctx.sampled only after on_step_end)."""

    def __init__(self, rule=_sampled, protocol: bool = True, **kw):
        super().__init__(**kw)
        self.rule = rule
        self.protocol = protocol
        self.ctx.sampled = rule(1)
        self.ctx.steps_done = 0
        self.records_at: dict[int, int] = {}      # step -> clock.record() calls during it

    def optimizer(self, gpu_s: float, host_s: float = 0.0002) -> None:
        ext, ctx = self.ext, self.ctx
        ext.on_optimizer_step(ctx, None)
        self.clock.cpu(host_s)
        self.clock.launch(gpu_s)
        end = self.clock.host
        k = self.index
        ev = {"index": k, "total_s": end - self.step_start, "data_s": self.data_s, "forward_s": 0.0,
              "backward_s": 0.0, "optimizer_s": host_s, "other_s": 0.0, "n_forward": 1, "n_backward": 1,
              "samples": 32, "extra": {}, "instrumented": False}
        if not self.rule(k):
            ev["sampled"] = False
        if self.protocol:
            ctx.sampled = self.rule(k + 1)
        ctx.steps_done = k
        ext.on_step_end(ctx, ev)
        if not self.protocol:
            ctx.sampled = self.rule(k + 1)
        ev = dict(ev)
        ev.update(kind="step", rank=0, t=end)
        self.step_events.append(ev)
        self.open = False
        self.step_start = end
        self.data_s = 0.0



def _train(s, data_s=0.004, fwd=0.004, bwd=0.008, opt=0.001, item=False, py=0.0005):
    s.data(data_s)
    s.h2d(0.0002, pageable=False)
    s.forward(fwd)
    s.backward(bwd)
    s.optimizer(opt)
    if item:
        s.item()
    s.python(py)


def _run(sim, n=40, **kw):
    records = []
    orig = sim.clock.record

    def record():
        records.append(getattr(sim.ctx, "steps_done", None))    # the steps closed when it was recorded
        return orig()

    sim.clock.record = record
    sim.ext.rec.clock = sim.clock
    for i in range(n):
        _train(sim, **kw)
    sim.finish()
    return records


def _tl_steps(sim):
    return {e["value"]["index"]: e["value"] for e in sim.timeline_events() if e.get("path") == "timeline.steps"}


@pytest.mark.parametrize("item", [False, True])
def test_sampled_steps_are_timed_as_in_a_fully_sampled_run(item):
    full, part = LoopSim(), SampledLoop()
    _run(full, item=item)
    rec = _run(part, item=item)
    fs, ps = _tl_steps(full), _tl_steps(part)
    assert sorted(ps) == [i for i in range(1, 41) if _sampled(i)]
    for i, r in ps.items():
        f = fs[i]
        assert r["device_s"] == pytest.approx(f["device_s"], rel=1e-6, abs=1e-9), i
        assert r["idle"] == pytest.approx(f["idle"], rel=1e-6, abs=1e-9), i
        assert r["phases"] == pytest.approx(f["phases"], rel=1e-6, abs=1e-9), i
    # nothing is recorded but the sampled steps' marks and, at the close of an unsampled step before a
    # sampled one, one mark for its gap; a run of unsampled steps records nothing at all
    ends = sum(1 for i in range(5, 40) if not _sampled(i) and _sampled(i + 1))
    assert len(rec) == sum(r["marks"] for r in ps.values()) + ends
    for i in range(5, 41):
        if not _sampled(i) and not _sampled(i - 1):
            assert rec.count(i - 1) == 0, (i, rec.count(i - 1))      # from step i-1's close to step i's
    # the judgement over the sampled steps is the judgement over every step (a steady loop)
    a, b = summarize(full.evidence().primary), summarize(part.evidence().primary)
    assert a is not None and b is not None and b.steps < a.steps
    assert b.idle_share == pytest.approx(a.idle_share, rel=0.02, abs=0.002)
    assert b.causes["sync" if item else "host"] == pytest.approx(a.causes["sync" if item else "host"], rel=0.02,
                                                                 abs=0.002)
    state = [e["value"] for e in part.timeline_events() if e.get("path") == "timeline" and e["kind"] == "merge"][-1]
    assert state["unsampled"] == sum(1 for i in range(1, 41) if not _sampled(i))


def test_a_probe_that_sets_the_flag_late_never_measures_across_unsampled_steps():
    # ctx.sampled still this step's in on_step_end: no end mark for the gap; the next sampled step is
    # measured from its own first mark, never from a mark steps before
    full, part = LoopSim(), SampledLoop(protocol=False)
    _run(full, item=True)
    _run(part, item=True)
    fs, ps = _tl_steps(full), _tl_steps(part)
    assert sorted(ps) == [i for i in range(1, 41) if _sampled(i)]
    for i, r in ps.items():
        assert r["device_s"] <= fs[i]["device_s"] * 1.0001, i
        if i > 4 and not _sampled(i - 1):
            assert "between" not in r["idle"], i         # that gap was not measured


def test_every_step_sampled_keeps_the_old_records():
    full, same = LoopSim(), SampledLoop(rule=lambda i: True)
    _run(full)
    _run(same)
    assert _tl_steps(full) == _tl_steps(same)


def test_the_allocator_is_read_on_sampled_steps_only(monkeypatch):
    import torch

    from diag.probe import memory as pm

    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda dev: {
        "allocated_bytes": {"all": {"current": 1 << 30, "peak": 1 << 31}},
        "reserved_bytes": {"all": {"current": 1 << 31, "peak": 1 << 31}}})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda dev: type(
        "P", (), {"name": "scripted GPU", "total_memory": 80 << 30, "major": 9, "minor": 0})())

    class Probe:
        rank, events, steps_done = 0, [], 0

        def emit(self, kind, **data):
            self.events.append((data["path"], data["value"]))

        def last_model(self):
            return torch.nn.Linear(2, 2)

    def sampled(i):
        return i <= 10 or (i - 10) % 8 == 0

    mp, p = pm.MemoryProbe(), Probe()
    mp._cuda_dev, mp._cuda_available = torch.device("cuda", 0), True
    for i in range(1, 121):
        p.steps_done = i
        ev = {"index": i}
        if not sampled(i):
            ev["sampled"] = False
        mp.on_step_end(p, ev)
    mp.on_exit(p, "completed")
    steps = [v["step"] for path, v in p.events if path == "memory.steps"]
    assert all(sampled(s) for s in steps[:-1]) and steps[-1] == 120
    # every sampled step up to 50, then one at least 10 steps after the last read, then the last step
    assert steps == [i for i in range(1, 51) if sampled(i)] + [66, 82, 98, 114, 120]


def test_the_reports_say_the_rate():
    from diag.evidence import Evidence
    from diag.evidence import events as E
    from diag.fold import fold
    from diag.report.console import run_header
    from diag.report.html import render_html

    ev = Evidence()
    ev.run.status = "completed"
    for i in range(1, 81):
        d = {"kind": E.STEP, "rank": 0, "t": i * 0.01, "index": i, "total_s": 0.01, "forward_s": 0.004,
             "backward_s": 0.004, "other_s": 0.002}
        if i > 10 and (i - 10) % 8:
            d["sampled"] = False
        fold(ev, d)
    fold(ev, {"kind": E.PROBE_SAMPLING, "rank": 0, "t": 0.1, "step": 11, "period": 8, "budget": 0.01, "first": 10,
              "step_s": 0.01, "core_s": 5e-5, "extras_s": 2e-4, "reason": "extras 200 µs"})
    text = run_header(ev).plain
    assert "ran on 1 step in 8 (18 of 80 steps; probe budget 1% of the step)" in text
    html = render_html(ev, [], 0)
    assert 'id="probe-sampling"' in html and "1 step in 8" in html
    from types import SimpleNamespace

    from diag.tui.widgets import UIState
    from diag.tui.widgets.header import header_lines

    _one, two = header_lines(UIState(snapshot=SimpleNamespace(evidence=ev, findings=[])))
    assert "timeline & memory on 1 step in 8" in two.plain


def test_the_extensions_say_they_honour_the_budget_only_where_they_have_extras():
    """The probe runs its budget while an extension with SAMPLED_EXTRAS is live: the timeline always
    (it is removed at install without CUDA), the memory probe only with a CUDA build of torch (this machine: not)."""
    import torch

    from diag.probe.memory import MemoryProbe
    from diag.probe.timeline import TimelineProbe

    class Ctx:
        def idle(self, ext, method):
            pass

    assert TimelineProbe.SAMPLED_EXTRAS is True
    mp = MemoryProbe()
    mp.install(Ctx())
    assert mp.SAMPLED_EXTRAS is bool(torch.cuda._is_compiled())      # this CPU build: False
