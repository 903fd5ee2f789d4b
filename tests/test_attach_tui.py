"""diag tui --attach: the live app on a real running training process (sampled in windows)."""
from __future__ import annotations

import re
import time

import pytest

from test_attach_live import target  # noqa: F401  (the fixture: starts a target, kills it afterwards)
from tui_support import widget_text

pytestmark = pytest.mark.slow


async def _wait(pilot, cond, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await pilot.pause(0.2)


async def test_tui_attach_shows_findings_and_log_lines(target):  # noqa: F811
    from diag.attach.live import AttachFeed
    from diag.tui.app import DiagApp

    t = target("starved")
    feed = AttachFeed(pid=t.pid, window_s=2.0)
    app = DiagApp(feed, None, refresh_s=0.2)
    async with app.run_test(size=(120, 36)) as pilot:
        await _wait(pilot, lambda: app.state.snapshot is not None, 90)
        snap = app.state.snapshot
        ids = {f.id: f for f in snap.findings}
        assert ids["dataloader.workers"].severity.value in ("warning", "info"), ids["dataloader.workers"].message
        assert snap.evidence.run.source == "attach"
        assert app.mode == "attach"
        assert not app.check_action("stop", ())           # the job is never stopped from the app
        await pilot.press("2")                             # Steps: the sampled view, not step timings
        await _wait(pilot, lambda: app.pane("steps").renders > 0, 20)
        await pilot.pause(0.2)
        steps = widget_text(app, "#steps-attach", 120)
        assert "sampled shares, not timings" in steps and f"PID {t.pid}" in steps
        assert "data" in steps and "samples" in steps
        header = app.query_one("#header").text
        # the window's measured length (about the 2 s asked for; a loaded machine stretches or cuts it)
        assert "ATTACHED" in header and f"PID {t.pid}" in header
        assert re.search(r"sampled window \d+(\.\d+)? s at \d+ Hz", header), header
        await pilot.press("6")                             # the Log tab: one line per window
        await _wait(pilot, lambda: any("window 1" in line for _, line in app._pending_logs)
                    or app.pane("log").renders > 0, 20)
        await pilot.press("q")
    feed.stop()                                            # as diag.commands.tui does when the app closes
    assert feed.wait_ended(30)
    assert not feed.sampling                               # sampling (py-spy) ended
    assert t.proc.poll() is None                           # the job is still running
