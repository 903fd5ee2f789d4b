"""Memory estimation cost: the fake-tensor replay of a ~1B-parameter model's training step (time and
resident memory, in a fresh process), a full batch-size plan for it, and a small model's replay.

    .venv/bin/python bench/run.py memory
    .venv/bin/python bench/bench_memory.py            # the same, standalone

The 1B model is built on the ``meta`` device (no storage), so the process's RSS is the replay's own
cost plus torch's import; nothing proportional to the model or the batch is allocated.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, ROOT)


def hwm():
    # this process's peak RSS since exec (VmHWM); ru_maxrss would include the parent's peak
    # from before the exec (Linux keeps it across execve)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


t_import = time.perf_counter()
import torch
from torch import nn
import torch.nn.functional as F
from diag.probe.replay import InputSpec, StepReplay
from diag.memory.plan import make_plan
t_import = time.perf_counter() - t_import
rss_import = hwm()

class Block(nn.Module):
    def __init__(self, h, a):
        super().__init__()
        self.a = a
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h, bias=False), nn.Linear(h, h, bias=False)
        self.fc1, self.fc2 = nn.Linear(h, 4 * h, bias=False), nn.Linear(4 * h, h, bias=False)
    def forward(self, x):
        B, S, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, self.a, h // self.a).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(o.transpose(1, 2).reshape(B, S, h))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

class GPT(nn.Module):
    def __init__(self, V, h, a, L):
        super().__init__()
        self.emb = nn.Embedding(V, h)
        self.blocks = nn.ModuleList(Block(h, a) for _ in range(L))
        self.lnf = nn.LayerNorm(h)
        self.head = nn.Linear(h, V, bias=False)
    def forward(self, idx):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x)
        return self.head(self.lnf(x))

cfg = json.loads(sys.argv[1])
with torch.device("meta"):
    model = GPT(cfg["V"], cfg["h"], cfg["a"], cfg["L"])
opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
params = sum(p.numel() for p in model.parameters())
ids = torch.zeros(1, cfg["S"], dtype=torch.long)           # shapes only: batch 1 here, replayed at B
replay = StepReplay(model, [opt], InputSpec((ids,), {}), autocast=cfg.get("autocast"))
t0 = time.perf_counter()
est = replay.train(cfg["B"])
step_s = time.perf_counter() - t0
rss_step = hwm()
out = {"params": params, "batch": cfg["B"], "seq": cfg["S"], "step_s": step_s, "peak": est["peak"],
       "categories": est["categories"], "peak_phase": est["peak_phase"], "rss_after_import": rss_import,
       "rss_max": rss_step, "import_s": t_import}
if cfg.get("warm"):
    t0 = time.perf_counter()
    for b in (cfg["B"] + 1, cfg["B"] + 2, cfg["B"] + 3):
        replay.train(b)
    out["warm_s"] = (time.perf_counter() - t0) / 3
if cfg.get("plan"):
    t0 = time.perf_counter()
    first = {(cfg["B"], 1): est}
    def train(b, a):
        r = first.get((b, a))
        return r if r is not None else replay.train(b, a)
    plan = make_plan(train, replay.eval, observed_batch=cfg["B"], capacity=cfg["plan"], facts=est["uses"],
                     capability=[9, 0], table=False)
    out.update(plan_s=time.perf_counter() - t0, plan_replays=plan["replays"], plan_max_batch=plan["max_batch"],
               plan_max_eval_batch=(plan["eval"] or {}).get("max_batch"),
               plan_trials=plan["search"]["trials"], rss_max=hwm())
print("RESULT " + json.dumps(out))
""".replace("ROOT", repr(str(ROOT)))

GIB, MIB = 1 << 30, 1 << 20

BIG = {"V": 32000, "h": 2048, "a": 16, "L": 18, "S": 1024, "B": 8, "autocast": "bfloat16",
       "plan": 80 * 10 ** 9}
