"""The TUI: pure helpers, pilot tests of the interactions on a recorded run, and two live runs of a real
script (pause / save / stop, and quit stopping the script and its DataLoader workers)."""
from __future__ import annotations

import asyncio
import copy
import json
import sys
import time
from pathlib import Path

import pytest

from tui_support import (EVIDENCE, demo_evidence, demo_findings, monitor_app, plain, replay_app,
                         sim_sampler, widget_text)

SCRIPTS = Path(__file__).resolve().parent / "scripts"


async def wait_for(pilot, cond, timeout: float = 20.0, step: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await pilot.pause(step)


# ---- pure parts ---------------------------------------------------------------------------------------

def test_fmt_helpers():
    from diag.tui import fmt

    assert fmt.bar(0.5, 10) == "█████     "
    assert fmt.bar(None, 4) == "····"
    assert fmt.bar(1.7, 3) == "███"
    assert fmt.ms(0.0423) == "42.3 ms" and fmt.ms(None) == "N/A"
    assert fmt.duration(3725) == "1 h 02 min" and fmt.duration(0.5) == "500 ms"
    assert fmt.nbytes(3 * 2**30) == "3.0 GiB" and fmt.si(1.5e12, "FLOP/s") == "1.5TFLOP/s"
    from diag.gpu import NA

    assert fmt.is_na(NA) and fmt.num(NA) == "N/A" and not fmt.is_na(0)


def test_step_summary_of_the_recorded_run():
    from diag.tui.models.steps import phase_shares, summarize_steps

    s = summarize_steps(demo_evidence())
    assert s.step == 40 and s.epoch is not None
    assert s.median and s.median["total_s"] > 0 and s.samples_s and s.samples_s > 0
    assert s.tokens_s is None          # the demo's inputs are floats, not token ids
    assert len(s.history_ms) == s.timed + 1 or len(s.history_ms) >= s.timed
    rows = phase_shares(s.median)
    assert [r[1] for r in rows] == ["data wait", "forward", "backward", "optimizer", "other"]
    assert all(0 <= r[3] <= 1 for r in rows)
    assert s.ranks == []               # one rank: no per-rank table


def test_step_summary_one_row_per_rank():
    from diag.tui.models.steps import summarize_steps

    ev = demo_evidence()
    r1 = copy.deepcopy(ev.primary)
    r1.rank, r1.host = 1, "trainbox-2"
    for st in r1.steps:
        st.data_s *= 3
        st.total_s += 2 * st.data_s / 3
    ev.ranks.append(r1)
    s = summarize_steps(ev)
    assert [r.rank for r in s.ranks] == [0, 1]
    assert s.ranks[1].median["data_s"] > s.ranks[0].median["data_s"]


def test_header_says_how_the_script_ended():
    from diag.tui.live import Snapshot
    from diag.tui.widgets import UIState
    from diag.tui.widgets.header import header_lines, status_class

    ev = demo_evidence()
    st = UIState(mode="run", snapshot=Snapshot(ev, demo_findings()), clock=lambda: 0.0)
    one, two = header_lines(st)
    assert "completed" in one.plain and "planted.py" in one.plain and "step 40" in one.plain
    assert "warning" in one.plain and status_class(st) == "-ok"
    ev.run.status, ev.run.exit_code = "oom", 1
    ev.primary.exceptions.append(_oom_exception())
    one, two = header_lines(st)
    assert "OUT OF MEMORY" in one.plain and "exit 1" in one.plain
    assert "CUDA out of memory" in two.plain and status_class(st) == "-failed"
    ev.run.status = "failed"
    assert "CRASHED" in header_lines(st)[0].plain
    ev.run.status = "running"
    st.stopping = True
    assert "stopping" in header_lines(st)[0].plain
    st.paused = True
    assert "PAUSED" in header_lines(st)[1].plain


def _oom_exception():
    from diag.evidence import ExceptionInfo

    return ExceptionInfo(type="OutOfMemoryError", is_oom=True, step=7,
                         message="CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                                 "of 79.15 GiB of which 1.10 GiB is free.",
                         location={"file": "/home/alice/project/train.py", "line": 42})


def _oom_evidence():
    ev = demo_evidence()
    ev.run.status, ev.run.exit_code = "oom", 1
    ev.primary.status = "oom"
    ev.primary.exceptions = [_oom_exception()]
    from diag.memory.oom import parse_oom

    ev.primary.memory["oom"] = {"step": 7, "parsed": parse_oom(ev.primary.exceptions[0].message)}
    return ev


def test_gpu_view_from_sampler_and_from_recorded_evidence():
    from diag.tui.models.gpus import view_from_evidence, view_from_sampler
    from diag.tui.widgets.gpus import device_text

    sampler = sim_sampler("mig", samples=20)
    live = view_from_sampler(sampler)
    assert live.simulated == "mig" and len(live.devices) == 2
    parent = live.devices[0]
    assert [m.static.name for m in parent.mig] == ["3g.20gb", "2g.10gb", "1g.5gb"]
    text = device_text(parent, 80).plain
    assert "MIG 0 3g.20gb" in text and "N/A" in text           # no whole-GPU utilisation in MIG mode
    assert len(live.devices[1].util_hist) == 20
    recorded = view_from_evidence(sampler.to_evidence())
    assert recorded.recorded and recorded.simulated == "mig"
    assert [d.static.name for d in recorded.devices] == [d.static.name for d in live.devices]
    assert recorded.devices[1].sample.gpu_util == live.devices[1].sample.gpu_util
    empty = view_from_evidence({})
    assert not empty.devices and "no GPU telemetry" in empty.reason


def test_gpu_cards_show_lost_and_throttled_devices():
    from diag.tui.models.gpus import view_from_sampler
    from diag.tui.widgets.gpus import device_text, empty_text

    lost = view_from_sampler(sim_sampler("lost", samples=10))
    assert "LOST" in device_text(lost.devices[2], 80).plain
    assert "LOST" not in device_text(lost.devices[0], 80).plain
    hot = view_from_sampler(sim_sampler("throttling", samples=20))
    assert "THROTTLED" in device_text(hot.devices[1], 80).plain
    assert "no throttling" in device_text(hot.devices[0], 80).plain
    none = view_from_sampler(sim_sampler("none", samples=2))
    assert not none.devices and "No GPU" in empty_text(none).plain


def test_cost_form_prefill_and_errors():
    from diag.tui.models.cost import MEASURED, CostInputs, compute, prefill

    pre = prefill(demo_evidence(), ["NVIDIA H100 80GB HBM3"])
    assert pre.measured is not None and pre.inputs.basis == MEASURED
    assert pre.inputs.gpu == "h100-sxm" and pre.inputs.work == "10 epochs"
    res = compute(pre.inputs, pre.measured)
    assert res.error is None and res.main.training.units == 6400 and res.main.basis == "measured"
    assert len(res.compare) > 5 and res.plan is not None
    example = compute(CostInputs(params="7B", work="140B", gpu="h100-sxm", count="8", eval="1B"))
    assert example.main.eval is not None and example.main.cost > example.main.training.cost
    assert "params must be a number" in compute(CostInputs(params="seven")).error
    assert "fraction" in compute(CostInputs(mfu="140%")).error
    assert "whole number" in compute(CostInputs(count="2.5")).error
    assert prefill(None).inputs.params == "7B"
    assert not any("size is unknown" in n for n in pre.notes)
    # an IterableDataset: no epochs to count, so an hour of the measured throughput, and the form says so
    ev = demo_evidence()
    for d in ev.primary.dataloaders:
        d.dataset_len = None
    unsized = prefill(ev)
    assert unsized.inputs.work != "10 epochs" and compute(unsized.inputs, unsized.measured).error is None
    assert any("size is unknown" in n and "one hour" in n for n in unsized.notes)


def test_replay_reads_the_log_beside_the_evidence():
    from diag.tui.live import ReplaySource

    src = ReplaySource(demo_evidence(), path=str(EVIDENCE), findings=demo_findings())
    assert src.log_path == str(EVIDENCE.parent / "log.txt")
    lines = src.take_logs()
    assert lines and lines[0][1].startswith("epoch 0")
    assert src.take_logs() == []
    snap = src.evaluate()
    assert snap.final and snap.findings[0].severity.rank >= snap.findings[-1].severity.rank


def test_commands_tui_imports_no_textual():
    import subprocess

    code = ("import sys, diag.cli; diag.cli.build_parser(); import diag.commands.tui; "
            "assert 'textual' not in sys.modules, 'textual imported'")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_no_terminal_is_one_sentence_pointing_to_check(diag_cli):
    r = diag_cli("tui")
    assert r.code == 2
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "interactive terminal" in lines[0] and "diag check" in lines[0]
    assert "Traceback" not in r.stderr and r.stdout == ""
    r = diag_cli("tui", "--script", "train.py", "--from", "evidence.json")
    assert r.code == 2 and "not both" in r.stderr


# ---- pilot tests on the recorded run ----------------------------------------------------------------

async def test_tabs_switch_and_hidden_tabs_do_not_render():
    app = replay_app("checks")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.snapshot is not None)
        await pilot.pause(0.3)
        assert app.active_tab == "checks"
        assert app.pane("checks").renders >= 1
        for key, tab in (("2", "steps"), ("3", "gpus"), ("4", "memory"), ("5", "cost"), ("6", "log"),
                         ("1", "checks")):
            await pilot.press(key)
            await pilot.pause(0.05)
            assert app.active_tab == tab
        # every tab rendered once when shown; now only the visible one may render again
        before = {t: app.pane(t).renders for t in app.tabs}
        app.state.version += 5                   # as if new evidence had arrived 5 times
        app.state.gpu_version += 5
        for _ in range(5):
            app._tick()
        after = {t: app.pane(t).renders for t in app.tabs}
        assert after["checks"] > before["checks"]
        assert all(after[t] == before[t] for t in app.tabs if t != "checks")
        assert "Training waits for data" in widget_text(app, "#checks-detail") or \
            app.pane("checks").selected is not None


