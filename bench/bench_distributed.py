"""Multi-process runs: the distributed probe extension's cost per step (one-process gloo DDP, in
process, extension on vs off, alternated), `diag check --nproc-per-node 2` wall time against plain
torchrun on the same script, and how well the straggler check's numbers match a planted delay."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "tests" / "scripts" / "dist_train.py"
PY = sys.executable


def _env():
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.pop("DIAG_SIMULATE_GPUS", None)
    return e


def extension_overhead(results: dict, rounds: int = 8, steps: int = 150) -> None:
    """Median step of a one-process gloo DDP job under diag.watch(), with the distributed extension
    and without it (DIAG_PROBE_DISABLE=distributedprobe), alternated."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, str(ROOT))
    import diag

    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            torch.manual_seed(0)
            model = DDP(nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 1)))
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            x, y = torch.randn(32, 64), torch.randn(32, 1)
            on, off = [], []
            for i in range(rounds):
                for enabled in ((True, False) if i % 2 == 0 else (False, True)):
                    if enabled:
                        os.environ.pop("DIAG_PROBE_DISABLE", None)
                    else:
                        os.environ["DIAG_PROBE_DISABLE"] = "distributedprobe"
                    with diag.watch() as run:
                        for _ in range(steps):
                            nn.functional.mse_loss(model(x), y).backward()
                            opt.step()
                            opt.zero_grad()
                    med = run.evidence.primary.median_step()["total_s"]
                    (on if enabled else off).append(med)
            os.environ.pop("DIAG_PROBE_DISABLE", None)
        finally:
            dist.destroy_process_group()
    m_on, m_off = statistics.median(on), statistics.median(off)
    results["ext_step_with_s"] = round(m_on, 7)
    results["ext_step_without_s"] = round(m_off, 7)
    results["ext_overhead_per_step_us"] = round((m_on - m_off) * 1e6, 1)
    print(f"  distributed extension: median step {m_on * 1e3:.3f} ms with, {m_off * 1e3:.3f} ms without "
          f"({(m_on - m_off) * 1e6:+.1f} us per step, {rounds} alternated rounds of {steps} steps)")


def launch_overhead(results: dict) -> None:
    """Wall time: plain torchrun vs diag check --nproc-per-node 2, same script and steps; and the
    straggler check's numbers on a planted 5x slower input pipeline."""
    env = _env()
    args = ["--steps", "30"]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        subprocess.run([PY, "-m", "torch.distributed.run", "--nproc-per-node=2", str(TRAIN), *args],
                       capture_output=True, env=env, check=True, cwd=tmp)
        plain = time.perf_counter() - t0
        diag_cmd = [PY, "-m", "diag", "check", "--nproc-per-node", "2", "--script", str(TRAIN), "--format", "json",
                    "--fail-on", "never"]
        t0 = time.perf_counter()
        subprocess.run([*diag_cmd, "--run-dir", "balanced", "--", *args], capture_output=True, env=env,
                       cwd=tmp, check=True)
        probed = time.perf_counter() - t0
        out = subprocess.run([*diag_cmd, "--run-dir", "straggler", "--", *args, "--slow-rank", "1",
                              "--slow-factor", "5"], capture_output=True, text=True, env=env, cwd=tmp, check=True)
    report = json.loads(out.stdout)
    f = next(x for x in report["findings"] if x["id"] == "distributed.straggler")
    results["torchrun_wall_s"] = round(plain, 2)
    results["diag_check_nproc2_wall_s"] = round(probed, 2)
    ev = f["evidence"]
    results["straggler_severity"] = f["severity"]
    results["straggler_rank"] = ev.get("rank")
    results["straggler_excess_ms"] = round(1000 * ev.get("excess_s", 0), 2)
    results["others_comm_wait_ms"] = round(1000 * ev.get("others_comm_wait_s", 0), 2)
    print(f"  plain torchrun {plain:.1f} s, diag check --nproc-per-node 2 {probed:.1f} s (the same 2-rank "
          "script, 30 steps)")
    print(f"  straggler: {f['severity']} rank {ev.get('rank')} {ev.get('phase')}: +{1000 * ev.get('excess_s', 0):.1f} ms "
          f"per step; the other rank's measured all-reduce wait {1000 * ev.get('others_comm_wait_s', 0):.1f} ms")


def run(results: dict) -> None:
    extension_overhead(results)
    launch_overhead(results)
