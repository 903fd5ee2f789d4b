"""diag attach's cost to the target: the step rate of a running training loop while py-spy samples it
(with diag attach's flags: --nonblocking --idle --subprocesses) against the rate in the windows just
before and after, at 20 Hz (diag attach's default) and 100 Hz (py-spy's default). Alternating windows
cancel the drift of a loaded machine; the figure is the median over repetitions. Also py-spy's own
CPU use (what sampling costs the machine rather than the target)."""
from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "tests" / "attach_targets" / "train_target.py"
WINDOW_S = float(os.environ.get("DIAG_BENCH_ATTACH_WINDOW", "5"))
REPEATS = int(os.environ.get("DIAG_BENCH_ATTACH_REPEATS", "3"))


def _count(progress: Path, t0: float, t1: float) -> int:
    n = 0
    for line in progress.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and t0 <= float(parts[1]) < t1:
            n += 1
    return n


def _cpu(pid: int) -> float:
    import psutil
    c = psutil.Process(pid).cpu_times()
    return c.user + c.system


def _window(progress: Path, pid: int, rate: int | None) -> tuple[float, float | None, float]:
    """Steps per second over one window, with py-spy sampling at `rate` (None: not sampled),
    py-spy's CPU% over it, and the target's CPU seconds per step."""
    sys.path.insert(0, str(ROOT))
    from diag.attach.pyspy import executable

    proc = None
    if rate:
        out = tempfile.mktemp(suffix=".json")
        proc = subprocess.Popen([executable(), "record", "--pid", str(pid), "--format", "speedscope", "-o", out,
                                 "--rate", str(rate), "--nonblocking", "--idle", "--subprocesses",
                                 "--duration", str(int(WINDOW_S + 2))],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)                     # py-spy's start-up is not the sampling cost
    t0 = time.time()
    c0 = _cpu(pid)
    time.sleep(WINDOW_S)
    t1 = time.time()
    c1 = _cpu(pid)
    cpu = None
    if proc:
        import psutil
        try:
            c = psutil.Process(proc.pid).cpu_times()
            cpu = 100 * (c.user + c.system) / (t1 - t0 + 1.0)
        except psutil.Error:
            pass
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        try:
            os.unlink(out)
        except OSError:
            pass
    steps = _count(progress, t0, t1)
    return steps / (t1 - t0), cpu, (c1 - c0) / max(1, steps)


def run(results: dict) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="diag-bench-attach-"))
    progress = tmp / "progress.txt"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    target = subprocess.Popen([sys.executable, str(TARGET), "steady", str(progress)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 180
        while not progress.exists() or len(progress.read_text().splitlines()) < 20:
            if target.poll() is not None or time.time() > deadline:
                raise RuntimeError("the benchmark's target did not start")
            time.sleep(0.3)
        time.sleep(2)
        out = {}
        for rate in (20, 100):
            ratios, cpus, base, cpu_ratios = [], [], [], []
            for _ in range(REPEATS):
                off1, _, c_off1 = _window(progress, target.pid, None)
                on, cpu, c_on = _window(progress, target.pid, rate)
                off2, _, c_off2 = _window(progress, target.pid, None)
                ref = (off1 + off2) / 2
                ratios.append(on / ref)
                cpu_ratios.append(c_on / ((c_off1 + c_off2) / 2))
                base.append(ref)
                if cpu is not None:
                    cpus.append(cpu)
            slow = 100 * (1 - statistics.median(ratios))
            out[f"rate_{rate}hz"] = {
                "steps_per_s_unsampled": round(statistics.median(base), 2),
                "ratio_sampled_over_unsampled": [round(r, 4) for r in ratios],
                "slowdown_pct_median": round(slow, 2),
                "target_cpu_per_step_ratio": [round(r, 4) for r in cpu_ratios],
                "target_cpu_per_step_change_pct_median": round(100 * (statistics.median(cpu_ratios) - 1), 2),
                "pyspy_cpu_pct_median": round(statistics.median(cpus), 2) if cpus else None,
            }
            print(f"attach: {rate:>3} Hz: target slowed by {slow:+.1f}% (median of {REPEATS}; ratios "
                  f"{', '.join(f'{r:.3f}' for r in ratios)}; {statistics.median(base):.1f} steps/s unsampled); "
                  f"target CPU per step {out[f'rate_{rate}hz']['target_cpu_per_step_change_pct_median']:+.1f}%; "
                  f"py-spy itself {out[f'rate_{rate}hz']['pyspy_cpu_pct_median']}% CPU")
        results["attach"] = {"window_s": WINDOW_S, "repeats": REPEATS, **out,
                             "cpu_count": os.cpu_count()}
    finally:
        try:
            os.killpg(target.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        target.wait()


if __name__ == "__main__":
    r: dict = {}
    run(r)