async def test_checks_detail_follows_the_cursor():
    app = replay_app("checks")
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for(pilot, lambda: app.state.snapshot is not None)
        await pilot.pause(0.2)
        pane = app.pane("checks")
        first = pane.selected
        assert first is not None and first.severity.value in ("error", "warning")
        await pilot.press("tab")     # focus the findings table
        app.query_one("#checks-table").focus()
        await pilot.press("down")
        await pilot.pause(0.1)
        assert pane.selected is not None and pane.selected.id != first.id
        text = widget_text(app, "#checks-detail", 80)
        assert pane.selected.title in text and pane.selected.message.split()[0] in text


async def test_save_in_replay_writes_reports_and_never_touches_the_evidence(tmp_path):
    before = EVIDENCE.read_text()
    app = replay_app("checks", save_dir=str(tmp_path))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.snapshot is not None)
        await pilot.press("w")
        await pilot.pause(0.2)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["diag-20261202-141000-demo-report.json", "diag-20261202-141000-demo-report.txt"]
    rep = json.loads((tmp_path / files[0]).read_text())
    assert rep["summary"]["steps"] == 40 and rep["findings"]
    assert "dataloader.workers" in (tmp_path / files[1]).read_text()
    assert EVIDENCE.read_text() == before


async def test_stop_is_hidden_without_a_running_script_and_help_opens():
    app = replay_app("checks")
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.snapshot is not None)
        assert app.check_action("stop", ()) is False
        await pilot.press("s")                      # nothing to stop: no modal
        assert len(app.screen_stack) == 1
        await pilot.press("question_mark")
        await pilot.pause(0.1)
        assert type(app.screen).__name__ == "HelpScreen"
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert len(app.screen_stack) == 1


