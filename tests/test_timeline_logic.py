"""The device timeline on a scripted CUDA stream: lazy resolution, the ring, and idle measured in
the async cases (hidden / exposed data wait, a per-step .item(), pageable copies, eval between steps)."""
from __future__ import annotations

import pytest

from diag.probe.timeline import TimelineProbe, TimelineRecorder, enabled_by_env
from diag.timeline import data_wait, summarize

from timeline_support import LoopSim, ScriptedClock, run_loop

FWD, BWD, OPT = 0.030, 0.030, 0.005      # GPU seconds per phase


def _train(sim, data_s=0.0, h2d=None, item=False, after=0.0, eval_s=None):
    if data_s is not None:
        sim.data(data_s)
    if h2d is not None:
        sim.h2d(h2d, pageable=True)
    sim.forward(FWD)
    sim.backward(BWD)
    sim.optimizer(OPT)
    if item:
        sim.item()
    if after:
        sim.python(after)
    if eval_s:
        sim.eval_pass(eval_s)


def _steps(sim):
    return [e["value"] for e in sim.timeline_events() if e["path"] == "timeline.steps"]


def test_hidden_data_wait_shows_no_gpu_idle():
    # no per-step sync: the host fetches the next batch while the GPU still runs the last step
    sim = run_loop(30, lambda s, i: _train(s, data_s=0.020))
    ev = sim.evidence(num_workers=4)
    r = ev.primary
    host = data_wait(r)
    assert r.timeline.clock == "device"
    assert host.clock == "device"
    # on the host clock the wait dominates (the host runs ahead and waits for data every step)...
    assert host.host_share > 0.5
    # ...on the device it is hidden behind queued kernels
    assert host.share < 0.01
    assert host.hidden(0.10)
    s = summarize(r)
    assert s.idle_share < 0.02
    assert sim.ctx.errors == []


def test_exposed_data_wait_is_gpu_idle_attributed_to_data():
    sim = run_loop(30, lambda s, i: _train(s, data_s=0.050, item=True))
    r = sim.evidence().primary
    s = summarize(r)
    # per step: 50 ms idle waiting for data against 65 ms of kernels
    expected = 0.050 / (0.050 + FWD + BWD + OPT)
    assert s.causes["data"] == pytest.approx(expected, abs=0.03)
    assert s.idle_share >= s.causes["data"]
    assert s.busy_s / s.steps == pytest.approx(FWD + BWD + OPT, rel=0.05)
    assert "waiting for data" in s.headline()
    dw = data_wait(r)
    assert dw.clock == "device" and not dw.hidden(0.10)


def test_item_sync_every_step_exposes_the_python_after_it():
    body = lambda s, i: _train(s, data_s=0.0, item=True, after=0.020)   # noqa: E731  logging after .item()
    sim = run_loop(20, body)
    with_sync = summarize(sim.evidence(sync_per_step=1).primary)
    assert with_sync.causes["sync"] == pytest.approx(0.020 / (0.020 + FWD + BWD + OPT), abs=0.03)
    assert with_sync.causes["host"] == 0.0
    without = summarize(sim.evidence().primary)          # no sync located: Python overhead
    assert without.causes["host"] == pytest.approx(with_sync.causes["sync"])
    # the same logging without the sync is hidden behind the queue
    hidden = summarize(run_loop(20, lambda s, i: _train(s, data_s=0.0, after=0.020)).evidence().primary)
    assert hidden.idle_share < 0.02


def test_pageable_copies_are_idle_time_for_compute():
    sim = run_loop(20, lambda s, i: _train(s, data_s=0.001, h2d=0.008, item=True))
    s = summarize(sim.evidence().primary)
    assert s.causes["h2d"] == pytest.approx(0.008 / (0.001 + 0.008 + FWD + BWD + OPT), abs=0.02)
    phases = _steps(sim)[-1]["phases"]
    assert phases["h2d"] == pytest.approx(0.008, abs=1e-4)
    assert "forward" in phases and "backward" in phases and "optimizer" in phases


def test_eval_between_steps_is_busy_eval_not_idle():
    def body(s, i):
        _train(s, data_s=0.001, item=True, eval_s=0.050 if i % 5 == 4 else None)
    sim = run_loop(25, body)
    steps = _steps(sim)
    evals = [st for st in steps if "eval" in st["phases"]]
    assert len(evals) == 4                 # the steps after each eval pass (the last pass has no next step)
    for st in evals:
        assert st["phases"]["eval"] == pytest.approx(0.050, abs=0.003)
        assert st["idle"].get("between", 0.0) == 0.0
    s = summarize(sim.evidence().primary)
    assert s.eval_share > 0.05
    assert s.causes["eval"] < 0.01         # the pass kept the GPU busy: evaluation, not idle
    assert "evaluation" in s.headline()


