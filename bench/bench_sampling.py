"""The cost budget's own cost, and what an unsampled step costs the extensions that sample (issue 28).

    .venv/bin/python bench/run.py sampling

Measures, in this process (no torch work, no GPU needed):

* ``Budget.after_step`` per call (diag/probe/budget.py: the probe calls it once a step);
* the device timeline extension's hooks of one step (two ``on_data``, ``on_step_start``, ``on_forward``,
  ``on_optimizer_step``, ``on_step_end``) on a sampled and on an unsampled step, with a clock that
  records nothing (so the figure is the extension's Python logic: on a GPU each sampled mark adds a
  CUDA event record, a few µs, and the resolution adds queries and elapsed times);
* the memory extension's ``on_step_end`` on an unsampled step (a sampled one reads the allocator:
  ~100 µs on an H200, docs/performance.md).

Each figure is the median of 7 rounds of 20,000 steps (µs per step).
"""
from __future__ import annotations

import statistics
import time


class _Clock:
    """Records nothing: the cost left is the extension's own logic."""

    def record(self):
        return object()

    def query(self, h):
        return True

    def elapsed_ms(self, a, b):
        return 0.0


class _Ctx:
    def __init__(self):
        self.sampled = True
        self.steps_done = 0
        self.forward_start = 0.0
        self.events = 0

    def emit(self, kind, **data):
        self.events += 1

    def is_live(self):
        return True

    def disable(self, ext):
        pass

    def report_error(self, where, e):
        pass


def _rounds(fn, n=20000, rounds=7) -> float:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn(n)
        out.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(out)


def run(results: dict) -> None:
    from diag.probe.budget import Budget
    from diag.probe.memory import MemoryProbe
    from diag.probe.timeline import TimelineProbe

    res = results.setdefault("sampling", {})

    b = Budget()

    def feed(n):
        for _ in range(n):
            b.after_step(0.002, 150e-6, 300e-6 if b.sampled else 0.0)
    res["budget_after_step_us"] = round(_rounds(feed), 3)

    def timeline(sampled: bool):
        ext, ctx = TimelineProbe(clock=_Clock()), _Ctx()
        ext.install(ctx)
        ext.copy_watch = {"on": False}
        ext.on_model(ctx, None, {"devices": ["cuda:0"]})
        ctx.sampled = sampled
        step = {"index": 0, "total_s": 0.002, "data_s": 0.0001, "extra": {}}
        if not sampled:
            step["sampled"] = False

        def steps(n):
            for i in range(n):
                ext.on_data(ctx, "start")
                ext.on_data(ctx, "end")
                ext.on_step_start(ctx, i + 1)
                ext.on_forward(ctx, None, (), {}, None, True)
                ext.on_optimizer_step(ctx, None)
                step["index"] = i + 1
                ctx.steps_done = i + 1
                ext.on_step_end(ctx, step)
        try:
            return _rounds(steps)
        finally:
            ext.uninstall(ctx)

    res["timeline_sampled_step_us"] = round(timeline(True), 3)
    res["timeline_unsampled_step_us"] = round(timeline(False), 3)

    mp, ctx = MemoryProbe(), _Ctx()
    mp._persistent_done = True
    mp._cuda_available = True
    step = {"index": 100, "sampled": False}

    def mem(n):
        for _ in range(n):
            mp.on_step_end(ctx, step)
    res["memory_unsampled_step_us"] = round(_rounds(mem), 3)
    for k, v in res.items():
        print(f"  {k}: {v}")


if __name__ == "__main__":
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    out: dict = {}
    run(out)