SMALL = {"V": 512, "h": 256, "a": 4, "L": 4, "S": 128, "B": 16}


def _child(cfg: dict) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cfg)], capture_output=True, text=True,
                       timeout=600)
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"benchmark child failed:\n{p.stderr[-3000:]}")
    return json.loads(line[len("RESULT "):])


def _hot_path() -> dict:
    """The memory extension's per-step cost on a CPU run (CUDA adds one torch.cuda.memory_stats())."""
    import time

    sys.path.insert(0, str(ROOT))
    from diag.probe.memory import MemoryProbe

    class _Probe:            # the attributes the hook reads; emit() is a no-op here
        rank, _step, last_model, steps_done = 0, None, None, 1

        def emit(self, *a, **k):
            pass

    m, p = MemoryProbe(), _Probe()
    m._persistent_done = True
    m._spec_error = "captured"            # the first forward was captured: later ones return at once
    import torch  # noqa: F401  (imported by the user's script already; not part of the hook's cost)

    m.on_step_end(p, {"index": 1})
    n = 20000
    t = time.perf_counter()
    for i in range(n):
        m.on_step_end(p, {"index": i + 2})
    step_us = (time.perf_counter() - t) / n * 1e6
    t = time.perf_counter()
    for _ in range(n):
        m.on_forward(p, None, (), {}, None, True)
    fwd_us = (time.perf_counter() - t) / n * 1e6
    return {"step_us": step_us, "forward_us": fwd_us}


def run(results: dict) -> None:
    hot = _hot_path()
    results["hook_on_step_end_cpu_us"] = round(hot["step_us"], 2)
    results["hook_on_forward_us"] = round(hot["forward_us"], 2)
    print(f"   hot path on a CPU run: on_step_end {hot['step_us']:.1f} us, on_forward {hot['forward_us']:.2f} us")
    big = _child(BIG)
    results["model_1b_params"] = big["params"]
    results["model_1b_step_estimate_s"] = round(big["step_s"], 2)
    results["model_1b_peak_gib"] = round(big["peak"] / GIB, 2)
    results["model_1b_categories_gib"] = {k: round(v / GIB, 2) for k, v in big["categories"].items()}
    results["model_1b_rss_max_mib"] = round(big["rss_max"] / MIB)
    results["rss_after_torch_import_mib"] = round(big["rss_after_import"] / MIB)
    results["model_1b_plan_h100_s"] = round(big["plan_s"], 2)
    results["model_1b_plan_replays"] = big["plan_replays"]
    results["model_1b_max_batch_h100"] = big["plan_max_batch"]
    results["model_1b_max_eval_batch_h100"] = big["plan_max_eval_batch"]
    print(f"   1B model ({big['params'] / 1e9:.2f}e9 params, AdamW, bf16 autocast, batch {big['batch']} x "
          f"{big['seq']}): step estimated in {big['step_s']:.1f} s, peak {big['peak'] / GIB:.1f} GiB "
          f"({', '.join(f'{k} {v / GIB:.1f}' for k, v in big['categories'].items())}); "
          f"max RSS {big['rss_max'] / MIB:.0f} MiB (torch import alone {big['rss_after_import'] / MIB:.0f} MiB)")
    print(f"   plan for an 80 GB GPU: {big['plan_replays']} replays in {big['plan_s']:.1f} s -> largest batch "
          f"{big['plan_max_batch']}, eval {big['plan_max_eval_batch']}")
    small = _child({**SMALL, "warm": True})
    results["small_transformer_replay_ms"] = round(1000 * small["step_s"], 1)
    results["small_transformer_replay_warm_ms"] = round(1000 * small["warm_s"], 1)
    print(f"   small transformer ({small['params'] / 1e6:.1f}M params): first replay {1000 * small['step_s']:.0f} ms, "
          f"next ones {1000 * small['warm_s']:.0f} ms")


if __name__ == "__main__":
    res: dict = {}
    run(res)
    print(json.dumps(res, indent=2))