def test_idle_during_an_eval_pass_is_attributed_to_evaluation():
    # every 5th step an evaluation pass over a loader: 6 batches, each a 15 ms host fetch, a 5 ms
    # forward and an .item(): the GPU idles in the fetches, and that idle is evaluation's, not the
    # training data wait's nor Python's between steps
    def body(s, i):
        _train(s, data_s=0.002, item=True)
        if i % 5 == 4:
            s.eval_pass(0.030, batches=6, wait_s=0.015, item=True)
    sim = run_loop(30, body)
    r = sim.evidence().primary
    s = summarize(r)
    after = [st for st in _steps(sim) if st["index"] % 5 == 1 and st["index"] > 1]
    assert after
    for st in after:
        assert st["idle"]["eval"] == pytest.approx(6 * 0.015 + 0.001 + 0.001 * 6, abs=0.006)
        assert st["phases"]["eval"] > st["idle"]["eval"] + 0.025      # its forwards: busy evaluation
        assert st["idle"].get("data", 0.0) == pytest.approx(0.002, abs=1e-4)   # the training batch only
    plain = summarize(run_loop(30, lambda s, i: _train(s, data_s=0.002, item=True)).evidence().primary)
    assert s.causes["data"] == pytest.approx(plain.causes["data"], rel=0.25)
    assert s.causes["host"] == pytest.approx(plain.causes["host"], abs=0.01)
    assert s.causes["eval"] > 0.10 and s.eval_share > s.causes["eval"]
    assert "during evaluation" in s.headline()
    # no data stall from the evaluation loader: the training data share stays the training batch's
    dw = data_wait(r)
    assert dw.share < 0.05


def test_checkpoint_between_steps_is_attributed_to_checkpointing():
    # no per-step sync (hidden Python), but torch.save every 5th step: its D2H copies drain the
    # queue, and the serialisation after leaves the GPU idle
    def body(s, i):
        _train(s, data_s=0.002)
        if i % 5 == 4:
            s.ckpt(0.200)
    sim = run_loop(30, body)
    s = summarize(sim.evidence().primary)
    ck = [st for st in _steps(sim) if "ckpt" in st["idle"]]
    assert len(ck) == 5                    # the steps after each save (the last save has no next step)
    for st in ck:
        assert st["idle"]["ckpt"] == pytest.approx(0.200, abs=0.002)
        assert st["idle"].get("between", 0.0) < 0.002
    assert s.causes["checkpoint"] > 0.15
    assert s.causes["host"] < 0.01 and s.causes["sync"] == 0.0
    assert s.headline().endswith("checkpointing")


def test_checkpoint_without_a_cuda_model_is_not_marked():
    sim = LoopSim()
    sim.ext._on = False
    n = sim.clock.recorded
    sim.ckpt(0.01)
    assert sim.clock.recorded == n and sim.ext._ckpt_depth == 0
    sim.ext._on = True
    tok = sim.ext._ckpt_start()
    inner = sim.ext._ckpt_start()           # safetensors' save_model calling save_file: one interval
    assert tok is True and inner is False
    sim.ext._ckpt_end(inner)
    sim.ext._ckpt_end(tok)
    assert sim.ext._ckpt_depth == 0 and sim.clock.recorded == n + 2
    sim.finish()


