"""Where the probe's microseconds go (issue 20, docs/performance.md): the forward of an 800-call model
(nn.Sequential of 400 Linear(32, 32) + ReLU pairs, batch 16, grad enabled, one intra-op thread)
timed bare and under each component of the probe's module hooks, alternated in rounds, each side's
figure the minimum of a few forwards (the least-disturbed one: this measures a fixed cost per call
on a shared machine), then the median over rounds.

    .venv/bin/python bench/hook_breakdown.py [--calls 800] [--rounds 15]
    .venv/bin/python bench/hook_breakdown.py --calls 1000 --rounds 40 --only "probe handed over, no extensions"
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.modules import module as nn_module  # noqa: E402


def _noop_pre(m, a):
    return None


def _noop_post(m, a, k, o=None):
    return None


def variants(tmp: str, model=None):
    """name -> (install, uninstall) pairs."""
    from diag.probe.handover import remove_global_hook as _remove_global

    def glob(pre: bool, post: bool):
        hs = []

        def on():
            if pre:
                hs.append(nn_module.register_module_forward_pre_hook(_noop_pre))
            if post:
                hs.append(nn_module.register_module_forward_hook(_noop_post, with_kwargs=True, always_call=True))

        def off():
            while hs:
                _remove_global(hs.pop())
        return on, off

    def probe(ext: str, handover: bool = False):
        """diag's probe; with ``handover`` it is installed the way `diag.watch()` does (the model
        exists: found by the install's scan), one outermost forward is made in its discovery window
        and the window is closed (a step would close it): inner modules are then on the fast path.
        Without it, the probe keeps its global hooks for the whole run (DIAG_PROBE_HANDOVER=0)."""
        state = {}

        def on():
            import os

            from diag.probe.core import FileSink, Probe
            from diag.probe.extensions import load_extensions

            sink = FileSink(f"{tmp}/ev-{time.monotonic_ns()}.jsonl")
            exts = load_extensions() if ext == "all" else load_extensions([ext]) if ext else []
            p = Probe(sink, extensions=exts)
            os.environ["DIAG_PROBE_HANDOVER"] = "1" if handover else "0"
            try:
                p.install(scan_modules=handover)
            finally:
                os.environ.pop("DIAG_PROBE_HANDOVER", None)
            if handover:
                model(torch.randn(16, 32))         # one outermost forward in the window
                p._handover._hand_over()
            state["p"], state["s"] = p, sink

        def off():
            state["p"].finish("completed", 0)
            state["p"].uninstall()
            state["s"].close()
            for h in list(nn_module._global_forward_hooks_with_kwargs):   # torch leaves these behind
                if h not in nn_module._global_forward_hooks:
                    nn_module._global_forward_hooks_with_kwargs.pop(h, None)
        return on, off

    return {
        "global pre (empty)": glob(True, False),
        "global post (empty)": glob(False, True),
        "global pre+post (empty)": glob(True, True),
        "probe global hooks, no extensions": probe(""),
        "probe global hooks + perf": probe("diag.probe.perf:PerfProbe"),
        "probe global hooks + all extensions": probe("all"),
        "probe handed over, no extensions": probe("", handover=True),
        "probe handed over + all extensions": probe("all", handover=True),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=800)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", help="comma-separated variant names (default: all)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = []
    for _ in range(a.calls // 2):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    model = nn.Sequential(*layers)
    n_calls = sum(1 for _ in model.modules())
    x = torch.randn(16, 32)

    def fwd() -> float:
        best = float("inf")
        for _ in range(a.reps):
            t0 = time.thread_time_ns()
            model(x)
            best = min(best, time.thread_time_ns() - t0)
        return best / 1e3     # us

    for _ in range(20):
        model(x)
    with tempfile.TemporaryDirectory() as tmp:
        vs = variants(tmp, model)
        vs = {k: v for k, v in vs.items() if not a.only or k in a.only.split(",")}
        names = ["bare"] + list(vs)
        res: dict[str, list[float]] = {n: [] for n in names}
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                if n != "bare":
                    vs[n][0]()
                res[n].append(fwd())
                if n != "bare":
                    vs[n][1]()
    base = statistics.median(res["bare"])
    out = {"module_calls": n_calls, "bare_forward_us": round(base, 1), "rows": {}}
    print(f"forward of {n_calls} module calls, bare: {base:.0f} us (thread CPU, min of {a.reps}, median of {a.rounds} rounds)")
    for n in names[1:]:
        per = [(v - b) / n_calls for v, b in zip(res[n], res["bare"])]
        q = statistics.quantiles(per, n=4)
        m = statistics.median(per)
        out["rows"][n] = {"forward_us": round(statistics.median(res[n]), 1), "us_per_call": round(m, 3),
                          "iqr": [round(q[0], 3), round(q[2], 3)]}
        print(f"  {n:36s} {statistics.median(res[n]):9.0f} us  {m:+.3f} us/call (IQR {q[0]:+.3f}..{q[2]:+.3f})")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
