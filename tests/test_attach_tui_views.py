"""diag tui on attached evidence (run.source == "attach"): the Steps tab shows the sampled phase shares with
their sample counts, the hottest user lines and the DataLoader workers' CPU per rank; the header says the
job is attached; the Memory tab says memory is not observable by sampling.

The evidence is what `diag attach --job` saves: a sampling window built by diag's own analysis
(diag.attach.analyse) from speedscope documents shaped like py-spy's, through the one adapter
(diag.attach.evidence.window_to_evidence), saved and loaded back. No live target: tests/test_attach_tui.py
runs the app on a real one."""
from __future__ import annotations

import time

from tui_support import plain, replay_app, widget_text

TORCH = "/usr/lib/python3/site-packages/torch"
DL = TORCH + "/utils/data/dataloader.py"
TRAIN = """\
for x, y in loader:
    out = model(x)
    out.sum().backward()
    opt.step()
    dist.all_reduce(out)
"""


def _speedscope(pid: int, stacks: list[list[dict]]) -> dict:
    frames: list[dict] = []
    index: dict = {}
    samples = []
    for st in stacks:
        ids = []
        for f in st:
            key = (f["name"], f["file"], f["line"])
            if key not in index:
                index[key] = len(frames)
                frames.append(f)
            ids.append(index[key])
        samples.append(ids)
    return {"shared": {"frames": frames},
            "profiles": [{"type": "sampled", "name": f'Process {pid} Thread {pid} "MainThread"',
                          "samples": samples, "weights": [0.05] * len(samples)}]}


def _window(tmp_path):
    from diag.attach.analyse import parse_speedscope, summarise_main, summarise_worker
    from diag.attach.session import ProcessWindow, Window
    from diag.attach.target import Target

    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    t = str(train)

    def mod(line):
        return {"name": "<module>", "file": t, "line": line}

    data = [mod(1), {"name": "_BaseDataLoaderIter.__next__", "file": DL, "line": 630},
            {"name": "_MultiProcessingDataLoaderIter._next_data", "file": DL, "line": 1300},
            {"name": "Queue.get", "file": "/usr/lib/python3.11/multiprocessing/queues.py", "line": 113}]
    forward = [mod(2), {"name": "Module._wrapped_call_impl", "file": TORCH + "/nn/modules/module.py", "line": 1500},
               {"name": "Module._call_impl", "file": TORCH + "/nn/modules/module.py", "line": 1510}]
    backward = [mod(3), {"name": "Tensor.backward", "file": TORCH + "/_tensor.py", "line": 520}]
    optim = [mod(4), {"name": "SGD.step", "file": TORCH + "/optim/sgd.py", "line": 80}]
    coll = [mod(5), {"name": "all_reduce", "file": TORCH + "/distributed/distributed_c10d.py", "line": 2000}]
    # rank 0 waits for data 60% of its samples; rank 1 waits in the all-reduce
    cycle0 = [data] * 6 + [forward] * 2 + [backward] + [optim]
    cycle1 = [data] + [forward] * 2 + [backward] + [optim] + [coll] * 5
    wl = TORCH + "/utils/data/_utils/worker.py"
    worker_busy = [mod(1), {"name": "_worker_loop", "file": wl, "line": 300},
                   {"name": "_MapDatasetFetcher.fetch", "file": TORCH + "/utils/data/_utils/fetch.py", "line": 50},
                   {"name": "Slow.__getitem__", "file": t, "line": 2}]
    procs = []
    for rank, (pid, cycle) in enumerate(((1001, cycle0), (1002, cycle1))):
        main = summarise_main(parse_speedscope(_speedscope(pid, cycle * 10))[pid][0], rate=20)
        wpid = pid + 100
        worker = summarise_worker(parse_speedscope(_speedscope(wpid, [worker_busy] * 20))[wpid], wpid)
        worker["cpu_percent"] = 97.0
        procs.append(ProcessWindow(
            target=Target(pid=pid, cmdline=["python", "train.py", "--lr", "0.1"], cwd=str(tmp_path), rank=rank,
                          local_rank=rank, world_size=2),
            main=main, workers=[worker] if rank == 0 else [], cpu_percent=88.0))
    now = time.time()
    return Window(started_at=now - 5.0, ended_at=now, rate=20, duration_s=5.0, processes=procs, gpu={},
                  job_pid=1000, pyspy_version="0.4.0")