def test_pageable_and_pinned_copies_are_told_apart():
    mb = 1 << 20
    pageable = run_loop(20, lambda s, i: _train(s, data_s=0.001, h2d=0.008))
    pinned = run_loop(20, lambda s, i: (s.data(0.001), s.h2d(0.002, pageable=False, nbytes=16 * mb),
                                         s.forward(FWD), s.backward(BWD), s.optimizer(OPT)))
    a = summarize(pageable.evidence().primary)
    b = summarize(pinned.evidence().primary)
    assert a.causes["h2d"] > 0.08 and a.causes["h2d_pinned"] == 0.0
    assert b.causes["h2d"] == 0.0
    # a pinned copy on the training stream: the stream copies instead of computing (2 ms a step)
    assert b.causes["h2d_pinned"] == pytest.approx(0.002 / (0.002 + FWD + BWD + OPT), abs=0.01)
    assert b.copies.pinned_n == b.copies.steps and b.copies.pinned_bytes == 16 * mb * b.copies.steps
    d = b.copies.as_dict()
    assert d["pinned"]["bytes_per_step"] == 16 * mb and d["pinned"]["gb_per_s"] == pytest.approx(16 * mb / 0.002 / 1e9,
                                                                                                  rel=0.02)
    assert d["pageable"]["copies_per_step"] == 0
    st = _steps(pinned)[-1]
    assert st["copies"] == {"watched": True, "pageable_n": 0, "pageable_bytes": 0, "pinned_n": 1,
                            "pinned_bytes": 16 * mb}
    assert b.headline().endswith("in host-to-device copies from pinned memory")


def test_copies_are_measured_over_the_copy_window_only():
    # the perf extension watches copies in a window of steps: outside it no copy is marked, and its
    # time falls in the forward interval; the copy shares come from the window's steps
    sim = LoopSim(watch=False)
    for i in range(30):
        sim.watch["on"] = 5 <= i < 15
        sim.data(0.001)
        if sim.watch["on"]:
            sim.h2d(0.008)
        else:                           # the same copy, unseen
            sim.clock.sync()
            sim.clock.launch(0.008)
            sim.clock.sync()
        sim.forward(FWD)
        sim.backward(BWD)
        sim.optimizer(OPT)
    sim.finish()
    s = summarize(sim.evidence().primary)
    watched = [st for st in _steps(sim) if "copies" in st]
    assert 8 <= len(watched) <= 10 and s.copies.steps == len(watched)
    assert s.causes["h2d"] == pytest.approx(0.008 / (0.001 + 0.008 + FWD + BWD + OPT), abs=0.02)
    state = [e["value"] for e in sim.timeline_events() if e["path"] == "timeline"][-1]
    assert state["copies"]["steps"] == len(watched) and state["copies"]["pageable"]["n"] == len(watched)
    assert "window" in state["copies"]["window"]


def test_steps_resolve_lazily_when_their_events_complete(monkeypatch):
    from diag.probe import timeline

    monkeypatch.setattr(timeline, "POLL_EVERY", 1)     # resolve at every step's end (batching: below)
    clock = ScriptedClock()
    sim = LoopSim(clock)
    # the GPU is far behind the host: nothing resolves while it is
    for _ in range(5):
        _train(sim, data_s=0.0)
    assert _steps(sim) == []
    assert len(sim.ext.rec.ring) == 5
    clock.cpu(0.070)            # the GPU finishes the first step only
    _train(sim, data_s=0.0)
    done = _steps(sim)
    assert [d["index"] for d in done] == [1]
    sim.finish()                # the end of the run resolves the rest
    assert [d["index"] for d in _steps(sim)] == list(range(1, 7))
    assert sim.ext.rec.dropped == 0 and not sim.ext.rec.ring


def test_steps_resolve_in_batches_with_the_same_records(monkeypatch):
    """issue 20: resolving every POLL_EVERY steps (and steps 1-2, and at the end) gives the records
    resolving every step gives, written at the batch's step."""
    from diag.probe import timeline

    def records(every):
        monkeypatch.setattr(timeline, "POLL_EVERY", every)
        sim = LoopSim(ScriptedClock())
        seen_at = {}
        for i in range(1, 21):
            _train(sim, data_s=0.002 if i % 3 else 0.030, item=True)   # the host syncs: steps complete
            for d in _steps(sim):
                seen_at.setdefault(d["index"], i)
        sim.finish()
        return _steps(sim), seen_at

    batch = timeline.POLL_EVERY
    assert batch == 8
    every, _ = records(1)
    batched, seen_at = records(batch)
    assert batched == every and [d["index"] for d in batched] == list(range(1, 21))
    # a step completes on the device after its own end (here at the host's sync): it resolves at the
    # next batch
    assert {seen_at[i] for i in range(3, 8)} == {8} and {seen_at[i] for i in range(8, 16)} == {16}
    assert seen_at[2] == 8 and 16 not in seen_at          # the rest: at the end

    # long steps (here 1.1 s of host work each) resolve at every step: the TUI's device view stays live
    monkeypatch.setattr(timeline, "POLL_EVERY", batch)
    sim = LoopSim(ScriptedClock())
    for i in range(1, 7):
        _train(sim, data_s=0.002, item=True, after=1.1)
        assert [d["index"] for d in _steps(sim)] == list(range(1, i))


