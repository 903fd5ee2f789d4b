"""The TUI's Try tab: the view-model without an app, then the pane with Textual's pilot on a fake trial
feed (synthetic results delivered from the worker thread as the engine would; nothing is run)."""
from __future__ import annotations

import threading
import time

import pytest
from tui_support import demo_findings, replay_app, widget_text

from diag.tui.models.try_ import ReplayFeed, TrialFeed, TryModel


def _trial(knob, verdict, speedup=None, lo=None, hi=None, kind="restart", **kw):
    d = {"knob": knob, "kind": kind, "verdict": verdict, "why": f"{verdict} on synthetic steps",
         "speedup": speedup, "ci_low": lo, "ci_high": hi, "steps": 60, "baseline_steps": 60, "runs": 4,
         "step_s": 0.05 if speedup else None, "baseline_step_s": 0.09, "samples_per_s": 640.0 if speedup else None,
         "baseline_samples_per_s": 355.0, "peak_memory": None, "baseline_peak_memory": None,
         "loss_change": 0.0, "applied": "", "knobs": [knob]}
    d.update(kw)
    return d


WORKERS = _trial("dataloader.workers=1", "faster", 1.72, 1.15, 2.47)
ANOMALY = _trial("debug.anomaly", "no change", 1.04, 0.90, 1.20, kind="switch")
SET_NONE = _trial("optim.set-to-none", "no change", 0.98, 0.80, 1.15, kind="switch")
SUMMARY = "dataloader.workers=1: 1.72x faster (1.15-2.47) in 60 steps, same loss curve"


def _result(trials, summary="", **kw):
    return {"script": "/x/train.py", "framework": None, "device": "cpu", "trials": trials,
            "not_tried": [{"knob": "amp.fp16", "verdict": "not applicable", "why": "fp16 needs a GradScaler"}],
            "summary": summary, "notes": [], "runs": [{"label": "a"}] * 5, "elapsed_s": 42.0, "budget_s": 300.0,
            "directory": "/x/.diag/try/1", "interrupted": False, "values": {"batch_size": 32}, **kw}


class FakeFeed(TrialFeed):
    """Delivers synthetic results as the engine would: a progress line and the result so far after each
    phase. ``gate`` holds it after the first trial until the test releases it; it honours cancel."""

    def __init__(self, hold: bool = True) -> None:
        super().__init__()
        self.gate = threading.Event()
        if not hold:
            self.gate.set()
        self.calls: list[list[str]] = []

    def _run(self, evidence, findings, knobs, *, progress, update, cancel):
        self.calls.append(list(knobs))
        progress("run 1: switch knobs (33 steps)")
        update(_result([ANOMALY]))
        while not self.gate.wait(0.02):
            if cancel.is_set():
                return _result([ANOMALY], "no knob made a significant difference", interrupted=True)
        progress("run 2: dataloader.workers=1 (round 1) (40 steps)")
        update(_result([ANOMALY, SET_NONE]))
        return _result([ANOMALY, SET_NONE, WORKERS], SUMMARY)


