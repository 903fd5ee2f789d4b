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
  probe-paused  diag's probe installed and paused for the whole block: its hooks and wrappers in place,
                their bodies returning at once (the floor under --steady's figure)

--steady PAIRS: after the blocks, the probe's cost in steady state, as a long job pays it: one probe
installed for the rest of the run (as under `diag check`), the steps in cycles of seven: three with the
probe active, two paused (every hook in place, the bodies return at once), two with everything it put
on the step's path taken out of torch (bare); the last active step is the one measured, and with three
probe steps a cycle (an odd number) its index walks through every residue of the cost budget's period
(a power of two), so it is a sampled step as often as any step of a long run is (with two, at 1 step in
2 sampled, it was always the sampled one, or never); within a cycle the steps are adjacent in time (the
machine's drift cancels) and nothing is allocated between them (the model's memory layout stays: a
fresh process or probe per block moves it, and on this machine that alone moves a deep step's time by
a few percent). Cycles touched by a discovery window, and the first WARMUP cycles, are left out.

    python bench/workloads/depth_steps.py --calls 10,100,1000,mlp --variants bare,probe --rounds 8 --steps 30
"""
import argparse
import gc
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


def probe_sink(path: str):
    """The sink ``python -m diag.probe`` gives the probe under ``diag check``: the run-tagging wrapper
    around the file sink (with a run id, as diag sets one)."""
    from diag.probe.core import FileSink
    from diag.probe.watchdog import TaggedSink

    sink = TaggedSink(FileSink(path), path)
    sink.run_id = "bench"
    return sink


class Variant:
    def __init__(self, name: str, tmp: str):
        self.name, self.tmp = name, tmp
        self.steps_seen = 0
        self.probe_s: list = []   # per block: the median probe_s the probe reported for itself
        self.window_steps: set = set()   # the last block's steps covered by a discovery window
        self._n = 0
        self.after_warmup = None

    def __enter__(self):
        n = self.name
        self._undo = []
        if n == "hooks":
            from torch.nn.modules import module as m

            a = m.register_module_forward_pre_hook(lambda mod, args: None)
            b = m.register_module_forward_hook(lambda mod, args, kwargs, out=None: None, with_kwargs=True,
                                               always_call=True)
            self._undo = [a.remove, b.remove, lambda: m._global_forward_hooks_with_kwargs.pop(b.id, None)]
        elif n in ("probe", "probe-noext", "probe-global", "probe-paused") or n.startswith("probe-without:"):
            from diag.probe.core import Probe
            from diag.probe.extensions import load_extensions

            self._n += 1
            self._events = os.path.join(self.tmp, f"{n}-{self._n}.jsonl")
            sink = probe_sink(self._events)
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
            if n == "probe-paused":
                # paused after the warm-up steps (block() calls this): by then the hand-over is done, and
                # the hooks are in their steady state (paused from install, the install's discovery
                # window would keep global hooks on every module call)
                self.after_warmup = lambda: setattr(probe, "active", False)

            def done():
                probe.active = True
                probe.finish("completed", 0)
                probe.uninstall()
                sink.close()
                with open(self._events) as f:
                    steps = [json.loads(line) for line in f if '"kind": "step"' in line]
                self.steps_seen += len(steps)
                # the probe's own account of its time: median over this block's timed steps
                own = [s["probe_s"] for s in steps[WARMUP[0]:] if not s.get("instrumented") and "probe_s" in s]
                if own and n != "probe-paused":     # (paused: the probe saw the warm-up steps only)
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
# the step's loss: the functional one (default), or a loss *module* (--loss module), as many scripts
# call it: an outermost module without parameters, which carries the probe's hooks too
LOSS: list = [nn.functional.cross_entropy]


def block(model, loader, opt, steps: int, warmup: int, per_step: list | None = None,
          after_warmup=None) -> tuple[float, float]:
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
            LOSS[0](model(x), y).backward()
            opt.step()
            now, c_now = time.perf_counter(), time.thread_time()
            times.append(now - t_prev)
            cpu.append(c_now - c_prev)
            t_prev, c_prev = now, c_now
            done += 1
            if done == warmup and after_warmup is not None:
                after_warmup()
                t_prev, c_prev = time.perf_counter(), time.thread_time()
            if done >= steps + warmup:
                break
    if per_step is not None:
        per_step.extend(cpu)     # the i-th iteration is the probe's step i + 1
    return statistics.median(times[warmup:]), statistics.median(cpu[warmup:])


class Detached:
    """Benchmark only (it reads the probe's internals): takes everything the probe put on the step's
    path out of torch between two steps, and puts it back, without building anything new (the model's
    memory layout must not move): the patched attributes (the probe's and its extensions') set back
    to torch's, the probe's global hooks and the hand-over's module hooks popped from torch's hook
    dicts and restored under the same ids."""

    def __init__(self, probe):
        self._attrs = []                   # (owner, name, torch's, the probe's)
        buckets = [probe._patches] + [getattr(e, "_patches", None) for e in probe.extensions]
        for b in buckets:
            for owner, name, orig, instance in (list(b._items) if b else []):
                if instance:
                    continue
                self._attrs.append((owner, name, orig, owner.__dict__.get(name)))
        handles = list(probe._handles)
        for e in probe.extensions:
            handles += list(getattr(e, "_hooks", []) or [])
        ho = probe._handover
        if ho is not None:
            handles += list(ho._other) + list(ho._global)
            for _ref, a, b in ho._hooked.values():
                handles += [a, b]
        self._hooks = [(h.hooks_dict_ref, h.id) for h in handles if hasattr(h, "hooks_dict_ref")]
        self._saved: list = []
        self._ho = ho
        self._call: list = []     # the lane's call on its model (HandOver.take_call), taken out too

    def __enter__(self):
        from diag.probe.hooks import restore_attribute

        for owner, name, orig, _new in reversed(self._attrs):
            restore_attribute(owner, name, orig)
        saved = self._saved
        for ref, hid in self._hooks:
            d = ref()
            if d is not None and hid in d:
                saved.append((d, hid, d.pop(hid)))
        c = self._ho._call if self._ho is not None else None
        m = c[0]() if c is not None else None
        if m is not None and m.__dict__.get("_compiled_call_impl") is c[4]:
            self._call.append((m, m.__dict__.pop("_compiled_call_impl")))
        return self

    def __exit__(self, *exc):
        for owner, name, _orig, new in self._attrs:
            if new is not None:
                setattr(owner, name, new)
        for d, hid, fn in self._saved:
            d[hid] = fn
        self._saved.clear()
        for m, fn in self._call:
            m.__dict__["_compiled_call_impl"] = fn
        self._call.clear()
        return False


def steady(model, loader, opt, pairs: int, warmup: int, tmp: str, chunks: int = 10) -> dict:
    """The probe's steady-state cost (see the module doc). Steps in cycles of seven: three with the probe
    active (A), two paused (P: its hooks called, returning at once), two with it taken out of torch
    (B, :class:`Detached`: bare). Per kept cycle, on this thread's CPU time: work = A3 - P2, floor =
    P2 - B2, total = A3 - B2 (the last of each kind: it follows one of its kind, as every step of a
    long run does). 10%-trimmed means over cycles (medians alongside); the spread is the
    inter-quartile range of the trimmed means of ``chunks`` consecutive runs of cycles."""
    from diag.probe.core import Probe
    from diag.probe.extensions import load_extensions

    events = os.path.join(tmp, f"steady-{id(model)}.jsonl")
    sink = probe_sink(events)
    probe = Probe(sink, extensions=load_extensions(), script=__file__)
    probe.install()
    ho = probe._handover
    # one epoch for the whole measurement (the blocks' 8-batch epochs would open a discovery window every
    # few steps; and an epoch that began in a detached or paused step would be an iterator the probe never
    # saw start, which no real run has): the dataset's rows again and again, by index, no copies
    L = 7     # A A A P P B B: three active steps (an odd number: see the module doc)
    ds = loader.dataset
    rows = (L * (warmup + pairs + 64) + 8) * loader.batch_size
    loader = DataLoader(ds, batch_size=loader.batch_size, drop_last=True,
                        sampler=[i % len(ds) for i in range(rows)])
    it = iter(loader)
    cpu, touched = [], []
    detached = None
    try:
        for i in range(L * (warmup + pairs + 64)):       # room for the cycles a window touches
            k = i % L
            if k == 5:                                   # (between steps: not timed)
                if detached is None:
                    detached = Detached(probe)
                detached.__enter__()
            elif k == 0 and detached is not None and (detached._saved or detached._call):
                detached.__exit__(None, None, None)
            probe.active = k < 3
            if k == 0:
                # the probe's step clock starts again here: the paused and detached steps before were not
                # its steps (else the first active step's time spans five steps, and the cost budget,
                # diag.probe.budget, would size its sampling for a step five times as long as the real one)
                probe.steps.last_boundary = probe.steps.closed_at = time.perf_counter()
            w0 = ho.window_calls if ho is not None else 0
            c0 = time.thread_time()
            try:
                x, y = next(it)
            except StopIteration:                         # a new epoch (a window opens: that cycle is out)
                it = iter(loader)
                x, y = next(it)
            opt.zero_grad(set_to_none=True)
            LOSS[0](model(x), y).backward()
            opt.step()
            cpu.append(time.thread_time() - c0)
            touched.append(ho is not None and (ho.window_calls != w0 or ho.discovering))
            if k == L - 1:
                kept = sum(1 for c in range(warmup, len(cpu) // L) if not any(touched[L * c:L * c + L]))
                if kept >= pairs:
                    break
    finally:
        if detached is not None and (detached._saved or detached._call):
            detached.__exit__(None, None, None)
        probe.active = True
        probe.finish("completed", 0)
        probe.uninstall()
        sink.close()
    work, floor, total, bare = [], [], [], []
    for c in range(warmup, len(cpu) // L):
        if any(touched[L * c:L * c + L]):
            continue
        a3, p2, b2 = cpu[L * c + 2], cpu[L * c + 4], cpu[L * c + 6]
        work.append(a3 - p2)
        floor.append(p2 - b2)
        total.append(a3 - b2)
        bare.append(b2)
    with open(events) as f:
        steps = [json.loads(line) for line in f if '"kind": "step"' in line]
    own = [s["probe_s"] for s in steps[2 * warmup:] if "probe_s" in s and not s.get("probe_window")
           and not s.get("instrumented")]
    size = max(1, len(total) // chunks)

    def chunked(xs):
        return [trimmed_mean(xs[k:k + size]) for k in range(0, size * chunks, size) if xs[k:k + size]]

    return {"pairs": len(total), "cycles_touched_by_windows": sum(
                1 for c in range(warmup, len(cpu) // L) if any(touched[L * c:L * c + L])),
            "bare_step_s": statistics.median(bare),
            # the headline: 10%-trimmed means (work + floor = total; medians of differences do not add up)
            "work_s": trimmed_mean(work), "floor_s": trimmed_mean(floor), "total_s": trimmed_mean(total),
            "median_s": {"work": statistics.median(work), "floor": statistics.median(floor),
                         "total": statistics.median(total)},
            # plain means: work + floor = total exactly (the same cycles), whatever the machine's load
            "mean_s": {"work": statistics.fmean(work), "floor": statistics.fmean(floor),
                       "total": statistics.fmean(total)},
            "chunk_means_s": {"work": chunked(work), "floor": chunked(floor), "total": chunked(total)},
            "self_reported_s": statistics.median(own) if own else None,
            "windows": len(ho.windows) if ho is not None else 0}


def trimmed_mean(xs: list, cut: float = 0.1) -> float:
    """The mean of ``xs`` without its lowest and highest ``cut`` shares (a step's time has rare long
    tails: a garbage collection, a page fault; medians of differences do not add up, means do)."""
    ys = sorted(xs)
    k = int(len(ys) * cut)
    ys = ys[k:len(ys) - k] or ys
    return sum(ys) / len(ys)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", default="10,100,1000,mlp")
    ap.add_argument("--variants", default="bare,probe")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=6)   # the probe's one-off steps (FLOP count at step 3)
    ap.add_argument("--steady", type=int, default=0, help="pairs of the steady-state measurement (0: none)")
    ap.add_argument("--loss", choices=("functional", "module"), default="functional",
                    help="the step's loss: nn.functional.cross_entropy, or an nn.CrossEntropyLoss module")
    a = ap.parse_args()
    if a.loss == "module":
        LOSS[0] = nn.CrossEntropyLoss()
    torch.set_num_threads(1)
    WARMUP[0] = a.warmup
    variants = a.variants.split(",")
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for calls in a.calls.split(","):
            # the last depth's optimizer is garbage in a reference cycle until a collection: the probe counts
            # live optimizers with the garbage collector's objects, and two would make every step end at
            # the next fetch instead of at its optimizer step (a different step close than a one-model run)
            opt = model = None
            gc.collect()
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
                        w, c = block(model, loader, opt, a.steps, a.warmup, per, vs[v].after_warmup)
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
            if a.steady:
                out[calls]["steady"] = steady(model, loader, opt, a.steady, a.warmup, tmp)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
