"""Screenshots of every tab of `diag tui`, made from the real app: the bundled demo
(diag/demo/planted.py, copied into a scratch project as train.py) runs for real under the probe, with
simulated GPUs (labelled so on screen).

    .venv/bin/python scripts/screenshots.py                  # run the demo, write screenshots/*.svg and *.png
    .venv/bin/python scripts/screenshots.py --from tests/fixtures/tui/evidence.json   # no run: a saved one
    .venv/bin/python scripts/screenshots.py --no-png
    .venv/bin/python scripts/screenshots.py --html-only      # only screenshots/report-html.png (runs the demo)
    .venv/bin/python scripts/screenshots.py --try-budget 60  # the Try tab's trials get 60 s (default 120)

The Try tab's screenshot is taken after its trials (diag try on the knobs the demo's findings point
to) ran for real within --try-budget seconds; with --from it lists the knobs (a replay runs nothing).

The HTML report's screenshot (screenshots/report-html.png) is `diag check --format html` of the same run,
opened in headless Chromium (the Debian package chromium; scripts/install-browser.sh installs it).
PNG needs cairosvg (in the [test] extra). The SVGs name the Fira Code font; the PNGs are rendered with
DejaVu Sans Mono (a monospace font with the block characters the bars use).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TABS = ("checks", "steps", "gpus", "memory", "cost", "log", "try")
# the demo's arguments: 10 epochs (200 steps), enough for the Try tab's trials to reach verdicts (its
# switch knobs' run alternates blocks of 5 steps; the default 2 epochs end before 20 steps a side)
DEMO_ARGS = ["--epochs", "10"]
SIZE = (120, 36)


def _rel(p: Path) -> str:
    try:
        return str(p.relative_to(REPO))
    except ValueError:
        return str(p)


def _png(svg_path: Path) -> Path | None:
    try:
        import cairosvg
    except ImportError:
        print("cairosvg is not installed: SVG only (pip install cairosvg, or the [test] extra)", file=sys.stderr)
        return None
    svg = svg_path.read_text()
    svg = svg.replace('font-family: "Fira Code"', 'font-family: "DejaVu Sans Mono"')
    svg = svg.replace("font-family: Fira Code, monospace", "font-family: DejaVu Sans Mono, monospace")
    out = svg_path.with_suffix(".png")
    cairosvg.svg2png(bytestring=svg.encode(), write_to=str(out), output_width=1600)
    return out


async def _wait(pilot, cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit("screenshots: timed out waiting for the app")
        await pilot.pause(0.1)


async def _shoot(app, shots: list[tuple[str, str, tuple[int, int]]], out: Path, ready) -> list[Path]:
    """shots: (file stem, tab, size). One app per size (the layout depends on it)."""
    written: list[Path] = []
    by_size: dict[tuple[int, int], list[tuple[str, str]]] = {}
    for stem, tab, size in shots:
        by_size.setdefault(size, []).append((stem, tab))
    for size, items in by_size.items():
        a = app()
        async with a.run_test(size=size) as pilot:
            await ready(pilot)
            for stem, tab in items:
                a.query_one("#tabs").active = tab
                await pilot.pause(0.6)
                a.set_focus(None)
                await pilot.pause(0.2)
                path = out / f"{stem}.svg"
                path.write_text(a.export_screenshot(title=f"diag tui — {tab}"))
                written.append(path)
                print(f"  {_rel(path)}")
            await pilot.press("q")
    return written


def _run_demo(workdir: Path, scenario: str):
    """The bundled demo, run headless as `diag check` runs it (copied into a project as train.py, with
    simulated GPUs and the memory plan for an H100, as the TUI screenshots' run)."""
    import shutil

    from diag.commands.tui import memory_plan_env
    from diag.runner import Run, RunConfig

    os.chdir(workdir)
    shutil.copy(REPO / "diag" / "demo" / "planted.py", workdir / "train.py")
    run = Run(RunConfig(script=str(workdir / "train.py"), echo=None, simulate_gpus=scenario, gpu_interval=0.5,
                        env=memory_plan_env("h100")))
    print("running the demo for the HTML report ...")
    run.start()
    run.wait()
    return run.evidence


def _html_shot(evidence, out: Path) -> Path | None:
    """screenshots/report-html.png: the HTML report of ``evidence`` (what `diag check --format html`
    writes), opened in headless Chromium."""
    from diag.commands.check import exit_code_for
    from diag.registry import Registry
    from diag.report.browser import find_chromium, render, screenshot
    from diag.report.html import render_html

    if not find_chromium():
        print("no Chromium: screenshots/report-html.png not made (scripts/install-browser.sh installs it)",
              file=sys.stderr)
        return None
    findings = Registry.discover().run(evidence)
    page = Path(tempfile.mkdtemp(prefix="diag-html-")) / "report.html"
    page.write_text(render_html(evidence, findings, exit_code_for(evidence, findings, "error")), encoding="utf-8")
    status = render(page)
    if not status.ok:
        raise SystemExit(f"screenshots: the HTML report did not render cleanly: {status.errors or status.console_errors}")
    png = screenshot(page, out / "report-html.png", window=(1280, 2400))
    print(f"  {_rel(png)} (rendered in {status.body.get('data-render-ms')} ms, {page.stat().st_size:,} bytes)")
    return png


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from", dest="from_", help="use a saved evidence.json instead of running the demo")
    ap.add_argument("--out", default=str(REPO / "screenshots"))
    ap.add_argument("--scenario", default="healthy-8", help="simulated GPU scenario (default: healthy-8)")
    ap.add_argument("--no-png", action="store_true")
    ap.add_argument("--try-budget", type=float, default=120.0,
                    help="seconds for the Try tab's trials on the demo (default 120)")
    ap.add_argument("--html-only", action="store_true",
                    help="only the HTML report's screenshot (no TUI); runs the demo headless unless --from")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    from diag.gpu import Sampler, SimulatedProvider
    from diag.tui.app import DiagApp
    from diag.tui.live import ReplaySource, RunFeed, Source
    from diag.tui.models.gpus import GpuFeed
    from diag.tui.models.try_ import ReplayFeed

    workdir = Path(tempfile.mkdtemp(prefix="diag-screenshots-"))
    run_box: dict = {}
    if args.html_only:
        if args.from_:
            from diag.evidence import load_evidence

            evidence = load_evidence(args.from_)
        else:
            evidence = _run_demo(workdir, args.scenario)
        _html_shot(evidence, out)
        return 0

    if args.from_:
        from diag.evidence import load_evidence

        evidence = load_evidence(args.from_)

        def make_app():
            prov = SimulatedProvider(args.scenario, start=120.0)
            sampler = Sampler(prov, interval=1.0)
            for _ in range(60):
                sampler.sample_once()
            return DiagApp(ReplaySource(evidence, path=args.from_, label=args.from_),
                           GpuFeed(sampler, own=False), trials=ReplayFeed(evidence.run.script and "train.py"))

        async def ready(pilot):
            await _wait(pilot, lambda: pilot.app.state.snapshot is not None, 30)
    else:
        # the demo runs once (the first app); the other sizes replay what it recorded
        from diag.runner import Run, RunConfig

        def make_app():
            if "run" not in run_box:
                # as a user would: the demo copied into a project directory as train.py, run from
                # there, the run directory under .diag/runs/
                import shutil

                os.chdir(workdir)
                shutil.copy(REPO / "diag" / "demo" / "planted.py", workdir / "train.py")
                from diag.commands.tui import memory_plan_env

                cfg = RunConfig(script=str(workdir / "train.py"), args=list(DEMO_ARGS), echo=None,
                                simulate_gpus=args.scenario, gpu_interval=0.5,
                                env=memory_plan_env("h100"))        # as `diag tui --memory-plan h100`
                run = run_box["run"] = Run(cfg)
                from diag.commands.tui import TryFeed

                feed = TryFeed("train.py", list(DEMO_ARGS))
                feed.budget_s = args.try_budget
                return DiagApp(RunFeed(run), GpuFeed(run.sampler, own=False), refresh_s=0.3, tick_s=0.1,
                               trials=feed)
            run = run_box["run"]
            prov = SimulatedProvider(args.scenario, start=120.0)
            sampler = Sampler(prov, interval=1.0)
            for _ in range(60):
                sampler.sample_once()
            return DiagApp(ReplaySource(run.evidence, path=str(run.evidence_path),
                                        label=".diag/runs/" + run.run_dir.name + "/evidence.json"),
                           GpuFeed(sampler, own=False), trials=ReplayFeed("train.py"))

        async def ready(pilot):
            app = pilot.app
            await _wait(pilot, lambda: app.state.snapshot is not None and app.state.snapshot.final, 120)
            await pilot.pause(0.5)
            if app.trials is not None and app.trials.can_run:
                # the Try tab: its trials, for real, on the knobs the demo's findings point to
                app.query_one("#tabs").active = "try"
                await pilot.pause(0.5)
                pane = app.pane("try")
                if pane.start():
                    t0 = time.monotonic()
                    print(f"running the Try tab's trials ({args.try_budget:.0f} s budget) ...")
                    await _wait(pilot, lambda: not pane.running, args.try_budget + 300)
                    print(f"  trials {pane.model.status} in {time.monotonic() - t0:.0f} s: {pane.model.summary}")
                    await pilot.pause(0.5)

    shots = [(f"tui-{tab}", tab, SIZE) for tab in TABS] + [("tui-checks-80x24", "checks", (80, 24))]
    print(f"screenshots of the real app ({'replay of ' + args.from_ if args.from_ else 'the demo, run now'};"
          f" simulated GPUs '{args.scenario}'):")
    written = asyncio.run(_shoot(make_app, shots, out, ready))

    # the GPU monitor with its cost calculator (no script)
    def monitor_app():
        prov = SimulatedProvider("mig", start=120.0)
        sampler = Sampler(prov, interval=1.0)
        for _ in range(60):
            sampler.sample_once()
        return DiagApp(Source(), GpuFeed(sampler, own=False))

    async def monitor_ready(pilot):
        await pilot.pause(0.5)

    written += asyncio.run(_shoot(monitor_app, [("tui-monitor-gpus-mig", "gpus", SIZE),
                                                ("tui-monitor-cost", "cost", SIZE)], out, monitor_ready))
    evidence = run_box["run"].evidence if "run" in run_box else (load_evidence(args.from_) if args.from_ else None)
    if evidence is not None:
        _html_shot(evidence, out)
    if not args.no_png:
        for p in written:
            png = _png(p)
            if png is None:
                break
            print(f"  {_rel(png)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