async def _wait(pilot, cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await pilot.pause(0.05)


# ---- the view-model, without an app -------------------------------------------------------------------

def test_model_plans_the_knobs_the_findings_point_to_and_fills_rows():
    m = TryModel()
    m.plan_from(demo_findings())
    assert m.knobs == ["debug.anomaly", "optim.set-to-none", "dataloader.workers=1"]
    assert m.reasons["dataloader.workers=1"] == "finding dataloader.workers"
    assert [k for k, _ in m.not_applicable] == ["amp.fp16"]
    rows = m.rows()
    assert [r.verdict for r in rows] == ["not run yet"] * 3 + ["not applicable"]
    m.started()
    m.on_update(_result([ANOMALY]))
    rows = {r.knob: r for r in m.rows()}
    assert rows["debug.anomaly"].verdict == "no change" and rows["debug.anomaly"].speedup == "1.04x (0.90-1.20)"
    assert rows["dataloader.workers=1"].verdict == "measuring…"
    assert rows["amp.fp16"].verdict == "not applicable"
    assert m.fixes() == [] or m.status == "running"
    m.finished(_result([ANOMALY, SET_NONE, WORKERS], SUMMARY))
    assert m.status == "done"
    rows = {r.knob: r for r in m.rows()}
    assert rows["dataloader.workers=1"].speedup == "1.72x (1.15-2.47)"
    assert rows["dataloader.workers=1"].samples == "640/s (was 355)"
    assert rows["dataloader.workers=1"].memory == "n/a"
    fx = m.fixes()
    assert [k for k, _, _ in fx] == ["dataloader.workers=1"]
    assert "num_workers=1" in fx[0][1] and "num_workers=1" in (fx[0][2] or "")
    assert m.summary == SUMMARY and "5 run(s) in 42 s" in m.footer()
    # a started set keeps the plan it started with
    m.plan_from([])
    assert m.knobs and m.version > 0


def test_model_says_why_the_trials_cannot_start():
    m = TryModel()
    m.plan_from(demo_findings())
    feed = FakeFeed()
    assert m.blocked(None, "completed", False, True) == "no trial runner was given to this app"
    assert "replay executes nothing" in m.blocked(ReplayFeed("train.py"), "completed", False, True)
    assert "once the script has finished" in m.blocked(feed, "running", True, True)
    assert "waiting for the run's findings" == m.blocked(feed, None, False, False)
    assert "did not finish on its own (failed)" in m.blocked(feed, "failed", False, True)
    assert m.blocked(feed, "completed", False, True) is None
    assert m.blocked(feed, "stopped", False, True) is None
    empty = TryModel()
    empty.plan_from([f for f in demo_findings() if f.severity.value in ("pass", "info", "skipped")])
    assert empty.knobs == [] and empty.not_applicable == []
    assert empty.blocked(feed, "completed", False, True) == "no knob to try"
    m.finished(None, error="the script failed on its own")
    assert m.status == "failed"
    m2 = TryModel(status="running")
    m2.finished(_result([ANOMALY], interrupted=True))
    assert m2.status == "cancelled"


def test_feed_runs_once_at_a_time_and_cancels():
    feed = FakeFeed()
    out: list = []
    t = threading.Thread(target=lambda: out.append(feed.run(None, [], ["a"], progress=lambda s: None,
                                                            update=lambda d: None)))
    t.start()
    deadline = time.monotonic() + 5
    while not feed.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert feed.running
    try:
        feed.run(None, [], ["a"], progress=lambda s: None, update=lambda d: None)
        raise AssertionError("a second run must be refused")
    except RuntimeError as e:
        assert "already running" in str(e)
    feed.cancel()
    assert feed.wait_ended(5)
    t.join(5)
    assert not feed.running and feed.cancelled and out[0]["interrupted"] is True


# ---- the pane, with the pilot -------------------------------------------------------------------------

async def test_try_tab_runs_the_trials_and_fills_the_table_live():
    feed = FakeFeed()
    app = replay_app("checks", trials=feed)
    async with app.run_test(size=(140, 40)) as pilot:
        await _wait(pilot, lambda: app.state.snapshot is not None)
        assert app.tabs[-1] == "try"
        await pilot.press("7")
        await pilot.pause(0.1)
        assert app.active_tab == "try"
        pane = app.pane("try")
        await _wait(pilot, lambda: pane.model.knobs)
        head = widget_text(app, "#try-head", 140)
        assert "3 knob(s) the findings point to" in head and "dataloader.workers=1" in head
        assert "not applicable from outside: amp.fp16" in head
        assert not app.query_one("#try-start").disabled
        await pilot.press("t")
        # the first trial's verdict is in while the others are still measured
        await _wait(pilot, lambda: pane.model.result is not None and len(pane.model.result["trials"]) == 1)
        await pilot.pause(0.1)
        table = app.query_one("#try-table")
        cells = {str(table.get_row_at(i)[0]): str(table.get_row_at(i)[5]) for i in range(table.row_count)}
        assert cells["debug.anomaly"] == "no change"
        assert cells["dataloader.workers=1"] == "measuring…"
        assert cells["amp.fp16"] == "not applicable"
        assert "trials running" in widget_text(app, "#try-head", 140)
        assert not app.query_one("#try-start").display
        feed.gate.set()
        await _wait(pilot, lambda: pane.model.status == "done")
        await pilot.pause(0.1)
        cells = {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)] for i in range(table.row_count)}
        assert cells["dataloader.workers=1"][1] == "1.72x (1.15-2.47)"
        assert cells["dataloader.workers=1"][5] == "faster"
        foot = widget_text(app, "#try-foot", 140)
        assert "the fix, in plain PyTorch's words:" in foot and "num_workers=1" in foot
        assert "summary: " + SUMMARY in foot
        assert feed.calls == [["debug.anomaly", "optim.set-to-none", "dataloader.workers=1", "amp.fp16"]]
        assert "trials done" in widget_text(app, "#try-head", 140)


