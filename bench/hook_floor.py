"""The floor of any probe built from Python hooks (issue 28, docs/performance.md "Ninth pass"): the
depth sweep's training step (nn.Sequential of Linear(32, 32) + ReLU, batch 16, SGD, cross-entropy, a
DataLoader, one intra-op thread) under the seven hook entries a step record needs, each doing the
least a record can: the DataLoader's ``__next__`` wrapped (two clock reads), ``zero_grad`` wrapped
(two), the model's forward pre- and post-hook (module-local, with_kwargs, always_call: as the probe's;
one each), ``torch.autograd.backward`` wrapped (two), the optimizer's global pre- and post-hook (one
each; the post-hook appends the step's nine clock values to a list as a tuple). No step machine, no
event, no accounting: what diag's probe costs beyond this is its own work.

Measured as bench/bench_depth.py's steady state: one process, cycles of six steps (two with the hooks
recording, two with them in place and returning at once, two with them taken out), adjacent steps
compared on the step thread's CPU time, 10%-trimmed means: work = active - idle, floor = idle - bare.

    .venv/bin/python bench/hook_floor.py [--calls 10] [--cycles 1200] [--call]

``--call``: the model's forward timed through the instance's ``_compiled_call_impl`` (torch's door that
diag's lane uses, diag.probe.handover.HandOver.take_call) instead of a forward pre- and post-hook: the
model's call then stays on ``Module._call_impl``'s fast path.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.autograd as ag
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data import dataloader as dl


def trimmed_mean(xs: list, cut: float = 0.1) -> float:
    xs = sorted(xs)
    k = int(len(xs) * cut)
    return statistics.mean(xs[k:len(xs) - k] or xs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=10, help="module calls per forward, as the depth sweep's")
    ap.add_argument("--cycles", type=int, default=1200)
    ap.add_argument("--call", action="store_true",
                    help="time the forward through the model's _compiled_call_impl, not two module hooks")
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers: list = []
    for _ in range(max(1, a.calls // 2)):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    model = nn.Sequential(*layers)
    L = 6
    n = 16 * (L * a.cycles + 8)
    loader = DataLoader(TensorDataset(torch.randn(n, 32), torch.randint(0, 32, (n,))), batch_size=16, drop_last=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    pc = time.perf_counter
    on = [False]
    cur = [0.0] * 8
    rows: list = []
    orig_next, orig_zg, orig_bw = dl._BaseDataLoaderIter.__next__, torch.optim.Optimizer.zero_grad, ag.backward

    def __next__(it):
        if not on[0]:
            return orig_next(it)
        t0 = pc()
        b = orig_next(it)
        cur[0], cur[1] = t0, pc()
        return b

    def zero_grad(o, set_to_none=True):
        if not on[0]:
            return orig_zg(o, set_to_none)
        t0 = pc()
        r = orig_zg(o, set_to_none)
        cur[2] = pc() - t0
        return r

    def backward(*args, **kwargs):
        if not on[0]:
            return orig_bw(*args, **kwargs)
        t0 = pc()
        try:
            return orig_bw(*args, **kwargs)
        finally:
            cur[5], cur[6] = t0, pc()

    def pre(m, args):
        if on[0]:
            cur[3] = pc()

    def post(m, args, kwargs, out=None):
        if on[0]:
            cur[4] = pc()

    impl = model._call_impl

    def call(*args, **kwargs):
        if not on[0]:
            return impl(*args, **kwargs)
        cur[3] = pc()
        out = impl(*args, **kwargs)
        cur[4] = pc()
        return out

    def opre(o, args, kwargs):
        if on[0]:
            cur[7] = pc()

    def opost(o, args, kwargs):
        if on[0]:
            rows.append((cur[0], cur[1], cur[2], cur[3], cur[4], cur[5], cur[6], cur[7], pc()))

    handles: list = []

    def attach():
        dl._BaseDataLoaderIter.__next__ = __next__
        torch.optim.Optimizer.zero_grad = zero_grad
        ag.backward = backward
        if a.call:
            model.__dict__["_compiled_call_impl"] = call
        else:
            handles.extend([model.register_forward_pre_hook(pre),
                            model.register_forward_hook(post, with_kwargs=True, always_call=True)])
        handles.extend([register_optimizer_step_pre_hook(opre), register_optimizer_step_post_hook(opost)])

    def detach():
        dl._BaseDataLoaderIter.__next__ = orig_next
        torch.optim.Optimizer.zero_grad = orig_zg
        ag.backward = orig_bw
        model.__dict__.pop("_compiled_call_impl", None)
        for h in handles:
            h.remove()
        handles.clear()

    it = iter(loader)
    cpu = []
    try:
        for i in range(L * a.cycles):
            k = i % L
            if k == 0:
                attach()
            elif k == 4:
                detach()
            on[0] = k < 2
            c0 = time.thread_time()
            x, y = next(it)
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            cpu.append(time.thread_time() - c0)
    finally:
        detach()
    warm = 50
    work = [cpu[L * c + 1] - cpu[L * c + 3] for c in range(warm, a.cycles)]
    floor = [cpu[L * c + 3] - cpu[L * c + 5] for c in range(warm, a.cycles)]
    bare = statistics.median(cpu[L * c + 5] for c in range(warm, a.cycles))
    w, f = trimmed_mean(work), trimmed_mean(floor)
    out = {"calls": a.calls + 1, "forward": "_compiled_call_impl" if a.call else "module hooks", "bare_step_ms": round(bare * 1e3, 3), "work_us": round(w * 1e6, 1),
           "floor_us": round(f * 1e6, 1), "total_us": round((w + f) * 1e6, 1),
           "total_pct": round(100 * (w + f) / bare, 2), "records": len(rows)}
    print(f"{out['calls']} calls ({out['forward']}), bare step {out['bare_step_ms']} ms: the hooks cost "
          f"{out['total_us']} us a step ({out['total_pct']}%): work {out['work_us']} us, floor {out['floor_us']} us")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
