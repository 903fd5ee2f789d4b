"""The timeline extension inside the real probe, on a CPU: the probe's hooks (the new ``on_data``
included) drive it in a real DataLoader loop; a host-backed clock stands in for CUDA events."""
from __future__ import annotations

import time

import pytest

from diag.evidence import Evidence
from diag.fold import fold
from diag.probe.core import Probe
from diag.probe.extensions import DEFAULT_EXTENSIONS, load_extensions
from diag.probe.timeline import TimelineProbe

torch = pytest.importorskip("torch")


class HostClock:
    """Events that complete at once, stamped with the host clock (a CPU stand-in for CUDA events)."""

    def __init__(self):
        self.labels = []

    def now(self):
        return time.perf_counter()

    def record(self):
        return time.perf_counter()

    def query(self, h):
        return True

    def elapsed_ms(self, a, b):
        return (b - a) * 1e3


class Recording(TimelineProbe):
    """Remembers the marks' labels in order (to check where the probe's hooks put them)."""

    def install(self, ctx):
        super().install(ctx)
        self._on = True     # as if a CUDA model had been seen
        rec = self.rec
        orig = rec.mark

        def mark(label):
            self._clock.labels.append(label)
            return orig(label)

        rec.mark = mark


def test_marks_follow_a_real_dataloader_loop():
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    events = []
    clock = HostClock()
    ext = Recording(clock=clock)
    probe = Probe(events.append, extensions=[ext]).install()
    try:
        model = nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = DataLoader(TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,))), batch_size=8)
        for x, y in data:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        probe.finish("completed")
    finally:
        probe.uninstall()
    # one step: its data fetch, the step opening, the forward, the optimizer, the end
    assert clock.labels[:6] == ["data_start", "data_end", "step_start", "forward_end", "optimizer_start", "step_end"]
    assert clock.labels.count("step_end") == 8
    ev = Evidence()
    for e in events:
        fold(ev, e)
    tl = ev.primary.timeline
    assert len(tl.steps) == 8 and tl.resolved == 8 and tl.dropped == 0
    st = tl.steps[-1]
    assert set(st["phases"]) >= {"data", "forward", "backward", "optimizer", "between"}
    assert st["busy_s"] + st["idle_s"] == pytest.approx(st["device_s"], abs=1e-6)
    # uninstalled: the optimizer pre-hook is gone
    n = len(clock.labels)
    opt.step()
    assert len(clock.labels) == n


def test_default_extensions_include_the_timeline_and_it_leaves_cpu_runs_alone():
    assert "diag.probe.timeline:TimelineProbe" in DEFAULT_EXTENSIONS
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine")
    events = []
    exts = load_extensions()
    probe = Probe(events.append, extensions=exts).install()
    try:
        assert not any(isinstance(e, TimelineProbe) for e in probe.extensions)   # removed at install
    finally:
        probe.uninstall()