async def test_escape_cancels_the_trials_and_q_waits_for_them():
    feed = FakeFeed()
    app = replay_app("try", trials=feed)
    async with app.run_test(size=(100, 30)) as pilot:
        await _wait(pilot, lambda: app.state.snapshot is not None and app.pane("try").model.knobs)
        await pilot.press("t")
        pane = app.pane("try")
        await _wait(pilot, lambda: feed.running)
        await pilot.press("escape")
        await _wait(pilot, lambda: pane.model.status == "cancelled")
        assert feed.cancelled and not feed.running
        assert "trials cancelled" in widget_text(app, "#try-head", 100)
        # started again, then q: the app leaves only once the feed has stopped
        feed2 = FakeFeed()
        pane.feed = app.trials = feed2
        await pilot.press("t")
        await _wait(pilot, lambda: feed2.running)
        await pilot.press("q")
        await _wait(pilot, lambda: not app.is_running, timeout=20)
    assert feed2.cancelled and not feed2.running


async def test_try_tab_says_no_knob_to_try_on_a_run_with_no_applicable_knob():
    quiet = [f for f in demo_findings() if f.severity.value in ("pass", "info", "skipped")]
    app = replay_app("try", findings=quiet, trials=ReplayFeed("train.py"))
    async with app.run_test(size=(100, 30)) as pilot:
        await _wait(pilot, lambda: app.state.snapshot is not None)
        await pilot.pause(0.2)
        assert "try" in app.tabs and app.active_tab == "try"
        assert "no knob to try" in widget_text(app, "#try-head", 100)
        assert not app.query_one("#try-start").display
        assert not app.query_one("#try-table").display
        await pilot.press("t")             # nothing to start: it says so, nothing runs
        await pilot.pause(0.1)
        assert app.pane("try").model.status == "idle"


async def test_replay_feed_lists_the_knobs_and_says_how_to_measure_them():
    app = replay_app("try", trials=ReplayFeed("train.py"))
    async with app.run_test(size=(100, 30)) as pilot:
        await _wait(pilot, lambda: app.state.snapshot is not None and app.pane("try").model.knobs)
        await pilot.pause(0.1)
        head = widget_text(app, "#try-head", 100)
        assert "dataloader.workers=1" in head and "diag try --script train.py" in head
        assert not app.query_one("#try-start").display


async def test_no_try_tab_without_a_trial_feed():
    app = replay_app("checks")
    async with app.run_test(size=(100, 30)) as pilot:
        await _wait(pilot, lambda: app.state.snapshot is not None)
        assert "try" not in app.tabs
        await pilot.press("t")
        await pilot.pause(0.05)
        assert app.active_tab == "checks"