async def test_oom_run_shows_the_diagnosis():
    ev = _oom_evidence()
    app = replay_app("memory", evidence=ev, findings=demo_findings())
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.snapshot is not None)
        await pilot.pause(0.2)
        assert app.query_one("#header").has_class("-failed")
        oom = widget_text(app, "#memory-oom", 100)
        assert "OUT OF MEMORY" in oom and "tried to allocate" in oom and "2.0 GiB" in oom
        assert "parameters" in widget_text(app, "#memory-breakdown", 100)


async def test_cost_results_follow_the_form():
    app = monitor_app("healthy-8", tab="cost")
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause(0.3)
        pane = app.pane("cost")
        assert pane.result.error is None
        assert pane.inputs().gpu == "h100-sxm" and pane.inputs().count == "8"   # the GPUs seen
        cost_7b = pane.result.main.cost
        field = app.query_one("#cost-params")
        field.focus()
        field.value = ""
        await pilot.press(*"70B")
        await pilot.pause(0.1)
        assert pane.inputs().params == "70B" and pane.result.main.cost > 9 * cost_7b
        await pilot.press("x")
        await pilot.pause(0.1)
        assert "params must be a number" in pane.result.error
        assert "params must be a number" in widget_text(app, "#cost-main")
        # typing in a field must not switch tabs
        assert app.active_tab == "cost"


