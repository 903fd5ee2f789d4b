"""A scripted CUDA stream for the device-timeline tests: one host clock, one in-order stream.

``ScriptedClock`` implements the timeline's clock interface (``record``, ``query``, ``elapsed_ms``,
``now``) with CUDA's semantics: an event completes when the stream reaches it (every kernel queued
before it has run); kernels start when both the host launched them and the stream is free; a host
sync waits for the stream's tail. ``LoopSim`` drives a real :class:`diag.probe.timeline.TimelineProbe`
through the hooks the probe would call in a training loop, and produces the events a CUDA run writes
(the probe's step events with host-clock phases, and the timeline's own events), folded into Evidence
with diag's real fold.
"""
from __future__ import annotations

from diag.evidence import Evidence
from diag.fold import fold
from diag.probe.timeline import TimelineProbe
from diag.testing import EvidenceBuilder


class _Event:
    __slots__ = ("t",)

    def __init__(self, t: float):
        self.t = t


class Src:
    """A CPU tensor as the copy listener sees it (pinned or not, its size)."""

    def __init__(self, pinned: bool, nbytes: int):
        self.pinned, self.nbytes = pinned, nbytes

    def is_pinned(self) -> bool:
        return self.pinned

    def numel(self) -> int:
        return self.nbytes // 4

    def element_size(self) -> int:
        return 4


class ScriptedClock:
    """Host time and one stream, in seconds (events report milliseconds, as CUDA's do)."""

    def __init__(self, launch_s: float = 5e-6):
        self.host = 100.0          # host perf_counter
        self.tail = 0.0            # when the stream finishes everything queued so far
        self.launch_s = launch_s
        self.busy = 0.0            # kernel seconds run (the truth the timeline must recover)
        self.recorded = 0

    # the timeline's clock interface
    def now(self) -> float:
        return self.host

    def record(self) -> _Event:
        self.recorded += 1
        t = max(self.host + self.launch_s, self.tail)
        self.tail = t
        return _Event(t)

    def query(self, e: _Event) -> bool:
        return e.t <= self.host

    def elapsed_ms(self, a: _Event, b: _Event) -> float:
        if not (self.query(a) and self.query(b)):
            raise RuntimeError("elapsed_time on an event that has not completed")   # as CUDA refuses
        return (b.t - a.t) * 1e3

    # the script
    def cpu(self, s: float) -> None:
        self.host += s

    def launch(self, kernel_s: float) -> None:
        self.host += self.launch_s
        start = max(self.host, self.tail)
        self.tail = start + kernel_s
        self.busy += kernel_s

    def sync(self) -> None:
        self.host = max(self.host, self.tail)


class _Ctx:
    """The slice of ProbeContext the timeline uses, recording what it emits."""

    def __init__(self, clock: ScriptedClock):
        self.clock = clock
        self.events: list[dict] = []
        self.forward_start = 0.0
        self._eval_passes = 0        # the step model's evaluation passes (diag.probe.steps), as the probe has them
        self._last_boundary = None
        self.disabled = []
        self.errors = []

    def emit(self, kind, **data):
        data.update(kind=kind, rank=0, t=self.clock.host)
        self.events.append(data)

    def is_live(self):
        return True

    def disable(self, ext):
        self.disabled.append(ext)

    def report_error(self, where, e):
        self.errors.append((where, e))