# ---- the command's feed, for real: cancel leaves nothing behind ----------------------------------------

LONG = '''
import time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 4000

    def __getitem__(self, i):
        time.sleep(0.01)
        return torch.randn(8), 0


model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(Slow(), batch_size=4):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
'''


@pytest.mark.slow
def test_the_commands_feed_runs_the_engine_and_cancel_stops_its_run(tmp_path, monkeypatch):
    import os

    import psutil
    from tui_support import demo_evidence

    from diag.commands.tui import TryFeed

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(LONG)
    feed = TryFeed("train.py", [])
    progress: list[str] = []
    updates: list[dict] = []
    out: list = []
    t = threading.Thread(target=lambda: out.append(feed.run(
        demo_evidence(), [], ["dataloader.workers=2"], progress=progress.append, update=updates.append)))
    t.start()
    me = psutil.Process()

    def cmd(p) -> str:
        try:
            return " ".join(p.cmdline() or [])
        except psutil.Error:
            return ""

    deadline = time.monotonic() + 120
    # wait for the knob's run: the script under the probe and its 2 DataLoader workers
    seen: list = []
    while time.monotonic() < deadline:
        seen = [p for p in me.children(recursive=True) if cmd(p)]
        if len([p for p in seen if "diag.probe" in cmd(p) or "multiprocessing" in cmd(p)]) >= 3:
            break
        time.sleep(0.2)
    assert len(seen) >= 3, [cmd(p) for p in seen]
    assert any("run 1" in p for p in progress), progress
    assert updates and updates[0]["trials"] == []          # the result so far, before any verdict
    feed.cancel()
    assert feed.wait_ended(40)
    t.join(5)
    data = out[0]
    assert data["interrupted"] is True
    assert os.getcwd() == str(tmp_path)                      # the engine's chdir into the copy is undone
    alive = []
    for p in seen:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(cmd(p))
        except psutil.Error:
            pass
    assert alive == []


ANOMALY_SCRIPT = '''
import torch
from torch import nn

torch.autograd.set_detect_anomaly(True)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x, y = torch.randn(16, 32), torch.randint(0, 2, (16,))
for step in range(400):
    opt.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
'''


@pytest.mark.slow
async def test_a_live_run_then_its_trials_in_the_app(tmp_path, monkeypatch):
    """diag tui --script as the command builds it: the script runs live, then t runs the real trials on
    the knob its findings point to (anomaly detection left on), and the verdict lands in the table."""
    from diag.commands.tui import TryFeed
    from diag.runner import Run, RunConfig
    from diag.tui.app import DiagApp
    from diag.tui.live import RunFeed

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(ANOMALY_SCRIPT)
    run = Run(RunConfig(script=str(tmp_path / "train.py"), echo=None, gpu=False))
    feed = TryFeed("train.py", [])
    feed.budget_s = 90
    app = DiagApp(RunFeed(run), None, refresh_s=0.3, tick_s=0.1, trials=feed)
    async with app.run_test(size=(120, 36)) as pilot:
        await _wait(pilot, lambda: app.state.snapshot is not None and app.state.snapshot.final, 120)
        await pilot.press("7")
        pane = app.pane("try")
        await _wait(pilot, lambda: pane.model.knobs)
        assert "debug.anomaly" in pane.model.knobs
        await pilot.press("t")
        await _wait(pilot, lambda: pane.model.status == "running")
        await _wait(pilot, lambda: pane.model.status != "running", 240)
        assert pane.model.status == "done", pane.model.error
        table = app.query_one("#try-table")
        rows = {str(table.get_row_at(i)[0]): str(table.get_row_at(i)[5]) for i in range(table.row_count)}
        assert rows["debug.anomaly"] in ("faster", "no change", "slower", "unknown"), rows
        assert "summary: " in widget_text(app, "#try-foot", 120)
        await pilot.press("q")
    assert not feed.running
