"""Benchmark workload for the depth sweep (bench/bench_depth.py): CPU training steps of
nn.Sequential(Linear(32, 32), ReLU, ...) with about CALLS module calls per forward (batch 16), or the
MLP of mlp_steps.py (--calls mlp), alternating, in one process, blocks of steps run bare and under
each VARIANT. Prints one JSON line: per variant, the median step time of each block (wall clock and this thread's
CPU time), paired by round.

Variants:
  bare          nothing installed
  hooks         an empty global forward pre-hook and post-hook (with_kwargs, always_call: as the probe)
  probe         diag's probe with its default extensions and a file sink (what `python -m diag.probe`
                installs under `diag check`)
  probe-noext   diag's probe without extensions
  probe-global  diag's probe with DIAG_PROBE_HANDOVER=0: global hooks for the whole run (before issue 20)

    python bench/workloads/depth_steps.py --calls 10,100,1000,mlp --variants bare,probe --rounds 8 --steps 30
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))


def build(calls: str):
    torch.manual_seed(0)
    if calls == "mlp":
        model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))
        x, y = torch.randn(64 * 8, 512), torch.randint(0, 10, (64 * 8,))
        batch = 64
    else:
        layers = []
        for _ in range(max(1, int(calls) // 2)):
            layers += [nn.Linear(32, 32), nn.ReLU()]
        model = nn.Sequential(*layers)
        x, y = torch.randn(16 * 8, 32), torch.randint(0, 32, (16 * 8,))
        batch = 16
    return model, DataLoader(TensorDataset(x, y), batch_size=batch, drop_last=True)


class Variant:
    def __init__(self, name: str, tmp: str):
        self.name, self.tmp = name, tmp
        self.steps_seen = 0
        self.probe_s: list = []   # per block: the median probe_s the probe reported for itself
        self.window_steps: set = set()   # the last block's steps covered by a discovery window
        self._n = 0

    def __enter__(self):
        n = self.name
        self._undo = []
        if n == "hooks":
            from torch.nn.modules import module as m

            a = m.register_module_forward_pre_hook(lambda mod, args: None)
            b = m.register_module_forward_hook(lambda mod, args, kwargs, out=None: None, with_kwargs=True,
                                               always_call=True)
            self._undo = [a.remove, b.remove, lambda: m._global_forward_hooks_with_kwargs.pop(b.id, None)]
        elif n in ("probe", "probe-noext", "probe-global") or n.startswith("probe-without:"):
            from diag.probe.core import FileSink, Probe
            from diag.probe.extensions import load_extensions

            self._n += 1
            self._events = os.path.join(self.tmp, f"{n}-{self._n}.jsonl")
            sink = FileSink(self._events)
            if n.startswith("probe-without:"):   # e.g. probe-without:perfprobe+memoryprobe
                os.environ["DIAG_PROBE_DISABLE"] = n.split(":", 1)[1].replace("+", ",")
            try:
                exts = load_extensions() if n != "probe-noext" else []
            finally:
                if n.startswith("probe-without:"):
                    os.environ.pop("DIAG_PROBE_DISABLE", None)
            probe = Probe(sink, extensions=exts, script=__file__)
            if n == "probe-global":
                os.environ["DIAG_PROBE_HANDOVER"] = "0"
            try:
                probe.install()
            finally:
                os.environ.pop("DIAG_PROBE_HANDOVER", None)

            def done():
                probe.finish("completed", 0)
                probe.uninstall()
                sink.close()
                with open(self._events) as f:
                    steps = [json.loads(line) for line in f if '"kind": "step"' in line]
                self.steps_seen += len(steps)
                # the probe's own account of its time: median over this block's timed steps
                own = [s["probe_s"] for s in steps[WARMUP[0]:] if not s.get("instrumented") and "probe_s" in s]
                if own:
                    self.probe_s.append(statistics.median(own))
                # the steps a discovery window covered (global hooks on every module call for that step)
                self.window_steps = {s["index"] for s in steps if s.get("probe_window") or s.get("instrumented")}
            self._undo = [done]
        elif n != "bare":
            raise SystemExit(f"depth_steps: unknown variant {n!r}")
        return self

    def __exit__(self, *exc):
        for u in self._undo:
            u()
        return False


WARMUP = [6]


def block(model, loader, opt, steps: int, warmup: int, per_step: list | None = None) -> tuple[float, float]:
    """(median wall time, median thread CPU time) of a step, warm-up steps left out. The CPU time of
    this thread (one intra-op thread, no DataLoader workers: all the step's work) does not count the
    time the thread waited for a core, which on a loaded machine is most of the noise."""
    times, cpu = [], []
    done = 0
    t_prev = time.perf_counter()
    c_prev = time.thread_time()
    while done < steps + warmup:
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            now, c_now = time.perf_counter(), time.thread_time()
            times.append(now - t_prev)
            cpu.append(c_now - c_prev)
            t_prev, c_prev = now, c_now
            done += 1
            if done >= steps + warmup:
                break
    if per_step is not None:
        per_step.extend(cpu)     # the i-th iteration is the probe's step i + 1
    return statistics.median(times[warmup:]), statistics.median(cpu[warmup:])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", default="10,100,1000,mlp")
    ap.add_argument("--variants", default="bare,probe")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=6)   # the probe's one-off steps (FLOP count at step 3)
    a = ap.parse_args()
    torch.set_num_threads(1)
    WARMUP[0] = a.warmup
    variants = a.variants.split(",")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for calls in a.calls.split(","):
            model, loader = build(calls)
            n_calls = sum(1 for _ in model.modules())
            opt = torch.optim.SGD(model.parameters(), lr=1e-3)
            block(model, loader, opt, 5, 0)                      # warm the allocator and caches
            vs = {v: Variant(v, tmp) for v in variants}
            res: dict = {v: [] for v in variants}
            cpu: dict = {v: [] for v in variants}
            nowin: dict = {v: [] for v in variants}
            n_win: dict = {v: [] for v in variants}
            for r in range(a.rounds):                            # alternated: drift hits every side
                order = variants[r % len(variants):] + variants[:r % len(variants)]
                for v in order:
                    per: list = []
                    with vs[v]:
                        w, c = block(model, loader, opt, a.steps, a.warmup, per)
                    res[v].append(w)
                    cpu[v].append(c)
                    # the same block without the steps a discovery window covered (bare: all steps)
                    win = vs[v].window_steps
                    nowin[v].append(statistics.median(t for i, t in enumerate(per[a.warmup:], a.warmup)
                                                      if i + 1 not in win))
                    n_win[v].append(sum(1 for i in range(a.warmup, len(per)) if i + 1 in win))
            out[calls] = {"module_calls": n_calls, "block_median_step_s": res, "block_median_step_cpu_s": cpu,
                          "block_median_step_cpu_s_outside_windows": nowin, "window_steps_per_block": n_win,
                          "probe_steps_seen": {v: vs[v].steps_seen for v in variants if v.startswith("probe")},
                          "probe_s_self": {v: vs[v].probe_s for v in variants if v.startswith("probe")}}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