async def test_monitor_mode_has_gpus_and_cost_only_and_no_gpu_is_clear():
    app = monitor_app("none")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        assert app.tabs == ("gpus", "cost")
        assert app.check_action("tab", ("3",)) is False and app.check_action("save", ()) is False
        assert "No GPU" in widget_text(app, "#gpu-empty", 78)
        assert "GPU monitor" in app.query_one("#header").text


# ---- live runs of a real script ---------------------------------------------------------------------

def _live_app(tmp_path, workers: int):
    from diag.runner import Run, RunConfig
    from diag.tui.app import DiagApp
    from diag.tui.models.gpus import GpuFeed
    from diag.tui.live import RunFeed

    cfg = RunConfig(script=str(SCRIPTS / "spine_forever.py"), args=[str(workers)], run_dir=str(tmp_path / "run"),
                    echo=None, simulate_gpus="healthy-8", gpu_interval=0.5)
    run = Run(cfg)
    app = DiagApp(RunFeed(run), GpuFeed(run.sampler, own=False), refresh_s=0.3, tick_s=0.1)
    return run, app


def _tree(pid: int) -> list:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root] + root.children(recursive=True)
    except psutil.Error:
        return []


def _alive(procs) -> list:
    import psutil

    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            pass
    return out


@pytest.mark.slow
async def test_live_run_pause_log_save_stop(tmp_path):
    run, app = _live_app(tmp_path, workers=0)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.state.snapshot is not None
                       and app.state.evidence.primary.step_stats.count >= 3, 30)
        assert app.pane("checks")._findings                 # judged live
        assert "running" in app.query_one("#header").text and "SIMULATED" in app.query_one("#header").text
        # pause: the display holds still while the evidence keeps growing
        await pilot.press("p")
        assert app.state.paused and "PAUSED" in app.query_one("#header").text
        shown = app.view.snapshot.evidence.primary.step_stats.count
        await wait_for(pilot, lambda: app.state.snapshot.evidence.primary.step_stats.count > shown + 5, 20)
        assert app.view.snapshot.evidence.primary.step_stats.count == shown
        await pilot.press("p")
        assert not app.state.paused and app.view is app.state
        # the log: the script's first line
        await pilot.press("6")
        await wait_for(pilot, lambda: app.pane("log").lines_written >= 1, 10)
        # save while it runs
        await pilot.press("w")
        await pilot.pause(0.2)
        for name in ("evidence.json", "report.json", "report.txt"):
            assert (run.run_dir / name).is_file(), name
        # stop: asks first, then the script ends and the findings stay
        await pilot.press("s")
        await pilot.pause(0.1)
        assert type(app.screen).__name__ == "ConfirmStop"
        await pilot.press("y")
        await wait_for(pilot, lambda: not run.running, 15)
        await wait_for(pilot, lambda: app.state.snapshot.final, 10)
        assert app.state.evidence.run.status != "running"
        assert "running" not in app.query_one("#header").text.split("\n")[0]
        await pilot.press("1")
        await pilot.pause(0.1)
        assert app.pane("checks")._findings and app.check_action("stop", ()) is None
        await pilot.press("q")
        await pilot.pause(0.2)
    assert run.proc.poll() is not None


@pytest.mark.slow
async def test_quit_stops_the_script_and_its_dataloader_workers(tmp_path):
    run, app = _live_app(tmp_path, workers=2)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.state.snapshot is not None
                       and app.state.evidence.primary.step_stats.count >= 2, 30)
        procs = _tree(run.proc.pid)
        assert len(_alive(procs)) >= 3                      # the script and its 2 workers
        await pilot.press("q")
        deadline = time.monotonic() + 15
        while app.is_running and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    assert not app.is_running
    assert not run.running and run.proc.poll() is not None
    assert _alive(procs) == []
    assert run.evidence.run.stop_reason == "stopped: diag tui was closed"
    assert (run.run_dir / "evidence.json").is_file()


