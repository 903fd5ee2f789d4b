"""Snapshot tests of every tab at 80x24 and 140x40: the recorded demo run (tests/fixtures/tui), simulated
GPUs and a frozen clock. Update after an intended change with
``.venv/bin/pytest tests/test_tui_snapshots.py --snapshot-update`` and look at the SVGs in
tests/__snapshots__/test_tui_snapshots/ (or the HTML report pytest writes on failure)."""
from __future__ import annotations

import difflib
import html
import re
from pathlib import Path

import pytest

from tui_support import freeze_catalogue, monitor_app, replay_app

SIZES = {"80x24": (80, 24), "140x40": (140, 40)}
TABS = ("checks", "steps", "gpus", "memory", "cost", "log")


@pytest.fixture(autouse=True)
def _frozen_catalogue(monkeypatch):
    freeze_catalogue(monkeypatch)
    # paths on screen are shown relative to the working directory: the same in every checkout
    monkeypatch.chdir(Path(__file__).resolve().parent.parent)


async def _judged(pilot) -> None:
    """Wait until the findings are in and the screen has settled: two frames a tick apart are the
    same. A slow machine (a cold CI runner) only makes this take longer, never changes the picture."""
    app = pilot.app
    for _ in range(600):
        if app.mode == "monitor" or (app.state.snapshot is not None and not app._evaluating):
            break
        await pilot.pause(0.05)
    else:
        pytest.fail("the app did not judge the recorded run within 30 s")
    previous = None
    for _ in range(100):
        await pilot.pause(app.tick_s + 0.05)
        await pilot.wait_for_scheduled_animations()
        frame = app.export_screenshot()
        if frame == previous:
            app.settled_frame = frame
            return
        previous = frame
    pytest.fail("the screen did not settle within 30 s")


def svg_lines(svg: str) -> list[str]:
    """The text of a Textual SVG screenshot, a line per terminal row."""
    rows: dict[float, list[tuple[float, str]]] = {}
    for attrs, body in re.findall(r"<text([^>]*)>(.*?)</text>", svg, flags=re.S):
        y = re.search(r'\by="([\d.]+)"', attrs)
        x = re.search(r'\bx="([\d.]+)"', attrs)
        if y:
            rows.setdefault(float(y.group(1)), []).append(
                (float(x.group(1)) if x else 0.0, html.unescape(re.sub(r"<[^>]+>", "", body))))
    return ["".join(t for _, t in sorted(parts)).replace("\xa0", " ").rstrip()
            for _, parts in sorted(rows.items())]


def check_snapshot(snap_compare, request, app, size) -> None:
    """snap_compare, and on a mismatch a message that shows what changed on screen (CI keeps the
    test output, not the HTML report)."""
    __tracebackhide__ = True
    if snap_compare(app, terminal_size=size, run_before=_judged):
        return
    saved = Path(__file__).parent / "__snapshots__" / Path(__file__).stem / f"{request.node.name}.svg"
    now = getattr(app, "settled_frame", None)
    if now is None or not saved.exists():
        pytest.fail("the snapshot does not match (see snapshot_report.html)")
    diff = list(difflib.unified_diff(svg_lines(saved.read_text()), svg_lines(now), "saved", "now",
                                     lineterm="", n=1))
    if not diff:
        pytest.fail("the snapshot does not match: the same text, different colours or styles "
                    "(see snapshot_report.html)")
    pytest.fail("the snapshot does not match; the text that changed:\n" + "\n".join(diff))


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("tab", TABS)
def test_tab(snap_compare, request, tab, size):
    check_snapshot(snap_compare, request, replay_app(tab), SIZES[size])


def test_gpu_monitor_mig(snap_compare, request):
    check_snapshot(snap_compare, request, monitor_app("mig"), (140, 40))


def test_gpu_monitor_no_gpu(snap_compare, request):
    check_snapshot(snap_compare, request, monitor_app("none"), (80, 24))


def test_cost_tab_cpu_run(snap_compare, request):
    """The recorded demo without GPUs (a CPU run priced on its own device): wall clock, no GPU-hours
    and no money (issue 30)."""
    check_snapshot(snap_compare, request, replay_app("cost", scenario=None), (140, 40))