class LoopSim:
    """One training loop: ``data`` / ``h2d`` / ``forward`` / ``backward`` / ``optimizer`` / ``item`` /
    ``python`` / ``eval_pass``, in the order the script does them."""

    def __init__(self, clock: ScriptedClock | None = None, ring: int | None = None, watch: bool = True):
        self.clock = clock or ScriptedClock()
        self.ext = TimelineProbe(clock=self.clock)
        self.ctx = _Ctx(self.clock)
        self.ext.install(self.ctx)
        self.ext.copy_watch = self.watch = {"on": watch}   # the perf extension's copy window
        if ring is not None:
            self.ext.rec.ring_size = ring
        self.ext.on_model(self.ctx, None, {"devices": ["cuda:0"]})
        self.index = 0
        self.open = False
        self.step_start = self.clock.host
        self.data_s = 0.0
        self.step_events: list[dict] = []
        self.in_eval = False        # an evaluation pass ran since the last step (the step model's view)
        self.fetch_t = None

    def _open(self, t: float | None = None):
        if not self.open:
            if self.in_eval:
                # the step model ends the pass where the training began (the fetch, or the forward)
                self.in_eval = False
                self.ctx._eval_passes += 1
                self.ctx._last_boundary = t if t is not None else self.clock.host
            self.open = True
            self.index += 1
            self.ext.on_step_start(self.ctx, self.index)

    def data(self, wait_s: float) -> None:
        c = self.clock
        t = c.host
        self.ext.on_data(self.ctx, "start")
        c.cpu(wait_s)
        self.data_s += wait_s
        self.ext.on_data(self.ctx, "end")
        self._open(t)

    def h2d(self, copy_s: float, pageable: bool = True, nbytes: int = 1 << 20) -> None:
        src = Src(pinned=not pageable, nbytes=nbytes)
        self.ext._on_copy("start", src)
        if pageable:
            # from pageable memory CUDA first waits for the stream, stages the data, then copies;
            # the host waits for the copy (a non_blocking copy from pageable memory is synchronous)
            self.clock.sync()
            self.clock.launch(copy_s)
            self.clock.sync()
        else:                   # pinned, non_blocking: queued on the stream, the host goes on
            self.clock.launch(copy_s)
        self.ext._on_copy("end", src)

    def ckpt(self, host_s: float) -> None:
        """torch.save of the model: the D2H copies of the state sync, then the host serialises."""
        token = self.ext._ckpt_start()
        self.clock.sync()
        self.clock.cpu(host_s)
        if token is not None:
            self.ext._ckpt_end(token)

    def forward(self, gpu_s: float, host_s: float = 0.0005) -> None:
        t = self.ctx.forward_start = self.clock.host
        self.clock.cpu(host_s)
        self.clock.launch(gpu_s)
        self._open(t)
        self.ext.on_forward(self.ctx, None, (), {}, None, True)

    def backward(self, gpu_s: float, host_s: float = 0.0005) -> None:
        self.clock.cpu(host_s)
        self.clock.launch(gpu_s)

    def optimizer(self, gpu_s: float, host_s: float = 0.0002) -> None:
        self.ext.on_optimizer_step(self.ctx, None)
        self.clock.cpu(host_s)
        self.clock.launch(gpu_s)
        end = self.clock.host
        ev = {"index": self.index, "total_s": end - self.step_start, "data_s": self.data_s,
              "forward_s": 0.0, "backward_s": 0.0, "optimizer_s": host_s, "other_s": 0.0,
              "n_forward": 1, "n_backward": 1, "samples": 32, "extra": {}, "instrumented": False}
        self.ext.on_step_end(self.ctx, ev)
        ev = {k: v for k, v in ev.items()}
        ev.update(kind="step", rank=0, t=end)
        self.step_events.append(ev)
        self.open = False
        self.step_start = end
        self.data_s = 0.0

    def item(self) -> None:
        self.clock.sync()

    def python(self, s: float) -> None:
        self.clock.cpu(s)

    def eval_pass(self, gpu_s: float, host_s: float = 0.001, batches: int = 0, wait_s: float = 0.0,
                  item: bool = False) -> None:
        """An evaluation pass between two steps: without a loader (``batches=0``) one forward of
        ``gpu_s``; with one, ``batches`` fetches of ``wait_s`` each followed by a forward of
        ``gpu_s / batches`` (and ``.item()`` after each when ``item``)."""
        self.in_eval = True
        if not batches:
            self.ctx.forward_start = self.clock.host
            self.clock.cpu(host_s)
            self.clock.launch(gpu_s)
            return
        for _ in range(batches):
            self.ext.on_data(self.ctx, "start")
            self.clock.cpu(wait_s)
            self.ext.on_data(self.ctx, "end")
            self.ctx.forward_start = self.clock.host
            self.clock.cpu(host_s)
            self.clock.launch(gpu_s / batches)
            if item:
                self.clock.sync()
        self.ext.on_data(self.ctx, "start")     # the loader's StopIteration
        self.clock.cpu(host_s)

    def finish(self) -> None:
        self.clock.sync()
        self.clock.cpu(0.001)
        self.ext.on_exit(self.ctx, "completed")
        self.ext.uninstall(self.ctx)

    def timeline_events(self) -> list[dict]:
        return [e for e in self.ctx.events if e.get("path", "").startswith("timeline")]

    def evidence(self, num_workers: int = 0, sync_per_step: int | None = None) -> Evidence:
        """Evidence in the shape a CUDA run writes: a CUDA model and DataLoader (the builder), then
        the probe's step events and the timeline's events through diag's fold."""
        ev = (EvidenceBuilder().cuda_training(device="NVIDIA H200").dataloader(num_workers=num_workers, batch_size=32,
                                                                     role="train", batches=len(self.step_events))
              .environment(cpu_count=8).build())
        r = ev.primary
        r.steps.clear()
        merged = sorted(self.step_events + self.ctx.events, key=lambda e: e["t"])
        for e in merged:
            fold(ev, dict(e))
        if sync_per_step is not None:
            fold(ev, {"kind": "merge", "rank": 0, "t": 0, "path": "sync",
                      "value": {"state": "sampled", "steps": len(self.step_events), "per_step":
                                [sync_per_step] * len(self.step_events), "total": sync_per_step * len(self.step_events)}})
        return ev


def run_loop(n: int, body, **kw) -> LoopSim:
    sim = LoopSim(**kw)
    for i in range(n):
        body(sim, i)
    sim.finish()
    return sim