def test_ring_overflow_drops_the_oldest_and_counts_them():
    sim = LoopSim(ring=4)
    for _ in range(10):
        _train(sim, data_s=0.0)          # host far ahead, no step completes
    rec = sim.ext.rec
    assert len(rec.ring) == 4 and rec.dropped == 6
    sim.finish()
    idx = [d["index"] for d in _steps(sim)]
    assert idx == [7, 8, 9, 10]
    state = [e["value"] for e in sim.timeline_events() if e["path"] == "timeline"][-1]
    assert state["dropped"] == 6 and state["resolved"] == 4 and state["pending"] == 0


def test_device_span_adds_up_to_busy_plus_idle():
    sim = run_loop(10, lambda s, i: _train(s, data_s=0.010, h2d=0.002, item=True, after=0.003))
    for st in _steps(sim)[1:]:
        assert st["busy_s"] + st["idle_s"] == pytest.approx(st["device_s"], abs=1e-6)
        assert sum(st["phases"].values()) == pytest.approx(st["device_s"], abs=1e-6)
        assert st["host"]["data_s"] == pytest.approx(0.010)


def test_marks_are_bounded_per_step():
    rec = TimelineRecorder(ScriptedClock())
    for _ in range(1000):
        rec.mark("h2d_start")
    rec.end_step(1)
    assert len(rec.ring[0].marks) <= 64
    assert rec.ring[0].marks[-1][0] == "step_end"


