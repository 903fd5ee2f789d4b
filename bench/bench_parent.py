"""diag's own process while a script runs (issue 28, thirteenth pass in docs/performance.md).

On a machine whose cores the training job fills, what diag's parent process spends (the events thread
reading and folding the probe's events, the evidence rewrites, the GPU/host sampler, the process-tree
scans) is taken from the job: on karpathy/minGPT's adder it was most of what the job lost under
``diag check``. Two parts:

- **live**: ``diag check`` runs ``bench/workloads/wall_steps.py`` (a short CPU step: hundreds of step
  events a second, the follower's worst case) and its CPU is read from ``/proc/<pid>/stat`` (utime +
  stime, every thread of diag's process, none of the script's) 20 times a second: the whole run, the
  first seconds, what follows the script's end (the checks, the report), and, while the script runs
  after its first seconds, the per-second deltas (median and mean, the mean including the evidence
  rewrites) and the CPU per step event (step events counted from the events file as they are written);
- **offline**: that run's events file replayed the way the events thread reads it (chunks of the
  lines one poll sees, decoded and folded into a fresh Evidence), and the finished evidence written
  indented and compact, copied and rebuilt.

    .venv/bin/python bench/bench_parent.py [--steps 6000] [--calls 100] [--tree DIR]
    .venv/bin/python bench/run.py parent

``--tree DIR``: the diag source tree that ``diag check`` runs and whose replay is timed (default: this
one), e.g. a worktree of an earlier commit for a before/after pair.
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
TICK = os.sysconf("SC_CLK_TCK")


def _cpu_s(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK      # utime, stime (fields 14, 15)


def _has_child(pid: int) -> bool:
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                if f.read().strip():
                    return True
    except OSError:
        pass
    return False


class _StepCounter:
    """Step events written so far (the run's events files, read on from where the last count ended)."""

    def __init__(self, runs: Path):
        self.runs = runs
        self.offsets: dict[Path, int] = {}
        self.n = 0

    def count(self) -> int:
        from diag.runner import read_lines_from

        for path in self.runs.glob("*/events.rank*.jsonl"):
            chunk, self.offsets[path] = read_lines_from(path, self.offsets.get(path, 0))
            self.n += chunk.count(b'"kind": "step"')
        return self.n


def live(steps: int, calls: int, tree: Path = ROOT, settle_s: float = 5.0) -> tuple[dict, Path, Path]:
    work = Path(tempfile.mkdtemp(prefix="diag-bench-parent-"))
    shutil.copy(HERE / "workloads" / "wall_steps.py", work / "wall_steps.py")
    cmd = [sys.executable, "-m", "diag", "check", "--script", "wall_steps.py", "--",
           "--calls", str(calls), "--steps", str(steps), "--warm", "300"]
    env = dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    steps = _StepCounter(work / ".diag" / "runs")
    with open(work / "output.txt", "wb") as log:     # (a file: a pipe nobody reads could fill and stall diag)
        p = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
        series: list[tuple[float, float, int]] = []   # (seconds, diag's CPU, step events) every second
        last = during = 0.0          # diag's CPU at the last read, and at the last read the script ran
        next_at = 0.0
        while p.poll() is None:      # read 20 times a second: little of diag's report falls after the last
            c = _cpu_s(p.pid)
            if c is not None:
                last = c
                if _has_child(p.pid):
                    during = c
                    now = time.monotonic() - t0
                    if now >= next_at:
                        series.append((now, c, steps.count()))
                        next_at = now + 1.0
            time.sleep(0.05)
        p.wait()
    out = (work / "output.txt").read_text(errors="replace")
    if p.returncode not in (0, 1):
        raise SystemExit(f"bench_parent: diag check exited {p.returncode}:\n{out[-2000:]}")
    run_dir = sorted((work / ".diag" / "runs").iterdir())[-1]
    n_steps = steps.count()
    wall = time.monotonic() - t0
    total = last            # (read before the process was reaped: at most its last 50 ms are missed)
    steady = [x for x in series if x[0] >= settle_s]
    deltas = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in zip(steady, steady[1:])]
    per_event = (1e6 * (steady[-1][1] - steady[0][1]) / (steady[-1][2] - steady[0][2])
                 if len(steady) > 1 and steady[-1][2] > steady[0][2] else None)
    res = {
        "run_s": round(wall, 1),
        "parent_cpu_s": round(total, 2),
        "parent_cpu_share_pct": round(100 * total / wall, 2) if wall else None,
        "first_seconds_cpu_s": round(steady[0][1] if steady else during, 2),
        "after_the_script_cpu_s": round(total - during, 2),
        "steady_median_pct": round(100 * statistics.median(deltas), 2) if deltas else None,
        "steady_mean_pct": round(100 * statistics.fmean(deltas), 2) if deltas else None,
        "step_events": n_steps,
        "steady_step_events_per_s": (round((steady[-1][2] - steady[0][2]) / (steady[-1][0] - steady[0][0]))
                                     if len(steady) > 1 else None),
        "steady_cpu_per_step_event_us": round(per_event, 1) if per_event is not None else None,
    }
    return res, run_dir, work


