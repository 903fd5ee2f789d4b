"""Where the probe's per-step microseconds go on a short step (issue 28, docs/performance.md): the
11-call training step of the depth sweep (nn.Sequential of Linear(32, 32) + ReLU, batch 16, SGD,
cross-entropy, a DataLoader, one intra-op thread) under the probe as ``python -m diag.probe``
installs it (default extensions, the run-tagging file sink), in steady state (after the hand-over).

Each piece of the probe's per-step path is wrapped in a ``time.perf_counter_ns`` timer (inclusive
times: a piece that calls another includes it), and the wrapper's own cost (an empty function wrapped
the same way) is subtracted. cProfile distorts functions this small too much to trust its absolute
figures; this keeps one timer pair per piece. Figures are the median call times the calls per step,
over ``--steps`` steps, and the probe's own account (``probe_s``) beside them.

    .venv/bin/python bench/step_breakdown.py [--steps 3000] [--calls 10]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

_ns = time.perf_counter_ns
ACC: dict[str, list] = {}


def timed(name: str, fn):
    acc = ACC.setdefault(name, [])
    add = acc.append

    def wrapper(*a, **k):
        t0 = _ns()
        try:
            return fn(*a, **k)
        finally:
            add(_ns() - t0)
    wrapper.__wrapped__ = fn
    return wrapper


def wrap_attr(owner, attr: str, name: str | None = None) -> None:
    setattr(owner, attr, timed(name or f"{getattr(owner, '__name__', owner)}.{attr}", getattr(owner, attr)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--noext", action="store_true", help="the probe without extensions")
    a = ap.parse_args()
    torch.set_num_threads(1)
    from diag.probe import core, stepmachine, watchdog
    from diag.probe import sink as sink_mod
    from diag.probe.extensions import load_extensions

    # the pieces (before install: the install binds some of them into closures)
    for attr in ("fwd_pre", "fwd_post", "_on_top_forward", "_opt_pre", "_opt_post", "step_closed",
                 "_account_step", "emit_dict", "_on_batch", "_on_zero_grad", "_backward_done", "_ext",
                 "step_opened"):
        if hasattr(core.Probe, attr):
            wrap_attr(core.Probe, attr, f"Probe.{attr}")
    for attr in ("close", "before_fetch", "fetched", "training_forward", "optimizer_stepped", "backward",
                 "counts_samples", "add_samples", "begin_training", "open"):
        wrap_attr(stepmachine.StepMachine, attr, f"StepMachine.{attr}")
    from diag.probe import handover
    for attr in ("_local_pre", "_local_post", "boundary"):
        wrap_attr(handover.HandOver, attr, f"HandOver.{attr}")
    wrap_attr(sink_mod.FileSink, "__call__", "FileSink.__call__")
    wrap_attr(watchdog.TaggedSink, "__call__", "TaggedSink.__call__")
    core.user_frame = timed("user_frame", core.user_frame)
    core.samples_of = timed("samples_of", core.samples_of)
    core.batch_samples = timed("batch_samples", core.batch_samples)
    empty = timed("(empty wrapped call)", lambda *a, **k: None)

    layers: list = []
    for _ in range(max(1, a.calls // 2)):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    model = nn.Sequential(*layers)
    x, y = torch.randn(16 * 400, 32), torch.randint(0, 32, (16 * 400,))
    loader = DataLoader(TensorDataset(x, y), batch_size=16, drop_last=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "events.jsonl")
        s = watchdog.TaggedSink(sink_mod.FileSink(path), path)
        s.run_id = "bench"
        probe = core.Probe(s, extensions=[] if a.noext else load_extensions(), script=__file__)
        probe.install()
        it = iter(loader)
        warm = 60
        cpu = []
        for i in range(warm + a.steps):
            if i == warm:
                for v in ACC.values():
                    v.clear()
                own0 = probe.own_cost()
            c0 = time.thread_time_ns()
            try:
                xb, yb = next(it)
            except StopIteration:
                it = iter(loader)
                xb, yb = next(it)
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            empty()
            cpu.append(time.thread_time_ns() - c0)
        own1 = probe.own_cost()
        probe.finish("completed", 0)
        probe.uninstall()
        s.close()
    n = a.steps
    wrap_ns = statistics.median(ACC["(empty wrapped call)"])
    rows = []
    for name, samples in ACC.items():
        if not samples or name.startswith("("):
            continue
        # the median call (a call preempted by another process on a loaded machine is an outlier the
        # mean would keep), times the calls a step
        rows.append((name, len(samples) / n, (statistics.median(samples) - wrap_ns) * len(samples) / n / 1e3))
    rows.sort(key=lambda r: -r[2])
    print(f"{a.calls + 1}-call step, {n} steps: step CPU median {statistics.median(cpu[warm:]) / 1e3:.1f} us; "
          f"timer wrapper {wrap_ns:.0f} ns a call (subtracted)")
    print(f"{'piece':34s} {'calls/step':>10s} {'us/step (inclusive)':>20s}")
    for name, c, us in rows:
        print(f"{name:34s} {c:10.2f} {us:20.2f}")
    by0, by1 = own0["by_part"], own1["by_part"]
    print("probe's own account, us/step: " + ", ".join(
        f"{k} {1e6 * (by1[k] - by0.get(k, 0)) / n:.1f}" for k in by1))
    print(json.dumps({"rows": rows, "wrap_ns": wrap_ns}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