def test_cpu_machine_never_installs_the_timeline(monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")

    class Ctx:
        disabled = []

        def disable(self, ext):
            self.disabled.append(ext)

    ctx = Ctx()
    ext = TimelineProbe()
    ext.install(ctx)
    assert ctx.disabled == [ext] and ext.rec is None


def test_switched_off_by_env(monkeypatch):
    monkeypatch.setenv("DIAG_TIMELINE", "0")
    assert not enabled_by_env()

    class Ctx:
        disabled = []

        def disable(self, ext):
            self.disabled.append(ext)

    ext = TimelineProbe(clock=ScriptedClock())
    ctx = Ctx()
    ext.install(ctx)
    assert ctx.disabled == [ext]
    monkeypatch.setenv("DIAG_TIMELINE", "1")
    assert enabled_by_env()


class PoolClock(ScriptedClock):
    """Reuses released events the way CudaClock does (re-recording overwrites their time)."""

    def __init__(self):
        super().__init__()
        self.free = []
        self.created = 0

    def record(self):
        if self.free:
            e = self.free.pop()
            fresh = super().record()
            e.t = fresh.t
            return e
        self.created += 1
        return super().record()

    def release(self, e):
        self.free.append(e)


def test_reused_events_give_the_same_timeline():
    def body(s, i):
        _train(s, data_s=0.004 * (i % 3), h2d=0.002, item=i % 2 == 0, after=0.001,
               eval_s=0.01 if i % 7 == 6 else None)
        if i % 4 == 0:
            s.clock.cpu(0.2)        # let the GPU catch up now and then: steps resolve in batches
    plain = run_loop(40, body)
    pooled = run_loop(40, body, clock=PoolClock())
    assert _steps(pooled) == _steps(plain)
    assert pooled.clock.created < plain.clock.recorded / 3      # most events were reused


class CapturingClock(ScriptedClock):
    """No event can be recorded while ``capturing`` (as during a CUDA graph capture)."""

    capturing = False

    def record(self):
        return None if self.capturing else super().record()


def test_steps_inside_a_graph_capture_are_skipped_without_harm():
    clock = CapturingClock()

    def body(s, i):
        clock.capturing = i in (3, 4)          # two whole steps captured
        _train(s, data_s=0.002, item=True)
        clock.capturing = False

    sim = run_loop(10, body, clock=clock)
    idx = [d["index"] for d in _steps(sim)]
    assert 4 not in idx and 5 not in idx and len(idx) == 8
    assert sim.ctx.errors == []


def test_copies_from_another_thread_are_not_marked():
    import threading

    sim = LoopSim()
    before = sim.clock.recorded
    t = threading.Thread(target=sim.ext._on_copy, args=("start",))
    t.start()
    t.join()
    assert sim.clock.recorded == before
    sim.ext._on_copy("start")
    assert sim.clock.recorded == before + 1
    sim.finish()


def test_checkpoint_in_a_forward_first_loop():
    # no DataLoader (batches already on the GPU): the step's first mark comes after its forward was
    # queued; the save before it is idle, the forward after it is not
    def body(s, i):
        s.forward(FWD)
        s.backward(BWD)
        s.optimizer(OPT)
        if i % 5 == 4:
            s.ckpt(0.100)
    sim = run_loop(30, body)
    s = summarize(sim.evidence().primary)
    for st in _steps(sim):
        if "ckpt" in st["idle"]:
            assert st["idle"]["ckpt"] == pytest.approx(0.100, abs=0.002)
            assert st["idle"].get("between", 0.0) < 0.002
            assert st["busy_s"] == pytest.approx(FWD + BWD + OPT, abs=0.003)
    assert s.causes["checkpoint"] > 0.15 and s.causes["host"] < 0.01


def test_eval_loader_pass_in_a_forward_first_loop():
    # batches already on the GPU (no training loader), an evaluation pass over a loader every 5th
    # step: its fetches are evaluation's idle; the training forward after its StopIteration is busy
    def body(s, i):
        s.forward(FWD)
        s.backward(BWD)
        s.optimizer(OPT)
        if i % 5 == 4:
            s.eval_pass(0.020, batches=4, wait_s=0.010, item=True)
    sim = run_loop(30, body)
    after = [st for st in _steps(sim) if "eval" in st["phases"]]
    assert len(after) == 5
    for st in after:
        # the first fetch is hidden behind the step's kernels; the 3 after an .item() are exposed
        assert st["idle"]["eval"] == pytest.approx(3 * 0.010, abs=0.002)
        assert st["busy_s"] >= FWD + BWD + OPT + 0.020 - 0.003        # training kernels and the pass's
        assert "data" not in st["idle"]
    s = summarize(sim.evidence().primary)
    assert s.causes["data"] == 0.0 and s.causes["eval"] > 0.05


class _FakeCuda:
    """The slice of torch.cuda CudaClock uses: events, the current stream, graph capture."""

    class Event:
        made = 0

        def __init__(self, enable_timing=False):
            assert enable_timing
            _FakeCuda.Event.made += 1
            self.recorded = 0

        def record(self, stream=None):
            self.recorded += 1
            self.stream = stream

    def __init__(self):
        self.stream = "default"
        self.capturing = False
        self.made = 0               # Stream objects made (torch.cuda.current_stream() calls)

    def current_stream(self):
        self.made += 1
        return f"Stream({self.stream})"

    def is_current_stream_capturing(self):
        return self.capturing


def test_cuda_clock_knows_the_training_stream_and_skips_side_stream_copies():
    from types import SimpleNamespace

    from diag.probe.timeline import CudaClock

    for with_keys in (True, False):             # torch's C calls for the stream's key, or not (another torch)
        cuda = _FakeCuda()
        C = SimpleNamespace(_cuda_getDevice=lambda: 0, _cuda_getCurrentStream=lambda dev: (cuda.stream, dev, 1))
        clock = CudaClock(SimpleNamespace(cuda=cuda, _C=C) if with_keys else SimpleNamespace(cuda=cuda))
        assert clock.same_stream()                 # nothing recorded yet
        e = clock.record()
        assert e.recorded == 1 and e.stream == "Stream(default)" and clock.same_stream()
        cuda.stream = "prefetcher"
        assert not clock.same_stream()
        f = clock.record()
        assert f.stream == "Stream(prefetcher)"     # recorded on the stream current at the mark
        cuda.capturing = True
        assert clock.record() is None               # no event inside a CUDA graph capture
        cuda.capturing = False
        clock.release(e)
        made = _FakeCuda.Event.made
        assert clock.record() is e and _FakeCuda.Event.made == made     # reused from the pool
        cuda.stream = "default"
        streams = cuda.made
        for _ in range(10):
            clock.record()
            clock.same_stream()
        # with the key, a Stream object is made once per stream, not per mark (issue 20)
        assert cuda.made - streams == (0 if with_keys else 20)

    # the probe: a copy made while a side stream is current is neither marked nor counted
    sim = LoopSim()
    sim.clock.same_stream = lambda: False
    n = sim.clock.recorded
    sim.ext._on_copy("start", None)
    sim.ext._on_copy("end", None)
    assert sim.clock.recorded == n and (sim.ext.rec.current is None or sim.ext.rec.current.copies is None)
    sim.finish()
