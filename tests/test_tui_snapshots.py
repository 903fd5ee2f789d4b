"""Snapshot tests of every tab at 80x24 and 140x40: the recorded demo run (tests/fixtures/tui), simulated
GPUs and a frozen clock. Update after an intended change with
``.venv/bin/pytest tests/test_tui_snapshots.py --snapshot-update`` and look at the SVGs in
tests/__snapshots__/test_tui_snapshots/ (or the HTML report pytest writes on failure)."""
from __future__ import annotations

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
    """Wait until the findings are in and a tick has rendered them."""
    app = pilot.app
    for _ in range(100):
        if app.mode == "monitor" or (app.state.snapshot is not None and not app._evaluating):
            break
        await pilot.pause(0.05)
    await pilot.pause(0.3)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("tab", TABS)
def test_tab(snap_compare, tab, size):
    assert snap_compare(replay_app(tab), terminal_size=SIZES[size], run_before=_judged)


def test_gpu_monitor_mig(snap_compare):
    assert snap_compare(monitor_app("mig"), terminal_size=(140, 40), run_before=_judged)


def test_gpu_monitor_no_gpu(snap_compare):
    assert snap_compare(monitor_app("none"), terminal_size=(80, 24), run_before=_judged)