def offline(run_dir: Path, tree: Path | None = None, lines_per_poll: int = 10) -> dict:
    if tree is not None and tree != ROOT:
        # another tree's diag, in a process of its own (this one has imported this tree's)
        r = subprocess.run([sys.executable, __file__, "--replay", str(run_dir), "--tree", str(tree)],
                           capture_output=True, text=True, check=True)
        return json.loads(r.stdout)
    from diag import __version__
    from diag.evidence import Evidence
    from diag.fold import fold
    try:
        from diag.runner import _decode_lines
    except ImportError:                  # a tree from before the thirteenth pass: a line at a time
        def _decode_lines(chunk: bytes) -> list:
            return [json.loads(ln) for ln in chunk.decode().splitlines() if ln.strip()]

    raw = b"".join(p.read_bytes() for p in sorted(run_dir.glob("events.rank*.jsonl")))
    lines = raw.splitlines(keepends=True)
    chunks = [b"".join(lines[i:i + lines_per_poll]) for i in range(0, len(lines), lines_per_poll)]
    evd = Evidence(diag_version=__version__)
    t = time.perf_counter()
    n = 0
    for chunk in chunks:
        for e in _decode_lines(chunk):
            if isinstance(e, dict):
                e.pop("run", None)
                fold(evd, e)
                n += 1
    read_s = time.perf_counter() - t
    final = Evidence.from_dict(json.loads((run_dir / "evidence.json").read_text()))

    def best(fn, k=5):
        out = []
        for _ in range(k):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        return min(out)

    d = final.to_dict()
    return {
        "events": n,
        "read_decode_fold_us_per_event": round(1e6 * read_s / max(1, n), 1),
        "evidence_json_bytes": len(final.to_json()),
        "to_json_indented_ms": round(1e3 * best(final.to_json), 1),
        "to_json_compact_ms": (round(1e3 * best(lambda: final.to_json(indent=None)), 1)
                               if "indent" in inspect.signature(final.to_json).parameters else None),
        "to_dict_ms": round(1e3 * best(final.to_dict), 1),
        "from_dict_ms": round(1e3 * best(lambda: Evidence.from_dict(d)), 1),
    }


def run(results: dict, steps: int = 6000, calls: int = 100, tree: Path = ROOT) -> None:
    res, run_dir, work = live(steps, calls, tree)
    try:
        results["live"] = res
        print(f"   diag check, {res['step_events']} step events in {res['run_s']} s: parent CPU "
              f"{res['parent_cpu_s']} s ({res['parent_cpu_share_pct']}% of a core; steady median "
              f"{res['steady_median_pct']}%, mean {res['steady_mean_pct']}% with the rewrites; first "
              f"seconds {res['first_seconds_cpu_s']} s, after the script {res['after_the_script_cpu_s']} s); steady: "
              f"{res['steady_cpu_per_step_event_us']} us a step event at {res['steady_step_events_per_s']} a second")
        off = offline(run_dir, tree)
        results["offline"] = off
        print(f"   replay: {off['events']} events, {off['read_decode_fold_us_per_event']} us an event read, "
              f"decoded and folded; evidence {off['evidence_json_bytes']} bytes: indented "
              f"{off['to_json_indented_ms']} ms, compact {off['to_json_compact_ms']} ms, to_dict "
              f"{off['to_dict_ms']} ms, from_dict {off['from_dict_ms']} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--tree", type=Path, default=ROOT, help="the diag source tree to measure (default: this one)")
    ap.add_argument("--replay", type=Path, help=argparse.SUPPRESS)   # (offline() for another tree)
    a = ap.parse_args()
    tree = a.tree.resolve()
    if a.replay is not None:
        sys.path.insert(0, str(tree))      # (nothing of diag imported yet: the tree's is the one found)
        print(json.dumps(offline(a.replay)))
        sys.exit(0)
    out: dict = {}
    run(out, a.steps, a.calls, tree)
    print(json.dumps(out, indent=2))
