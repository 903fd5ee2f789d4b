"""The probe's per-step work counted in bytecodes (issue 28): the 11-call training step of the depth
sweep (nn.Sequential of Linear(32, 32) + ReLU, batch 16, SGD, cross-entropy, a DataLoader, one
intra-op thread) traced with ``sys.settrace`` (``f_trace_opcodes``), bare and under the probe as
``python -m diag.probe`` installs it (default extensions, the run-tagging file sink), after the
hand-over and the lane's arming.

A bytecode count is not a time (a clock read is one call, a dict lookup one instruction), but it does not
move with the machine's load or its caches: a figure that a 2-core VM's noise (±2 µs a step between runs
of bench_depth) cannot blur, for finding where the probe's per-step work is and for a test to hold it
(``tests/test_step_ops.py``). What a step costs in time is bench_depth's (docs/performance.md).

    .venv/bin/python bench/step_ops.py [--steps 300] [--calls 10] [--loss module]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DIAG = str(ROOT / "diag") + os.sep


def _where(code) -> str:
    f = code.co_filename
    if f.startswith(DIAG):
        return "diag/" + f[len(DIAG):].replace(os.sep, "/")
    i = f.rfind("site-packages" + os.sep)
    return f[i + len("site-packages") + 1:] if i >= 0 else f


def count(calls: int = 10, steps: int = 300, warmup: int = 120, probe: bool = True,
          loss: str = "functional") -> dict:
    """Bytecodes a step, by function, over ``steps`` traced steps after ``warmup`` untraced ones:
    ``{"per_step": [...] (diag's own bytecodes each step), "by_function": {"file:function": ops a step},
    "all_per_step": mean bytecodes a step (torch's and the loop's included), "lane_steps": ...}``."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers: list = []
    for _ in range(max(1, calls // 2)):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    model = nn.Sequential(*layers)
    n = 16 * (warmup + steps + 8)
    loader = DataLoader(TensorDataset(torch.randn(n, 32), torch.randint(0, 32, (n,))), batch_size=16,
                        drop_last=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    # the step's loss: the functional one, or a loss *module* (an outermost module without parameters,
    # hooked as the model is: as most scripts call it)
    loss_fn = nn.CrossEntropyLoss() if loss == "module" else nn.functional.cross_entropy
    ops: collections.Counter = collections.Counter()
    per_step: list = []
    mine = [0]
    names: dict = {}

    def tracer(frame, event, arg):
        if event == "call":
            frame.f_trace_opcodes = True
            return tracer
        if event == "opcode":
            code = frame.f_code
            key = names.get(code)
            if key is None:
                where = _where(code)
                key = names[code] = (f"{where}:{code.co_name}", where.startswith("diag/"))
            ops[key[0]] += 1
            if key[1]:
                mine[0] += 1
        return tracer

    from diag.probe import sink as sink_mod
    from diag.probe import watchdog
    from diag.probe.core import Probe
    from diag.probe.extensions import load_extensions

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "events.jsonl")
        sink = watchdog.TaggedSink(sink_mod.FileSink(path), path)
        sink.run_id = "bench"
        p = Probe(sink, extensions=load_extensions(), script=__file__)
        if probe:
            p.install()
        before = sys.gettrace()      # (a coverage tool's tracer, put back after)
        try:
            it = iter(loader)
            lane0 = 0
            for i in range(warmup + steps):
                if i == warmup:
                    lane0 = p._lane.steps + p._lane.pend
                    sys.settrace(tracer)
                if i >= warmup:
                    mine[0] = 0
                x, y = next(it)
                opt.zero_grad(set_to_none=True)
                loss_fn(model(x), y).backward()
                opt.step()
                if i >= warmup:
                    per_step.append(mine[0])
        finally:
            sys.settrace(before)
            lane_steps = p._lane.steps + p._lane.pend - lane0
            if probe:
                p.finish("completed", 0)
                p.uninstall()
            sink.close()
    total = sum(ops.values())
    return {"per_step": per_step, "diag_median": statistics.median(per_step), "diag_mean": statistics.mean(per_step),
            "all_per_step": total / steps, "lane_steps": lane_steps, "steps": steps,
            "by_function": {k: v / steps for k, v in ops.most_common()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--loss", choices=("functional", "module"), default="functional",
                    help="the step's loss: nn.functional.cross_entropy, or an nn.CrossEntropyLoss module")
    a = ap.parse_args()
    bare = count(a.calls, a.steps, probe=False, loss=a.loss)
    under = count(a.calls, a.steps, probe=True, loss=a.loss)
    print(f"{a.calls + 1}-call step ({a.loss} loss), {a.steps} traced steps ({under['lane_steps']} on the lane): bytecodes a step "
          f"bare {bare['all_per_step']:.0f}, under the probe {under['all_per_step']:.0f} "
          f"(+{under['all_per_step'] - bare['all_per_step']:.0f}); diag's own: median {under['diag_median']:.0f}, "
          f"mean {under['diag_mean']:.0f}")
    keys = set(bare["by_function"]) | set(under["by_function"])
    rows = sorted(((under["by_function"].get(k, 0) - bare["by_function"].get(k, 0), k) for k in keys), reverse=True)
    print(f"{'+ops a step':>11s}  function")
    for d, k in rows:
        if abs(d) >= 1:
            print(f"{d:11.1f}  {k}")
    print(json.dumps({"bare": bare["all_per_step"], "probe": under["all_per_step"], "diag_median": under["diag_median"],
                      "diag_mean": under["diag_mean"], "lane_steps": under["lane_steps"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