def test_memory_tab_shows_a_batch_size_plan():
    from diag.memory.plan import make_plan
    from diag.tui.widgets.memory import plan_renderable

    GiB = 1 << 30

    def train(batch, accumulation=1):
        acts = batch * GiB // 4
        cats = {"parameters": 2 * GiB, "gradients": 2 * GiB, "optimizer_state": 4 * GiB, "activations": acts,
                "other": 0}
        return {"batch": batch, "mode": "train", "peak": sum(cats.values()), "categories": cats, "uses": {}}

    est = make_plan(train, None, observed_batch=64, target_batch=128, capacity=40 * GiB, facts={"matmul": True},
                    table=True)
    est["capacity_source"] = "NVIDIA A100 40GB SXM"
    ev = demo_evidence()
    ev.primary.memory["estimate"] = est
    text = plain(plan_renderable(ev), 120)
    assert "batch 128 does NOT fit" in text
    assert f"largest training batch that fits: {est['max_batch']}" in text
    assert "accumulation steps" in text and "128 *" in text
    ev.primary.memory["estimate"] = {"status": "skipped", "reason": "the step calls .item()"}
    assert "no batch-size plan: the step calls .item()" in plain(plan_renderable(ev), 120)


def test_copy_of_live_evidence_is_complete_and_independent():
    from diag.fold import fold
    from diag.tui.live import copy_evidence

    ev = demo_evidence()
    c = copy_evidence(ev)
    assert json.dumps(c.to_dict(), sort_keys=True, default=str) == json.dumps(ev.to_dict(), sort_keys=True,
                                                                              default=str)
    steps, count = len(c.primary.steps), c.primary.step_stats.count
    # the runner keeps folding into the original: the copy does not move
    fold(ev, {"kind": "step", "rank": 0, "t": 9.0, "index": 41, "total_s": 0.05, "data_s": 0.01})
    fold(ev, {"kind": "append", "rank": 0, "path": "memory.steps", "value": {"step": 41}})
    fold(ev, {"kind": "forward_counts", "rank": 0, "counts": {s.key: 999 for s in ev.primary.forwards}})
    fold(ev, {"kind": "end", "rank": 0, "status": "completed", "reason": "done"})
    assert len(c.primary.steps) == steps and c.primary.step_stats.count == count
    assert "steps" not in c.primary.memory and all(s.count != 999 for s in c.primary.forwards)
    assert c.primary.extras.get("end_reason") != "done"


def test_save_message_cuts_paths_after_a_slash_only():
    """The `w` message: the folder once, cut after a "/" (never mid-name), then the file names."""
    from diag.tui.fmt import saved_message, wrap_path

    folder = "/home/alice/projects/some-long-project-name/.diag/runs/20261202-141000-demo"
    msg = saved_message([f"{folder}/evidence.json", f"{folder}/report.json", f"{folder}/report.txt"],
                        cwd="/elsewhere", width=34)
    lines = msg.splitlines()
    assert lines[0] == "saved in" and lines[-1].strip() == "evidence.json, report.json, report.txt"
    body = lines[1:-1]
    assert "".join(body) == folder + "/" and all(len(ln) <= 34 and ln.endswith("/") for ln in body)
    assert saved_message([f"{folder}/r.json"], cwd="/home/alice/projects/some-long-project-name").splitlines()[1] \
        == ".diag/runs/20261202-141000-demo/"
    assert wrap_path("/a/" + "x" * 50, 10) == ["/a/", "x" * 50]     # a name longer than the line stays whole


def test_checks_detail_shows_the_fix_before_why_and_the_numbers():
    """At 80x24 the detail pane shows ~10 lines: the fix comes right after the message and location."""
    from diag.tui.widgets.checks import detail_renderable

    f = next(x for x in demo_findings() if x.id == "dataloader.workers")
    lines = [ln.strip() for ln in plain(detail_renderable(f), 76).splitlines()]
    fix = next(i for i, ln in enumerate(lines) if ln.startswith("fix "))
    why = next(i for i, ln in enumerate(lines) if ln.startswith("why it matters"))
    nums = lines.index("the numbers")
    assert fix < why < nums and fix <= 9, lines[:12]