def _saved_attach_evidence(tmp_path):
    from diag.attach.evidence import window_to_evidence
    from diag.evidence import load_evidence

    ev = window_to_evidence(_window(tmp_path))
    path = tmp_path / "evidence.json"
    ev.save(path)
    return load_evidence(path)


def test_attach_summary_model(tmp_path):
    from diag.tui.models.steps import summarize_attach, summarize_steps

    ev = _saved_attach_evidence(tmp_path)
    a = summarize_attach(ev)
    assert a is not None and a.window_s == 5.0 and a.rate_hz == 20 and a.job_pid == 1000
    assert [r.rank for r in a.ranks] == [0, 1] and a.pids == [1001, 1002]
    r0, r1 = a.ranks
    assert r0.samples == 100 and r0.phases[0][:3] == ("data", 60, 0.6)
    assert 0.08 < r0.phases[0][3] < 0.11              # ±1.96·√(0.6·0.4/100) ≈ 9.6 points
    assert r0.cycles == 39 and r0.hot_lines[0]["line"] == 1 and r0.hot_lines[0]["code"].startswith("for x, y")
    assert r0.workers[0]["pid"] == 1101 and r0.workers[0]["cpu_percent"] == 97.0
    assert r1.phases[0][:2] == ("collective", 50) and r1.workers == []
    assert summarize_attach(_probe_evidence()) is None                 # a probe run has no attach view
    assert summarize_steps(ev).step == 0                               # and sampling records no steps


def _probe_evidence():
    from tui_support import demo_evidence

    return demo_evidence()


async def test_steps_header_and_memory_on_attached_evidence(tmp_path):
    from diag.registry import Registry

    ev = _saved_attach_evidence(tmp_path)
    findings = Registry.discover().run(ev)
    app = replay_app("steps", scenario=None, evidence=ev, findings=findings)
    async with app.run_test(size=(140, 50)) as pilot:
        for _ in range(200):
            if app.state.snapshot is not None and app.pane("steps").renders:
                break
            await pilot.pause(0.05)
        await pilot.pause(0.2)
        steps = widget_text(app, "#steps-attach", 140)
        assert app.query_one("#steps-attach").display
        assert not app.query_one("#steps-summary").display            # no "no training step seen yet"
        assert "sampled shares, not timings" in steps
        assert "ranks side by side" in steps
        assert "rank 0 · PID 1001 · 100 samples · 39 step-like cycles" in steps
        assert "rank 1 · PID 1002 · 100 samples" in steps
        lines = steps.splitlines()
        data_row = next(x for x in lines if x.strip().startswith("data ") and "±" in x)
        assert "60" in data_row and "60%" in data_row and "±10%" in data_row
        assert any(x.strip().startswith("collective") and "50%" in x for x in lines)
        assert "hottest user lines" in steps and "train.py:1" in steps and "for x, y in loader:" in steps
        assert "DataLoader workers (1)" in steps and "1101" in steps and "97%" in steps
        assert "train.py:2" in steps                                   # what the worker spends it on
        header = app.query_one("#header").text
        assert "ATTACHED" in header and "job PID 1000" in header and "sampled window 5.0 s at 20 Hz" in header
        assert "2 ranks" in header and "step 0" not in header
        await pilot.press("4")                                         # Memory
        await pilot.pause(0.3)
        mem = widget_text(app, "#memory-attach", 140)
        assert app.query_one("#memory-attach").display
        assert "not observable by sampling" in mem and "GPUs tab" in mem
        assert not app.query_one("#memory-breakdown").display
        assert not app.query_one("#memory-plan").display


async def test_probe_runs_keep_the_step_view():
    app = replay_app("memory", scenario=None)
    async with app.run_test(size=(120, 36)) as pilot:
        for _ in range(200):
            if app.state.snapshot is not None and app.pane("memory").renders:
                break
            await pilot.pause(0.05)
        await pilot.pause(0.2)
        assert not app.query_one("#memory-attach").display
        assert "parameters" in widget_text(app, "#memory-breakdown", 120)
        assert "ATTACHED" not in app.query_one("#header").text
        await pilot.press("2")
        await pilot.pause(0.3)
        assert not app.query_one("#steps-attach").display
        assert "step 40" in plain(app.query_one("#steps-summary").content)
