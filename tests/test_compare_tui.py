"""The TUI's Steps tab with a baseline (diag tui --baseline): the deltas per phase."""
import copy
import time

from tui_support import demo_evidence, replay_app, widget_text

from diag.compare import extract


async def _wait(pilot, cond, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        await pilot.pause(0.1)


def _baseline(backward_factor: float):
    ev = copy.deepcopy(demo_evidence())
    for s in ev.primary.steps:
        s.total_s -= s.backward_s * (1 - backward_factor)
        s.backward_s *= backward_factor
    return extract.from_export(extract.export(ev), "base.json", [])


async def test_steps_tab_shows_the_deltas_per_phase():
    app = replay_app("steps")
    app.baseline = _baseline(0.5)                   # the baseline's backward took half as long
    async with app.run_test(size=(110, 40)) as pilot:
        await _wait(pilot, lambda: app.state.snapshot is not None)
        await pilot.pause(0.3)
        text = widget_text(app, "#steps-baseline", width=110)
    assert "vs baseline base.json" in text
    rows = {line.split()[0]: line for line in text.splitlines() if line.strip()}
    assert "backward" in rows and "+" in rows["backward"].split("ms")[-2]
    for phase in ("data", "forward", "optimizer"):
        assert "+0.0 ms" in rows[phase] or "-0.0 ms" in rows[phase]


async def test_steps_tab_without_a_baseline_has_no_baseline_widget():
    app = replay_app("steps")
    async with app.run_test(size=(110, 40)) as pilot:
        await _wait(pilot, lambda: app.state.snapshot is not None)
        await pilot.pause(0.2)
        assert not app.query("#steps-baseline")


def test_tui_baseline_bad_input_is_exit_2(diag_cli, tmp_path):
    r = diag_cli("tui", "--script", "train.py", "--baseline", str(tmp_path / "missing.json"))
    assert r.code == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