def _loop_with_eval_and_save(tmp_path, clock, ext_cls=None):
    """A real DataLoader loop on a CPU: 12 steps, an evaluation pass over its own loader after steps
    4 and 8 (slow fetches), torch.save after step 6."""
    from torch import nn
    from torch.utils.data import DataLoader, Dataset, TensorDataset

    class Slow(Dataset):
        def __len__(self):
            return 24

        def __getitem__(self, i):
            time.sleep(0.004)
            return torch.randn(8), 0

    events = []
    ext = (ext_cls or Recording)(clock=clock)
    probe = Probe(events.append, extensions=[ext]).install()
    try:
        model = nn.Linear(8, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        data = DataLoader(TensorDataset(torch.randn(96, 8), torch.randint(0, 2, (96,))), batch_size=8)
        val = DataLoader(Slow(), batch_size=8)
        for i, (x, y) in enumerate(data, 1):
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i in (4, 8):
                model.eval()
                with torch.no_grad():
                    for vx, _vy in val:
                        model(vx).sum().item()
                model.train()
            if i == 6:
                torch.save(model.state_dict(), tmp_path / "ckpt.pt")
        probe.finish("completed")
    finally:
        probe.uninstall()
    ev = Evidence()
    for e in events:
        fold(ev, e)
    return ev, clock


def test_eval_pass_and_checkpoint_in_a_real_loop(tmp_path):
    orig_save = torch.save
    ev, clock = _loop_with_eval_and_save(tmp_path, HostClock())
    assert torch.save is orig_save                  # uninstalled: the user's torch.save is back
    assert (tmp_path / "ckpt.pt").exists()          # and the save itself was done, untouched
    r = ev.primary
    assert len(r.evaluations) == 2
    steps = {s["index"]: s for s in r.timeline.steps}
    # the steps after each pass hold its device time as evaluation, its fetches' idle included
    for after, ev_rec in zip((5, 9), r.evaluations):
        st = steps[after]
        assert ev_rec.after_step == after - 1
        assert st["phases"]["eval"] == pytest.approx(ev_rec.time_s, rel=0.35, abs=0.01)
        assert st["idle"]["eval"] >= 0.8 * 3 * 8 * 0.004    # 3 batches of 8 slow samples
        assert st["idle"].get("data", 0.0) < 0.01            # the training fetch only
    assert clock.labels.count("ckpt_start") == 1 and clock.labels.count("ckpt_end") == 1
    assert steps[7]["idle"].get("ckpt", 0.0) > 0
    for i in (2, 3, 6, 10, 11):
        assert "eval" not in steps[i]["phases"] and "ckpt" not in steps[i]["idle"]


def test_copy_watch_times_copy_into_cuda_and_tells_the_listener_the_source():
    """Tensor.copy_ into a CUDA tensor is a host-to-device copy for the copy watch (its listener gets
    the CPU source); a CPU-to-CPU copy_ is not, and every copy still happens."""
    from diag.probe.perf import PerfProbe
    from diag.probe.perf import sync as perf_sync

    ext = PerfProbe()
    ext._probe = Probe([].append)
    heard = []
    listener = lambda edge, src=None: heard.append((edge, src))   # noqa: E731
    perf_sync.COPY_LISTENERS.append(listener)
    ext._start_copy_watch(torch)
    try:
        assert perf_sync.COPY_WATCH["on"]
        a, b = torch.zeros(4), torch.arange(4.0)
        a.copy_(b)
        assert torch.equal(a, b) and heard == []           # CPU to CPU: not a host-to-device copy

        class CudaDst:                                      # a CUDA destination, as the patch sees it
            device = torch.device("cuda", 0)

        assert ext._on_copy_into(CudaDst(), b, (True,), {})
        assert ext.copies["h2d_copies"] == 1 and ext.copies["non_blocking_pageable"] == 1
        out = perf_sync._timed_copy(lambda t, src: t.copy_(src), a, (b * 2,), {}, b)
        assert torch.equal(out, b * 2) and [e for e, _ in heard] == ["start", "end"] and heard[0][1] is b
    finally:
        ext._stop_copy_watch()
        perf_sync.COPY_LISTENERS.remove(listener)
    assert not perf_sync.COPY_WATCH["on"]
    assert "copy_" not in torch.Tensor.__dict__            # the inherited copy_ shows through again


def test_safetensors_saves_are_one_checkpoint_interval_each(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    from torch import nn

    orig_file, orig_model = st.save_file, st.save_model
    clock = HostClock()
    ext = Recording(clock=clock)
    probe = Probe([].append, extensions=[ext]).install()
    try:
        assert st.save_file is not orig_file and st.save_file.__wrapped__ is orig_file
        model = nn.Linear(8, 2)
        st.save_model(model, str(tmp_path / "m.safetensors"))          # calls save_file inside: one interval
        st.save_file({"w": torch.ones(3)}, str(tmp_path / "w.safetensors"))
    finally:
        probe.uninstall()
    assert clock.labels.count("ckpt_start") == 2 and clock.labels.count("ckpt_end") == 2
    assert ext._ckpt_depth == 0
    assert st.save_file is orig_file and st.save_model is orig_model
    assert st.load_file(str(tmp_path / "w.safetensors"))["w"].sum().item() == 3.0
