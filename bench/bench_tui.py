"""The TUI's own cost: CPU used by `diag tui` watching 8 simulated GPUs sampled every second, and its
time to first frame. The app runs for real, in a pseudo-terminal (140x40), as a user would run it.

    .venv/bin/python bench/run.py tui
    .venv/bin/python bench/bench_tui.py --seconds 30

Figures (results["tui"]):
  first_frame_s          from starting `python -m diag tui` to the first screen drawn (median of 3)
  first_frame_inproc_s   from DiagApp() to its first frame, textual already imported (median of 3)
  cpu_pct_gpus_tab       CPU of the whole diag process (UI + sampler thread), % of one core, GPUs tab shown
  cpu_pct_hidden_gpus    the same with the Cost tab shown (GPU panes hidden: they are not re-rendered)
  cpu_pct_live_run       diag's own CPU (the script's excluded) during a live run of a script that trains flat
                         out, Checks tab shown, evidence re-judged at most every 0.5 s
  sampler_ms_per_round   time the sampler spends per round for the 8 GPUs (inside the figures above)
"""
from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import select
import statistics
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COLS, ROWS = 140, 40


class PtyApp:
    """`python -m diag tui ...` in a pseudo-terminal; its output is drained continuously."""

    def __init__(self, *args: str):
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLS, 0, 0))
        env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(COLS), LINES=str(ROWS),
                   PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        env.pop("DIAG_SIMULATE_GPUS", None)
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "diag", "tui", *args], stdin=slave, stdout=slave,
                                     stderr=slave, env=env, cwd=str(REPO), start_new_session=True)
        os.close(slave)
        self.out = bytearray()

    def pump(self, seconds: float, until: bytes | None = None) -> float | None:
        """Read output for up to `seconds`; returns the time (since start) when `until` first appeared."""
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            r, _, _ = select.select([self.master], [], [], 0.05)
            if r:
                try:
                    chunk = os.read(self.master, 1 << 16)
                except OSError:
                    return None
                self.out += chunk
                if until is not None and until in self.out:
                    return time.perf_counter() - self.t0
        return None

    def send(self, keys: bytes) -> None:
        os.write(self.master, keys)

    def cpu_seconds(self) -> float:
        import psutil

        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system

    def close(self) -> None:
        try:
            self.send(b"q")
            self.pump(3.0)
            self.proc.wait(timeout=5)
        except Exception:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)


def first_frame_pty() -> float:
    app = PtyApp("--simulate-gpus", "healthy-8")
    try:
        t = app.pump(60.0, until=b"GPU monitor")
    finally:
        app.close()
    if t is None:
        raise RuntimeError("the app drew nothing within 60 s")
    return t


def first_frame_inproc() -> float:
    sys.path.insert(0, str(REPO))
    from diag.gpu import Sampler, SimulatedProvider
    from diag.tui.app import DiagApp
    from diag.tui.models.gpus import GpuFeed
    from diag.tui.live import Source

    async def go() -> float:
        t0 = time.perf_counter()
        prov = SimulatedProvider("healthy-8")
        app = DiagApp(Source(), GpuFeed(Sampler(prov, interval=1.0), own=True))
        async with app.run_test(size=(COLS, ROWS)) as pilot:
            while app.first_frame_at is None:
                await pilot.pause(0.01)
            return app.first_frame_at - t0

    return asyncio.run(go())


def cpu_share(tab_key: bytes, seconds: float) -> float:
    app = PtyApp("--simulate-gpus", "healthy-8", "--gpu-interval", "1")
    try:
        if app.pump(60.0, until=b"GPU monitor") is None:
            raise RuntimeError("the app drew nothing within 60 s")
        app.send(tab_key)
        app.pump(3.0)                      # warm up: first renders, caches
        c0, t0 = app.cpu_seconds(), time.perf_counter()
        app.pump(seconds)
        c1, t1 = app.cpu_seconds(), time.perf_counter()
    finally:
        app.close()
    return 100.0 * (c1 - c0) / (t1 - t0)


def cpu_share_live(seconds: float) -> tuple[float, int]:
    """diag's own CPU (not the script's) while a script trains flat out and the checks are re-judged."""
    script = str(REPO / "tests" / "scripts" / "spine_forever.py")
    app = PtyApp("--script", script, "--simulate-gpus", "healthy-8", "--", "0")
    try:
        if app.pump(60.0, until=b"step ") is None:
            raise RuntimeError("no step shown within 60 s")
        app.pump(3.0)
        c0, t0 = app.cpu_seconds(), time.perf_counter()
        app.pump(seconds)
        c1, t1 = app.cpu_seconds(), time.perf_counter()
        steps = 0
        text = app.out.decode("utf-8", "replace")
        import re

        found = re.findall(r"step (\d+)", text)
        steps = int(found[-1]) if found else 0
    finally:
        app.close()
    return 100.0 * (c1 - c0) / (t1 - t0), steps


def sampler_ms() -> float:
    sys.path.insert(0, str(REPO))
    from diag.gpu import Sampler, SimulatedProvider

    s = Sampler(SimulatedProvider("healthy-8"), interval=1.0)
    for _ in range(20):
        s.sample_once()
    return s.mean_sample_ms


def run(results: dict, seconds: float = 20.0) -> None:
    ff = sorted(first_frame_pty() for _ in range(3))
    results["first_frame_s"] = round(statistics.median(ff), 3)
    print(f"   time to first frame (python -m diag tui, 140x40 pty): {results['first_frame_s']:.2f} s "
          f"(runs: {', '.join(f'{x:.2f}' for x in ff)})", flush=True)
    fi = sorted(first_frame_inproc() for _ in range(3))
    results["first_frame_inproc_s"] = round(statistics.median(fi), 3)
    print(f"   first frame after DiagApp() (textual imported): {results['first_frame_inproc_s']:.3f} s", flush=True)
    results["cpu_pct_gpus_tab"] = round(cpu_share(b"1", seconds), 2)
    print(f"   CPU, 8 simulated GPUs every 1 s, GPUs tab shown: {results['cpu_pct_gpus_tab']:.1f}% of one core "
          f"(over {seconds:g} s)", flush=True)
    results["cpu_pct_hidden_gpus"] = round(cpu_share(b"2", seconds), 2)
    print(f"   CPU, same, Cost tab shown (GPU panes hidden): {results['cpu_pct_hidden_gpus']:.1f}% of one core",
          flush=True)
    live, steps = cpu_share_live(seconds)
    results["cpu_pct_live_run"] = round(live, 2)
    results["live_run_steps"] = steps
    print(f"   CPU of diag itself while a script trains ({steps} steps shown, 2000 kept) and the checks are "
          f"re-judged every 0.5 s: {live:.1f}% of one core", flush=True)
    results["sampler_ms_per_round"] = round(sampler_ms(), 3)
    print(f"   sampler round for 8 simulated GPUs: {results['sampler_ms_per_round']:.2f} ms", flush=True)
    results["seconds_measured"] = seconds
    results["terminal"] = f"{COLS}x{ROWS}"


if __name__ == "__main__":
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0)
    a = ap.parse_args()
    res: dict = {}
    run(res, a.seconds)
    print(json.dumps(res, indent=2))
