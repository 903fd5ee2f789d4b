"""The GPU validation run (driven by scripts/gpu-check.sh): everything in diag that needs a real NVIDIA
GPU, each part time-boxed, one summary at the end even when parts fail.

    python scripts/gpu_check.py [--dry-run] [--out DIR] [--only NAME,...] [--twins NAME,...] [--budget SECONDS]

Writes under DIR: figures.json (every measured figure and each part's verdict), logs/<part>.log,
reports/<workload>.json (the `diag check --format json` report of each workload). Exit 0 when every
part passed, 1 when one failed, 2 on bad usage.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CUDA = REPO / "tests" / "scripts" / "cuda"

# The CUDA twins of the planted corpus: (name, script, steps, env, expectation).
# expectation: {"fire": [ids that must be warning/error]} or {"pass": [ids that must not be]},
# plus optional "message" and "fix" substrings per id and "evidence" predicates (key, op, value) per id.
TWINS = [
    ("hidden_data_wait", "hidden_data_wait.py", 30, {},
     {"pass": ["dataloader.workers"], "evidence": {"dataloader.workers": [("clock", "==", "device")]}}),
    ("exposed_data_wait", "exposed_data_wait.py", 30, {},
     {"fire": ["dataloader.workers"], "evidence": {"dataloader.workers": [("clock", "==", "device"),
                                                                         ("gpu_idle_data_share", ">", 0.2)]}}),
    ("amp_unused", "amp_unused.py", 30, {}, {"fire": ["amp.unused"]}),
    ("fp16_no_scaler", "fp16_no_scaler.py", 30, {}, {"fire": ["amp.fp16-without-scaler"]}),
    ("eval_no_grad", "eval_no_grad.py", 30, {}, {"fire": ["eval.no-grad"]}),
    ("host_sync", "host_sync.py", 30, {}, {"fire": ["sync.host-device"]}),
    ("pageable_copies", "pageable_copies.py", 30, {},
     {"fire": ["dataloader.pin-memory"], "evidence": {"dataloader.pin-memory": [
         ("clock", "==", "device"), ("gpu_idle_pageable_copy_share", ">", 0.0)]}}),
    ("pinned_copies", "pinned_copies.py", 30, {},
     {"pass": ["dataloader.pin-memory"], "evidence": {"dataloader.pin-memory": [
         ("copies_device.pinned.copies_per_step", ">=", 1), ("copies_device.pageable.copies_per_step", "==", 0)]}}),
    ("checkpoint_save", "checkpoint_save.py", 30, {},
     {"evidence": {"gpu.idle": [("idle_causes.checkpoint", ">", 0.02), ("idle_causes.host", "<", 0.02)]}}),
    ("eval_pass", "eval_pass.py", 30, {},
     {"pass": ["dataloader.workers"], "evidence": {"gpu.idle": [("idle_causes.eval", ">", 0.02),
                                                                ("eval_share", ">", 0.02)]}}),
    ("cuda_oom", "cuda_oom.py", None, {"DIAG_MEMORY_ESTIMATE": "1"},
     {"fire": ["memory.oom"], "fix": {"memory.oom": "fits"},
      "evidence": {"memory.oom": [("batch_size", "==", 1 << 21)]}}),
    ("cudnn_benchmark_off", "cudnn_benchmark_off.py", 30, {}, {"fire": ["cudnn.benchmark"]}),
    ("tf32_off", "tf32_off.py", 30, {}, {"fire": ["matmul.tf32"]}),
    # issue 31: the framework twins (fixes in their words, no gain promised that cannot be predicted,
    # no convolution in GPT-2's Conv1D) and a short clean run that must stay quiet at the default interval
    ("hf_trainer_fp32", "hf_trainer_gpt2.py", None, {"TWIN_PRECISION": "fp32"},
     {"needs": "transformers", "pass": ["gpu.low-utilization", "cudnn.benchmark"],
      "fix": {"amp.unused": "TrainingArguments(bf16=True)", "matmul.tf32": "TrainingArguments(tf32=True)"},
      "evidence": {"gpu.low-utilization": [("samples", ">=", 10)]}}),
    ("hf_trainer_bf16", "hf_trainer_gpt2.py", None, {"TWIN_PRECISION": "bf16"},
     {"needs": "transformers", "pass": ["amp.unused", "matmul.tf32", "gpu.low-utilization", "cudnn.benchmark"]}),
    ("lightning_fp32", "lightning_mlp.py", None, {"TWIN_PRECISION": "fp32"},
     {"needs": "lightning", "fire": ["amp.unused"], "pass": ["gpu.low-utilization"],
      "fix": {"amp.unused": 'precision="bf16-mixed"', "matmul.tf32": "torch.set_float32_matmul_precision"}}),
    ("lightning_bf16", "lightning_mlp.py", None, {"TWIN_PRECISION": "bf16"},
     {"needs": "lightning", "pass": ["amp.unused", "matmul.tf32", "gpu.low-utilization"]}),
    ("short_clean", "short_clean.py", None, {},
     {"quiet": True, "evidence": {"gpu.low-utilization": [("samples", ">=", 10)]}}),
]

# issue 32: `diag try` measures the bf16 knob on the fp32 twin that amp.unused fires on (a matmul-bound MLP,
# 60 steps): (twin name in TWINS, script, env). Its twins-part report gives the predicted gain (amp.unused's
# min/max_step_speedup) and the evidence `diag try --from` takes (no first run of its own).
TRY_TWIN = ("amp_unused", "amp_unused.py", {})
TRY_KNOB = "amp.bf16"
TRY_BUDGET_S = 45      # diag try --budget: the switch run (blocks of 5 steps, bf16 off and on) of a 60-step script

# in order of priority: the slow, older gpu tests last, so that a squeezed budget cuts them first
PARTS = ["gpus", "twins", "try", "overhead", "mfu", "nvml_cost", "gpu_tests"]
# the most seconds a part may take (the twins stop starting workloads past theirs), so that one slow part
# cannot starve the ones after it; gpu_tests gets what is left
PART_BUDGET = {"gpus": 50, "twins": 300, "try": 75, "overhead": 140, "mfu": 90, "nvml_cost": 30}
DESCRIBE = {
    "gpus": "`diag gpus` and `diag gpus --json` on the real driver",
    "gpu_tests": "pytest -m gpu tests/test_gpu_real.py tests/test_memory_gpu.py (NVML on a real driver; memory "
                 "estimate vs max_memory_allocated on 3 models)",
    "twins": "`diag check --format json` on each CUDA twin of the planted corpus (tests/scripts/cuda/), "
             "expected findings checked: " + ", ".join(t[0] for t in TWINS),
    "overhead": "probe overhead on a steady-state CUDA step: tests/scripts/cuda/steady_bench.py plain vs under "
                "`diag check`, 3 paired runs, median",
    "mfu": "achieved MFU of a bf16 matmul-bound workload (cost.mfu) vs the catalogue peak, and a raw bf16 "
           "matmul's TFLOP/s",
    "nvml_cost": "NVML sampler cost: mean seconds per NvmlProvider.sample() over 200 calls",
    "try": f"`diag try --knob {TRY_KNOB} --format json --budget {TRY_BUDGET_S}s` on the fp32 twin "
           f"tests/scripts/cuda/{TRY_TWIN[1]}: the measured bf16 speed-up (95% interval, verdict; faster expected) "
           "beside the gain amp.unused predicted on the same twin",
}
TIMEOUT = {"gpus": 25, "gpu_tests": 180, "twin": 60, "overhead": 45, "mfu_raw": 30, "mfu": 60, "nvml_cost": 30,
           "try": 75}


class Run:
    def __init__(self, out: Path, budget: float):
        self.out = out
        self.logs = out / "logs"
        self.reports = out / "reports"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.reports.mkdir(parents=True, exist_ok=True)
        self.figures: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "parts": {}}
        self.t0 = time.monotonic()
        self.budget = budget
        self.diag = [sys.executable, "-m", "diag"]

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.t0)

    def sh(self, name: str, cmd: list[str], timeout: float, env: dict | None = None, cwd: Path | None = None):
        """Run a command with a time box; its output goes to logs/<name>.log. (rc, stdout, stderr, seconds)."""
        timeout = max(5.0, min(timeout, self.left() - 5))
        e = dict(os.environ)
        e.update(env or {})
        t = time.monotonic()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=e, cwd=str(cwd or REPO),
                               start_new_session=True)
            rc, so, se = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as x:
            rc = 124
            so = x.stdout.decode(errors="replace") if isinstance(x.stdout, bytes) else (x.stdout or "")
            se = (x.stderr.decode(errors="replace") if isinstance(x.stderr, bytes) else (x.stderr or "")) + \
                f"\n[gpu-check] timed out after {timeout:.0f} s\n"
        dt = time.monotonic() - t
        with open(self.logs / f"{name}.log", "a") as f:
            f.write(f"$ {' '.join(cmd)}\n[rc {rc}, {dt:.1f} s]\n--- stdout ---\n{so}\n--- stderr ---\n{se}\n")
        return rc, so, se, dt

    def part(self, name: str, ok: bool, **figures):
        self.figures["parts"][name] = {"ok": ok, **figures}
        self.save()

    def save(self):
        self.figures["elapsed_s"] = round(time.monotonic() - self.t0, 1)
        (self.out / "figures.json").write_text(json.dumps(self.figures, indent=1, default=str))


# ---- parts -------------------------------------------------------------------------------------------

def part_gpus(run: Run):
    rc, so, _, dt = run.sh("gpus", run.diag + ["gpus", "--no-processes"], TIMEOUT["gpus"])
    (run.out / "diag-gpus.txt").write_text(so)
    rcj, soj, _, _ = run.sh("gpus", run.diag + ["gpus", "--json"], TIMEOUT["gpus"])
    (run.out / "diag-gpus.json").write_text(soj)
    names = []
    try:
        names = [d.get("name") for d in json.loads(soj).get("devices", [])]
    except Exception:
        pass
    run.part("gpus", rc == 0 and rcj == 0 and bool(names), devices=names, seconds=round(dt, 1))


def part_gpu_tests(run: Run):
    rc, so, se, dt = run.sh("gpu_tests", [sys.executable, "-m", "pytest", "-q", "-s", "-m", "gpu", "-p", "no:cacheprovider",
                                         "tests/test_gpu_real.py", "tests/test_memory_gpu.py"], TIMEOUT["gpu_tests"])
    errors = []
    for m in re.finditer(r"(\S+): estimated ([\d.]+) MiB, measured ([\d.]+) MiB, error ([\d.]+)%", so):
        errors.append({"model": m.group(1), "estimated_mib": float(m.group(2)), "measured_mib": float(m.group(3)),
                       "error_pct": float(m.group(4))})
    tail = (so.strip().splitlines() or [""])[-1]
    run.part("gpu_tests", rc == 0, summary=tail, memory_estimate=errors, seconds=round(dt, 1))


def _findings(report: dict) -> dict:
    return {f["id"]: f for f in report.get("findings", [])}


def _cmp(v, op, ref) -> bool:
    try:
        return {"==": v == ref, ">": v > ref, "<": v < ref, ">=": v >= ref}[op]
    except TypeError:
        return False


def _get(d, key: str):
    """``d[a][b]`` for the key ``"a.b"`` (None where a level is missing)."""
    for k in key.split("."):
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def part_twins(run: Run):
    results = {}
    t0 = time.monotonic()
    for name, script, steps, env, expect in TWINS:
        if run.left() < 30 or time.monotonic() - t0 > PART_BUDGET["twins"] - 20:
            results[name] = {"ok": False, "why": "skipped: out of time"}
            continue
        if expect.get("needs") and importlib.util.find_spec(expect["needs"]) is None:
            results[name] = {"ok": True, "why": f"skipped: {expect['needs']} is not installed"}
            continue
        rep_path = run.reports / f"{name}.json"
        cmd = run.diag + ["check", "--script", str(CUDA / script), "--format", "json", "--fail-on", "never",
                          "--run-dir", str(run.out / "runs" / name), "--output", str(rep_path)]
        if steps:
            cmd[4:4] = ["--steps", str(steps)]
        rc, so, se, dt = run.sh(f"twin-{name}", cmd, TIMEOUT["twin"], env={"PYTHONPATH": str(CUDA), **env})
        res = {"rc": rc, "seconds": round(dt, 1)}
        try:
            report = json.loads(rep_path.read_text())
        except Exception as e:
            res.update(ok=False, why=f"no report ({type(e).__name__}); see logs/twin-{name}.log")
            results[name] = res
            continue
        fs = _findings(report)
        problems = []
        for cid in expect.get("fire", []):
            f = fs.get(cid)
            if f is None or f.get("severity") not in ("warning", "error"):
                problems.append(f"{cid} did not fire ({f.get('severity') if f else 'absent'}: "
                                f"{(f or {}).get('message', '')[:160]})")
        for cid in expect.get("pass", []):
            f = fs.get(cid)
            if f is not None and f.get("severity") in ("warning", "error"):
                problems.append(f"{cid} fired: {f.get('message', '')[:200]}")
        for cid, text in expect.get("message", {}).items():
            if text not in (fs.get(cid) or {}).get("message", ""):
                problems.append(f"{cid}'s message lacks {text!r}")
        for cid, text in expect.get("fix", {}).items():
            if text not in ((fs.get(cid) or {}).get("fix") or ""):
                problems.append(f"{cid}'s fix lacks {text!r}: {((fs.get(cid) or {}).get('fix') or '')[:300]}")
        for cid, preds in expect.get("evidence", {}).items():
            evd = (fs.get(cid) or {}).get("evidence", {})
            for key, op, ref in preds:
                if not _cmp(_get(evd, key), op, ref):
                    problems.append(f"{cid}.evidence.{key}={_get(evd, key)!r}, expected {op} {ref!r}")
        if expect.get("quiet"):
            loud = [cid for cid, f in fs.items() if f.get("severity") in ("warning", "error")]
            problems += [f"{cid} {fs[cid].get('severity')} on a clean run: {fs[cid].get('message', '')[:200]}"
                         for cid in loud]
        watched = set(expect.get("fire", [])) | set(expect.get("pass", [])) | set(expect.get("evidence", {}))
        watched |= set(expect.get("fix", {}))
        res["findings"] = {cid: {"severity": fs[cid].get("severity"), "message": fs[cid].get("message"),
                                 "fix": fs[cid].get("fix"), "evidence": fs[cid].get("evidence")}
                           for cid in watched if cid in fs}
        try:
            evp = Path(report["run"]["evidence"])
            tl = json.loads(evp.read_text())["ranks"][0].get("timeline") or {}
            res["timeline"] = {k: tl.get(k) for k in ("clock", "resolved", "dropped", "pending", "totals", "copies")}
        except Exception:
            pass
        res["ok"] = not problems
        if problems:
            res["problems"] = problems
        results[name] = res
    run.part("twins", all(r.get("ok") for r in results.values()), workloads=results)


def part_overhead(run: Run):
    pairs = []
    t0 = time.monotonic()
    for i in range(3):
        if run.left() < 40:
            break
        row = {}
        if i and time.monotonic() - t0 > PART_BUDGET["overhead"] - 35:
            break
        for mode in ("plain", "probe", "probe-nolane"):   # (nolane: the probe without its lane, issue 28)
            out = run.out / f"bench-{mode}-{i}.json"
            env = {"PYTHONPATH": str(CUDA), "BENCH_OUT": str(out)}
            if mode == "probe-nolane":
                env["DIAG_PROBE_LANE"] = "0"
            if mode == "plain":
                cmd = [sys.executable, str(CUDA / "steady_bench.py")]
            else:
                cmd = run.diag + ["check", "--script", str(CUDA / "steady_bench.py"), "--format", "json",
                                  "--fail-on", "never", "--run-dir", str(run.out / "runs" / f"bench-{mode}-{i}"),
                                  "--output", str(run.reports / f"bench-{mode}-{i}.json")]
            rc, _, _, _ = run.sh(f"overhead-{mode}", cmd, TIMEOUT["overhead"], env=env)
            try:
                row[mode] = json.loads(out.read_text())["step_ms"]
            except Exception:
                row[mode] = None
        pairs.append(row)
    ok_pairs = [p for p in pairs if p.get("plain") and p.get("probe")]
    if not ok_pairs:
        run.part("overhead", False, pairs=pairs, why="no complete pair")
        return
    ratios = [p["probe"] / p["plain"] - 1 for p in ok_pairs]
    med = statistics.median(ratios)
    nolane = [p["probe-nolane"] / p["plain"] - 1 for p in ok_pairs if p.get("probe-nolane")]
    run.part("overhead", med < 0.01, pairs=pairs, overhead_pct=round(med * 100, 3),
             overhead_nolane_pct=round(statistics.median(nolane) * 100, 3) if nolane else None,
             step_ms_plain=statistics.median(p["plain"] for p in ok_pairs), budget_pct=1.0)


def _predicted(run: Run, twin: str) -> tuple[dict, str | None]:
    """amp.unused's predicted gain on ``twin`` (from its twins-part report) and the evidence path of that
    run (for ``diag try --from``), or ({}, None) where the twins part did not run it."""
    try:
        report = json.loads((run.reports / f"{twin}.json").read_text())
    except Exception:
        return {}, None
    f = _findings(report).get("amp.unused") or {}
    e = f.get("evidence") or {}
    basis = e.get("speedup_basis") or {}
    pred = {"severity": f.get("severity"), "min_step_speedup": e.get("min_step_speedup"),
            "max_step_speedup": e.get("max_step_speedup"), "predictable": basis.get("predictable"),
            "launch_bound": basis.get("launch_bound"), "forward_backward_share": e.get("forward_backward_share"),
            "message": f.get("message")} if f else {}
    evidence = _get(report, "run.evidence")
    return pred, (evidence if evidence and Path(evidence).exists() else None)


def part_try(run: Run):
    """diag try on the fp32 twin: the measured bf16 speed-up beside the predicted one (issue 32)."""
    twin, script, env = TRY_TWIN
    pred, evidence = _predicted(run, twin)
    rep_path = run.reports / f"try-{twin}.json"
    cmd = run.diag + ["try", "--script", str(CUDA / script), "--knob", TRY_KNOB, "--budget", f"{TRY_BUDGET_S}s",
                      "--steps", "20", "--format", "json", "--output", str(rep_path)]
    if evidence:
        cmd[4:4] = ["--from", evidence]      # the twins part's run is the first run: no start-up paid again
    work = run.out / "try-work"      # diag try copies its working directory for each run: an empty one
    work.mkdir(parents=True, exist_ok=True)
    rc, so, se, dt = run.sh(f"try-{twin}", cmd, TIMEOUT["try"], env={"PYTHONPATH": str(CUDA), **env}, cwd=work)
    path = CUDA / script
    shown = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
    res = {"twin": twin, "script": shown, "knob": TRY_KNOB, "rc": rc,
           "seconds": round(dt, 1), "predicted": pred, "from_twin_run": bool(evidence)}
    try:
        report = json.loads(rep_path.read_text())
    except Exception as e:
        last = (se.strip().splitlines() or ["no output"])[-1]
        run.part("try", False, why=f"no diag try report ({type(e).__name__}, rc {rc}): {last[:300]}; "
                                   f"see logs/try-{twin}.log", **res)
        return
    trial = next((t for t in report.get("trials") or [] if TRY_KNOB in (t.get("knobs") or [])), None)
    runs = report.get("runs") or []
    res.update(device=report.get("device"), summary=report.get("summary"),
               clock="device" if runs and all(r.get("clock") == "device" for r in runs) else "wall")
    if trial is None:
        nt = next((n for n in report.get("not_tried") or [] if n.get("knob") == TRY_KNOB), {})
        run.part("try", False, why=f"{TRY_KNOB} was not tried: {nt.get('verdict', '?')}: {nt.get('why', '')}"[:400],
                 **res)
        return
    res.update({k: trial.get(k) for k in ("verdict", "speedup", "ci_low", "ci_high", "steps", "baseline_steps",
                                          "runs", "step_s", "baseline_step_s", "loss_change", "why")})
    problems = []
    if not str(report.get("device") or "").startswith("cuda"):
        problems.append(f"the trial ran on {report.get('device') or 'no device'}, not a GPU: not a GPU figure")
    if trial.get("verdict") != "faster":
        problems.append(f"{TRY_KNOB} was {trial.get('verdict')} ({trial.get('why')}); faster expected on a "
                        "matmul-bound fp32 twin")
    if problems:
        res["problems"] = problems
    run.part("try", not problems, **res)


RAW_MATMUL = """
import json, time, torch
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16); b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(5): a @ b
torch.cuda.synchronize(); t = time.perf_counter(); k = 50
for _ in range(k): a @ b
torch.cuda.synchronize(); dt = time.perf_counter() - t
print(json.dumps({"tflops": 2 * n ** 3 * k / dt / 1e12, "device": torch.cuda.get_device_name()}))
"""


def part_mfu(run: Run):
    rc, so, _, _ = run.sh("mfu-raw", [sys.executable, "-c", RAW_MATMUL], TIMEOUT["mfu_raw"])
    raw = None
    try:
        raw = json.loads(so.strip().splitlines()[-1])
    except Exception:
        pass
    rep_path = run.reports / "bf16_mfu.json"
    rc2, _, _, _ = run.sh("mfu", run.diag + ["check", "--script", str(CUDA / "bf16_mfu.py"), "--steps", "30",
                                            "--format", "json", "--fail-on", "never", "--select", "cost.mfu",
                                            "--run-dir", str(run.out / "runs" / "bf16_mfu"), "--output", str(rep_path)],
                          TIMEOUT["mfu"], env={"PYTHONPATH": str(CUDA)})
    f = {}
    try:
        f = _findings(json.loads(rep_path.read_text())).get("cost.mfu", {})
    except Exception:
        pass
    e = f.get("evidence") or {}
    run.part("mfu", bool(e.get("mfu")), raw_bf16_matmul=raw, mfu=e.get("mfu"), mfu_busy=e.get("mfu_busy"),
             achieved_tflops=e.get("achieved_tflops"), peak_tflops=e.get("peak_tflops"), gpu=e.get("gpu"),
             message=f.get("message"))


NVML_COST = """
import json, time
from diag.gpu.nvml import NvmlProvider
p = NvmlProvider()
assert p.available, p.reason
p.sample()
t = time.perf_counter(); n = 200
for _ in range(n): p.sample()
dt = time.perf_counter() - t
print(json.dumps({"per_sample_ms": dt / n * 1e3, "devices": len(p.devices())}))
"""


def part_nvml_cost(run: Run):
    rc, so, _, _ = run.sh("nvml_cost", [sys.executable, "-c", NVML_COST], TIMEOUT["nvml_cost"])
    try:
        d = json.loads(so.strip().splitlines()[-1])
    except Exception:
        d = {}
    run.part("nvml_cost", rc == 0 and bool(d), **d)


def readme_figures(figures: dict) -> dict:
    """The figures the README's "GPU truth" section quotes, in one place (figures.json's ``readme``)."""
    parts = figures.get("parts", {})
    tw = parts.get("twins", {}).get("workloads", {})

    def ev(w, cid, key):
        return _get(((tw.get(w) or {}).get("findings") or {}).get(cid, {}).get("evidence") or {}, key)

    ov, mfu, gt, nv = (parts.get(k, {}) for k in ("overhead", "mfu", "gpu_tests", "nvml_cost"))

    def _try_figures(t: dict) -> dict | None:
        if not t:
            return None
        pred = t.get("predicted") or {}
        return {"twin": t.get("twin"), "verdict": t.get("verdict"), "measured_speedup": t.get("speedup"),
                "ci_low": t.get("ci_low"), "ci_high": t.get("ci_high"), "steps": t.get("steps"),
                "clock": t.get("clock"), "predicted_low": pred.get("min_step_speedup"),
                "predicted_high": pred.get("max_step_speedup"), "why": t.get("why")}
    return {
        "date": figures.get("started"), "gpu": figures.get("device"), "torch": figures.get("torch"),
        "parts_ok": sorted(k for k, v in parts.items() if v.get("ok")),
        "parts_failed": sorted(k for k, v in parts.items() if not v.get("ok")),
        "probe_overhead_pct": ov.get("overhead_pct"), "steady_step_ms": ov.get("step_ms_plain"),
        "mfu_wall": mfu.get("mfu"), "mfu_busy": mfu.get("mfu_busy"), "achieved_tflops": mfu.get("achieved_tflops"),
        "peak_tflops": mfu.get("peak_tflops"),
        "raw_bf16_matmul_tflops": (mfu.get("raw_bf16_matmul") or {}).get("tflops"),
        "memory_estimate_error_pct": {e["model"]: e["error_pct"] for e in gt.get("memory_estimate", [])},
        "nvml_sample_ms": nv.get("per_sample_ms"),
        "bf16_try": _try_figures(parts.get("try") or {}),
        "twins_ok": f"{sum(1 for r in tw.values() if r.get('ok'))}/{len(tw)}" if tw else None,
        "twins_failed": sorted(k for k, r in tw.items() if not r.get("ok")),
        "timeline": {
            "hidden_data_wait": {k: ev("hidden_data_wait", "dataloader.workers", k)
                                 for k in ("gpu_idle_share", "gpu_idle_data_share", "host_data_share")},
            "exposed_data_wait": {k: ev("exposed_data_wait", "dataloader.workers", k)
                                  for k in ("gpu_idle_share", "gpu_idle_data_share", "host_data_share")},
            "pageable_copy_gb_per_s": ev("pageable_copies", "dataloader.pin-memory", "copies_device.pageable.gb_per_s"),
            "pageable_copy_idle_share": ev("pageable_copies", "dataloader.pin-memory", "gpu_idle_pageable_copy_share"),
            "pinned_copy_gb_per_s": ev("pinned_copies", "dataloader.pin-memory", "copies_device.pinned.gb_per_s"),
            "pinned_copy_idle_share": ev("pinned_copies", "dataloader.pin-memory", "gpu_idle_pinned_copy_share"),
            "checkpoint_idle_share": ev("checkpoint_save", "gpu.idle", "idle_causes.checkpoint"),
            "eval_idle_share": ev("eval_pass", "gpu.idle", "idle_causes.eval"),
            "eval_device_share": ev("eval_pass", "gpu.idle", "eval_share"),
        },
    }


FUNCS = {"gpus": part_gpus, "gpu_tests": part_gpu_tests, "twins": part_twins, "try": part_try,
         "overhead": part_overhead, "mfu": part_mfu, "nvml_cost": part_nvml_cost}


def summary(run: Run) -> str:
    lines = [f"gpu-check: {run.figures.get('device', '?')}, {run.figures['elapsed_s']} s"]
    for name in PARTS:
        p = run.figures["parts"].get(name)
        if p is None:
            lines.append(f"  {name:<10} not run")
            continue
        mark = "ok  " if p.get("ok") else "FAIL"
        extra = ""
        if name == "overhead":
            extra = f"overhead {p.get('overhead_pct')}% of a {p.get('step_ms_plain')} ms step (budget 1%)"
        elif name == "mfu":
            extra = (f"MFU {p.get('mfu')} (busy {p.get('mfu_busy')}), raw bf16 matmul "
                     f"{(p.get('raw_bf16_matmul') or {}).get('tflops')} TFLOP/s, peak {p.get('peak_tflops')}")
        elif name == "nvml_cost":
            extra = f"{p.get('per_sample_ms')} ms per sample"
        elif name == "gpu_tests":
            extra = f"{p.get('summary')}; memory estimate errors " + ", ".join(
                f"{e['model']} {e['error_pct']}%" for e in p.get("memory_estimate", []))
        elif name == "gpus":
            extra = ", ".join(map(str, p.get("devices", [])))
        elif name == "try":
            pred = p.get("predicted") or {}
            said = (f"predicted {pred.get('min_step_speedup') or '?'}-{pred.get('max_step_speedup')}x"
                    if pred.get("max_step_speedup") else "no predicted gain (the twin's amp.unused said none)")
            extra = (f"{p.get('twin')}: {p.get('knob')} measured {p.get('speedup'):.2f}x "
                     f"({p.get('ci_low'):.2f}-{p.get('ci_high'):.2f}) {p.get('verdict')}, {said}"
                     if p.get("speedup") is not None and p.get("ci_low") is not None
                     else f"{p.get('twin')}: {p.get('verdict') or 'no trial'}")
            trouble = p.get("problems") or ([p["why"]] if not p.get("ok") and p.get("why") else [])
            if trouble:
                extra += "; " + "; ".join(trouble)[:300]
        lines.append(f"  {name:<10} {mark} {extra}")
        if name == "twins":
            t = (run.figures.get("readme") or {}).get("timeline") or {}
            if t:
                h, e = t.get("hidden_data_wait") or {}, t.get("exposed_data_wait") or {}
                lines.append(f"    device clock: hidden wait GPU idle {h.get('gpu_idle_share')} (host data "
                             f"{h.get('host_data_share')}); exposed GPU idle for data {e.get('gpu_idle_data_share')}; "
                             f"copies pageable {t.get('pageable_copy_gb_per_s')} GB/s, pinned "
                             f"{t.get('pinned_copy_gb_per_s')} GB/s; checkpoint idle {t.get('checkpoint_idle_share')}; "
                             f"eval idle {t.get('eval_idle_share')}")
        if name == "twins":
            for w, r in p.get("workloads", {}).items():
                lines.append(f"    {w:<22} {'ok  ' if r.get('ok') else 'FAIL'} "
                             + ("; ".join(r.get("problems", [])) or r.get("why", ""))[:300])
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gpu-check")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out")
    ap.add_argument("--only", default="")
    ap.add_argument("--budget", type=float, default=450.0, help="seconds for all parts (default 450)")
    ap.add_argument("--twins", default="", help="run only these twins (names, comma-separated): a rerun after a fix")
    a = ap.parse_args(argv)
    only = [p for p in a.only.split(",") if p]
    names = [t[0] for t in TWINS]
    picked = [t for t in a.twins.split(",") if t]
    if [t for t in picked if t not in names]:
        print(f"gpu-check: unknown twin {', '.join(t for t in picked if t not in names)}; twins: {', '.join(names)}",
              file=sys.stderr)
        return 2
    if picked:
        TWINS[:] = [t for t in TWINS if t[0] in picked]
    bad = [p for p in only if p not in PARTS]
    if bad:
        print(f"gpu-check: unknown part {', '.join(bad)}; parts: {', '.join(PARTS)}", file=sys.stderr)
        return 2
    parts = only or PARTS
    if a.dry_run:
        print(f"gpu-check would run, within {a.budget:.0f} s, writing under {a.out}/:")
        for p in parts:
            cap = f" [at most {PART_BUDGET[p]} s]" if p in PART_BUDGET else " [the time left]"
            print(f"  {p:<10} {DESCRIBE[p]}{cap}")
            if p == "twins":
                for name, script, steps, env, expect in TWINS:
                    what = ", ".join((["no warning or error at all"] if expect.get("quiet") else []) +
                                     ([f"needs {expect['needs']}"] if expect.get("needs") else []) +
                                     [f"{c} fires" for c in expect.get("fire", [])] +
                                     [f"{c} passes" for c in expect.get("pass", [])] +
                                     [f"{c}'s fix says {t!r}" for c, t in expect.get("fix", {}).items()] +
                                     [f"{c}.{k} {op} {ref}" for c, preds in expect.get("evidence", {}).items()
                                      for k, op, ref in preds])
                    tag = " ".join(f"{k}={v}" for k, v in env.items() if k.startswith("TWIN_"))
                    print(f"    {name:<22} tests/scripts/cuda/{script}{f' --steps {steps}' if steps else ''}"
                          f"{f' ({tag})' if tag else ''}: {what}")
        return 0
    out = Path(a.out)
    if out.exists() and not out.is_dir():
        print(f"gpu-check: {out} exists and is not a directory", file=sys.stderr)
        return 2
    run = Run(out, a.budget)
    try:
        import torch

        run.figures["torch"] = torch.__version__
        run.figures["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    except Exception as e:
        run.figures["device"] = None
        run.figures["torch_error"] = f"{type(e).__name__}: {e}"
    if not run.figures["device"]:
        print("gpu-check: no CUDA device visible to torch; nothing to validate (use --dry-run on a CPU machine).",
              file=sys.stderr)
        run.save()
        return 2
    for p in parts:
        try:
            FUNCS[p](run)
        except Exception as e:   # one part failing never stops the others
            run.part(p, False, why=f"{type(e).__name__}: {e}")
    run.figures["readme"] = readme_figures(run.figures)
    run.save()
    text = summary(run)
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    return 0 if all(p.get("ok") for p in run.figures["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
