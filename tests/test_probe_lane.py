"""The probe's lane (diag.probe.lane, issue 28): the unsampled steps of a plain loop on a short path.

What the evidence records must not change: each script below runs twice in this process, under a probe
with the lane and under one without it (``DIAG_PROBE_LANE=0``), and every event the two write must be
the same event — the same kinds in the same order, each step with the same keys in the same order and
the same values, the timings apart (two runs cannot share a clock; they are checked for consistency
instead). The scripts cover what hands a step back to the full path: an evaluation pass, a new epoch,
a teacher model, gradient accumulation, a forward from another line, an exception inside a step, the
``--steps`` limit, autocast, a closure; and what it takes on since: token ids passed by keyword with a
dict out, a step whose optimizer-step group ends at the next fetch (a second optimizer alive), and a
loop that builds its batches without a DataLoader (then goes on with one)."""
from __future__ import annotations

import gc
import math
import time

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

TIMES = {"total_s", "data_s", "forward_s", "backward_s", "optimizer_s", "other_s", "probe_s", "t"}


def _loader(n: int, batch: int = 4, seed: int = 0) -> DataLoader:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n * batch, 8, generator=g)
    y = torch.randint(0, 3, (n * batch,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=batch)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))


def plain(max_steps=None):
    model, crit = _model(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _epoch in range(2):
        for x, y in _loader(60):
            opt.zero_grad()
            crit(model(x), y).backward()
            opt.step()


def with_evaluation():
    model, crit = _model(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    val = _loader(5, seed=1)
    for i, (x, y) in enumerate(_loader(120)):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i % 40 == 39:
            model.eval()
            with torch.no_grad():
                for vx, vy in val:
                    crit(model(vx), vy)
            model.train()


def with_teacher_every_third_step():
    model, teacher = _model(), _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(_loader(100)):
        opt.zero_grad()
        out = model(x)
        loss = nn.functional.cross_entropy(out, y)
        if i % 3 == 0 and i > 50:
            with torch.no_grad():
                loss = loss + 0.0 * teacher(x).sum()
        loss.backward()
        opt.step()


def with_accumulation_later():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    it = iter(_loader(160))
    for i in range(100):
        opt.zero_grad()
        for _micro in range(2 if i >= 60 else 1):
            x, y = next(it)
            nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def with_accumulation_from_a_loader():
    """Gradient accumulation the plain way: a fetch, a forward, a backward per micro-batch, the optimizer
    every fourth; the epoch's last two micro-batches never reach an optimizer step (the next epoch's
    first fetch comes after a backward, from a new iterator)."""
    model, crit = _model(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _epoch in range(2):
        for i, (x, y) in enumerate(_loader(150)):
            (crit(model(x), y) / 4).backward()
            if i % 4 == 3:
                opt.step()
                opt.zero_grad()


def with_accumulation_without_a_loader():
    """nanoGPT's loop: the loss computed by the model, the next batch built between the forward and the
    backward, three micro-batches a step, the gradient clipped before the optimizer step."""
    model = TokenLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)

    def get_batch():
        return torch.randint(0, 50, (4, 12), generator=g)

    ids = get_batch()
    for i in range(80):
        for _micro in range(3 if i < 60 else 2):
            loss = model(input_ids=ids, labels=ids)["loss"] / 3
            ids = get_batch()
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)


def with_accumulation_fetching_first():
    """The Hugging Face Trainer's order: the step's micro-batches fetched first, then each one's forward
    and backward (the lane keeps the batches fetched ahead in order: Lane.queue)."""
    model, crit = _model(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    it = iter(_loader(160))
    for _ in range(80):
        batches = [next(it), next(it)]
        for x, y in batches:
            (crit(model(x), y) / 2).backward()
        opt.step()
        opt.zero_grad()


def with_accumulation_irregular():
    """Accumulation that goes off the pattern now and then: a batch fetched and never forwarded (every
    seventh step), a forward of the model under no_grad between two micro-batches (every eleventh: the
    lane hands the step back mid-way, its micro-batches replayed in order), an accumulation count that
    changes."""
    model, crit = _model(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    it = iter(_loader(400))
    for i in range(90):
        batches = [next(it) for _ in range(3 if i % 7 == 6 else 2 + (i > 60))]
        for j, (x, y) in enumerate(batches[:2 + (i > 60 and i % 7 != 6)]):
            (crit(model(x), y) / 2).backward()
            if j == 0 and i % 11 == 10:
                with torch.no_grad():
                    model(x)
        opt.step()
        opt.zero_grad()


def with_another_line():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(_loader(100)):
        opt.zero_grad()
        if i % 25 == 24:
            out = model(x)      # another call site every 25 steps
        else:
            out = model(x)
        nn.functional.cross_entropy(out, y).backward()
        opt.step()


def with_exception_at(step: int):
    def script():
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i, (x, y) in enumerate(_loader(100)):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            if i == step:
                raise RuntimeError("the user's own error")
            loss.backward()
            opt.step()
    return script


def with_autocast():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in _loader(90):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
        nn.functional.cross_entropy(out.float(), y).backward()
        opt.step()


def with_closure_later():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(_loader(90)):
        def closure():
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            return loss
        if i < 60:
            closure()
            opt.step()
        else:
            opt.step(closure)


def with_a_closure_every_step():
    """The optimizer's closure runs the step's forward and backward (Lightning's automatic optimization):
    the lane's closure mode. Every ninth step's closure skips its backward (a loss of None: Lightning then
    skips it too), every 17th calls the closure a second time (an optimizer that re-evaluates, as LBFGS
    does): both go back to the full path mid-step."""
    model, crit = _model(), nn.CrossEntropyLoss()

    class Twice(torch.optim.Optimizer):
        # (its own step, not SGD's through super(): that nesting is subclass_super_step's script)
        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr})
            self.calls = 0

        @torch.no_grad()
        def step(self, closure=None):
            self.calls += 1
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
                    if self.calls % 17 == 0:
                        loss = closure()
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-group["lr"])
            return loss

    opt = Twice(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(_loader(120)):
        def closure():
            loss = crit(model(x), y)
            opt.zero_grad()
            if i % 9 != 8:
                loss.backward()
            return loss
        opt.step(closure=closure)



def with_a_closure_accumulating():
    """Lightning's gradient accumulation without Lightning: a step of three micro-batches, the first two
    running the closure themselves (a forward and a backward outside the optimizer), the third through
    the optimizer's step(closure): the lane's closure mode with micro-batches. Off the pattern now and
    then: every 11th step's first micro-batch skips its backward, every 13th calls the optimizer with a
    closure after a backward already run outside it, and the epoch's last micro-batches never reach an
    optimizer step (the next epoch begins after a backward, from a new iterator)."""
    model, crit = _model(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _epoch in range(2):
        for i, (x, y) in enumerate(_loader(200)):
            step, j = divmod(i, 3)

            def closure(x=x, y=y, skip=(j == 0 and step % 11 == 10)):
                loss = crit(model(x), y) / 3
                if j == 0:
                    opt.zero_grad()
                if not skip:
                    loss.backward()
                return loss
            if j < 2:
                closure()
                if j == 1 and step % 13 == 12:
                    opt.step(closure)       # (the step's micro-batches end early: two outside, one inside)
            else:
                opt.step(closure)


def with_lightning_accumulating():
    """A Lightning Trainer's fit with accumulate_grad_batches=3 (the closure run by the loop for the first
    two micro-batches, by the optimizer's step for the third), a validation pass each epoch."""
    _fit_boring(accumulate_grad_batches=3, batches=150)

def with_a_closure_that_raises():
    model, crit = _model(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(_loader(100)):
        def closure():
            loss = crit(model(x), y)
            if i == 70:
                raise RuntimeError("the user's own error, inside the closure")
            opt.zero_grad()
            loss.backward()
            return loss
        opt.step(closure)


def with_lightning():
    """A Lightning Trainer's fit (automatic optimization: the training step in the optimizer's closure,
    a prefetching data fetcher, a validation pass each epoch)."""
    _fit_boring()


def _fit_boring(accumulate_grad_batches: int = 1, batches: int = 60):
    import logging

    L = pytest.importorskip("lightning.pytorch")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)

    class Boring(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(8, 3)

        def forward(self, x):
            return self.layer(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val", nn.functional.cross_entropy(self(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    import tempfile

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as root:
        trainer = L.Trainer(default_root_dir=root, max_epochs=2, limit_val_batches=2, num_sanity_val_steps=0,
                            enable_progress_bar=False, enable_model_summary=False, logger=False,
                            enable_checkpointing=False, accelerator="cpu", devices=1,
                            accumulate_grad_batches=accumulate_grad_batches)
        trainer.fit(Boring(), train_dataloaders=_loader(batches), val_dataloaders=_loader(4, seed=1))


class TokenLM(nn.Module):
    """A language model called the Hugging Face way: keyword arguments, integer tokens, a dict out."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(50, 16)
        self.head = nn.Linear(16, 50)

    def forward(self, input_ids, labels=None):
        logits = self.head(self.emb(input_ids))
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()) if labels is not None else None
        return {"loss": loss, "logits": logits}


def with_tokens_and_keywords():
    model = TokenLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    data = torch.randint(0, 50, (90 * 4, 12), generator=g)
    for batch in DataLoader(TensorDataset(data), batch_size=4):
        (ids,) = batch
        out = model(input_ids=ids, labels=ids)
        out["loss"].backward()
        opt.step()
        opt.zero_grad()


def with_a_second_optimizer_alive():
    """Another optimizer object exists and never steps (kept for later, or a framework's wrapper): each
    step's optimizer-step group ends at the next fetch, not at its optimizer step."""
    model, spare_model = _model(), _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    spare = torch.optim.SGD(spare_model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(_loader(100)):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if i == 70:
            spare.zero_grad()     # it shows itself once, late: the group's rule does not change
    del spare


class _ClippedSGD(torch.optim.SGD):
    """An SGD subclass whose step() clips, then calls super().step(): once a plain SGD exists, torch has
    wrapped both classes' step() with the optimizer hooks, and they fire at each level (hooks.inside_step)."""

    def step(self, closure=None):
        for group in self.param_groups:
            nn.utils.clip_grad_norm_(group["params"], 1.0)
        return super().step(closure)


def with_a_subclass_calling_super_step():
    """The optimizer hooks fire twice a step, nested: the outer call is the step, on the lane too."""
    model, crit = _model(), nn.CrossEntropyLoss()
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)     # SGD.step wrapped by torch
    opt = _ClippedSGD(model.parameters(), lr=0.1)
    for _epoch in range(2):
        for x, y in _loader(60):
            opt.zero_grad()
            crit(model(x), y).backward()
            opt.step()


def with_a_subclass_calling_super_step_with_a_closure():
    """The same in the closure mode (the step's forward and backward in the closure the inner call runs)."""
    model, crit = _model(), nn.CrossEntropyLoss()
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    opt = _ClippedSGD(model.parameters(), lr=0.1)
    for x, y in _loader(120):
        def closure():
            loss = crit(model(x), y)
            opt.zero_grad()
            loss.backward()
            return loss
        opt.step(closure)


def with_a_subclass_whose_inner_step_raises():
    """Every 25th step the inner step (the parent class's, through super()) raises before its post-hook,
    and the script catches it: the next step's hooks are not taken as nested in a step that is over."""
    class Base(torch.optim.Optimizer):
        def __init__(self, params, lr):
            super().__init__(params, {"lr": lr})
            self.calls = 0

        @torch.no_grad()
        def step(self, closure=None):
            self.calls += 1
            if self.calls % 25 == 0:
                raise FloatingPointError("a step the script skips")
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.add_(p.grad, alpha=-group["lr"])

    class Sub(Base):
        def step(self, closure=None):
            return super().step(closure)

    model, crit = _model(), nn.CrossEntropyLoss()
    Base([torch.zeros(1, requires_grad=True)], lr=0.1)
    opt = Sub(model.parameters(), lr=0.1)
    for x, y in _loader(120):
        opt.zero_grad()
        crit(model(x), y).backward()
        try:
            opt.step()
        except FloatingPointError:
            pass


def _built_batches(n: int):
    """Batches the script builds itself, no DataLoader (nanoGPT's get_batch, word_language_model)."""
    g = torch.Generator().manual_seed(0)
    for _ in range(n):
        yield torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)


def without_a_loader():
    # with an evaluation forward under no_grad now and then
    model, crit = _model(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(_built_batches(150)):
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        if i % 50 == 49:
            model.eval()
            with torch.no_grad():
                model(x)
            model.train()


def without_a_loader_then_with_one():
    model, crit = _model(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for batches in (_built_batches(80), _loader(60)):
        for x, y in batches:
            opt.zero_grad()
            crit(model(x), y).backward()
            opt.step()


class _Raising(nn.Module):
    """A model whose forward raises on its 70th and 71st calls (a bad batch the script skips)."""

    def __init__(self):
        super().__init__()
        self.net = _model()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls in (70, 71):
            raise ValueError("a bad batch")
        return self.net(x)


def with_a_forward_that_raises():
    """The model's forward raises inside two steps; the script catches it, skips the batch and goes on
    (torch calls an always-called post hook on such a forward: so must the lane's call)."""
    model = _Raising()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in _loader(120):
        opt.zero_grad()
        try:
            out = model(x)
        except ValueError:
            continue
        nn.functional.cross_entropy(out, y).backward()
        opt.step()


def with_hooks_of_the_scripts_own():
    """The script registers a forward pre-hook and a forward hook that changes the output on its model
    at step 40 (the lane's call on by then) and removes them at step 80: each runs once a forward
    (OWN_HOOKS_SEEN, checked by the tests), and the lane goes on after."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = OWN_HOOKS_SEEN
    seen[:] = [0, 0]
    handles: list = []

    def pre(m, args):
        seen[0] += 1

    def post(m, args, out):
        seen[1] += 1
        return out * 0.5

    for i, (x, y) in enumerate(_loader(120)):
        if i == 40:
            handles = [model.register_forward_pre_hook(pre), model.register_forward_hook(post)]
        elif i == 80:
            for h in handles:
                h.remove()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


OWN_HOOKS_SEEN = [0, 0]     # the calls of the script's own pre-hook and hook (with_hooks_of_the_scripts_own)


def _run(script, monkeypatch, lane: bool, max_steps=None, file: bool = True, call: bool = True, sink_cls=None):
    """The script under a probe; its events as the file sink wrote them (``file``: the lane's quiet steps
    go to the sink's writer thread as records, built into events there), or as a callback got them.
    ``call``: the lane calls its model itself (HandOver.take_call), or keeps the probe's hooks on it."""
    import json
    import os
    import tempfile

    from diag.probe.core import Probe
    from diag.probe.sink import FileSink

    monkeypatch.setenv("DIAG_PROBE_LANE", "1" if lane else "0")
    monkeypatch.setenv("DIAG_PROBE_LANE_CALL", "1" if call else "0")
    # a budget no probe fits in: the period is the floor (1 in 64) whatever the machine's load, so which
    # steps are unsampled (the lane's) does not depend on timings
    monkeypatch.setenv("DIAG_PROBE_BUDGET", "0.0001%")
    # the last run's optimizer may be garbage not yet collected: the probe counts live optimizers with the
    # collector's objects, and a second one would change where the steps close (not what is compared here)
    gc.collect()
    events: list = []
    fd, path = tempfile.mkstemp(suffix=".jsonl")
    os.close(fd)
    sink = (sink_cls or FileSink)(path) if file else events.append
    probe = Probe(sink, script=__file__, max_steps=max_steps)
    probe.install()
    status, err = "completed", None
    try:
        script()
    except BaseException as e:   # DiagStop at the limit, or the script's own error
        status, err = type(e).__name__, e
    finally:
        probe.finish(status, 0, exception=err if isinstance(err, RuntimeError) else None)
        probe.uninstall()
        if file:
            sink.close()
            with open(path) as f:
                events = [json.loads(line) for line in f]
        os.unlink(path)
    return events, probe


def _kinds(events: list) -> list:
    # the budget runs with the lane only (a CPU build has no other sampled extras): its sampling events,
    # and the probe's own cost, are the run's, not its steps'
    return [e["kind"] for e in events if e["kind"] not in ("probe_error", "probe_sampling")
            and not (e["kind"] == "merge" and e.get("path") == "probe")]


def _same(a: list, b: list) -> None:
    assert _kinds(a) == _kinds(b)
    sa = [e for e in a if e["kind"] == "step"]
    sb = [e for e in b if e["kind"] == "step"]
    assert len(sa) == len(sb) > 0
    for x, y in zip(sa, sb):
        assert [k for k in x if k != "sampled"] == [k for k in y if k != "sampled"], x["index"]
        for k in x:
            if k in TIMES or k in ("sampled", "extra"):
                continue
            assert x[k] == y[k], (x["index"], k, x[k], y[k])
        assert set(x["extra"]) == set(y["extra"])
        parts = x["data_s"] + x["forward_s"] + x["backward_s"] + x["optimizer_s"] + x["other_s"]
        assert math.isclose(parts, x["total_s"], rel_tol=1e-9, abs_tol=1e-12)
        assert min(x["data_s"], x["forward_s"], x["backward_s"], x["optimizer_s"]) >= 0.0
        assert x["probe_s"] > 0
    for kind in ("dataloader", "optimizer", "forward_site", "evaluation", "forward_counts", "exception"):
        ea = [{k: v for k, v in e.items() if k not in TIMES and not k.endswith("_s")} for e in a if e["kind"] == kind]
        eb = [{k: v for k, v in e.items() if k not in TIMES and not k.endswith("_s")} for e in b if e["kind"] == kind]
        assert ea == eb, kind


SCRIPTS = {
    "plain": (plain, True),
    "evaluation": (with_evaluation, True),
    "teacher": (with_teacher_every_third_step, True),
    "accumulation": (with_accumulation_later, True),
    "accumulation_loader": (with_accumulation_from_a_loader, True),
    "accumulation_no_loader": (with_accumulation_without_a_loader, True),
    "accumulation_fetching_first": (with_accumulation_fetching_first, True),
    "accumulation_irregular": (with_accumulation_irregular, True),
    "another_line": (with_another_line, True),
    "exception": (with_exception_at(80), True),
    "autocast": (with_autocast, True),
    "closure": (with_closure_later, True),
    "closure_every_step": (with_a_closure_every_step, True),
    "closure_raises": (with_a_closure_that_raises, True),
    "lightning": (with_lightning, True),
    "closure_accumulating": (with_a_closure_accumulating, True),
    "lightning_accumulating": (with_lightning_accumulating, True),
    "tokens_keywords": (with_tokens_and_keywords, True),
    "second_optimizer": (with_a_second_optimizer_alive, True),
    "no_loader": (without_a_loader, True),
    "no_loader_then_loader": (without_a_loader_then_with_one, True),
    "subclass_super_step": (with_a_subclass_calling_super_step, True),
    "subclass_super_step_closure": (with_a_subclass_calling_super_step_with_a_closure, True),
    "subclass_inner_step_raises": (with_a_subclass_whose_inner_step_raises, True),
    "forward_raises": (with_a_forward_that_raises, True),
    "scripts_own_hooks": (with_hooks_of_the_scripts_own, True),
}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_lane_writes_the_same_evidence_as_the_full_path(name, monkeypatch):
    import diag.probe.lane as lane_mod

    script, lanes = SCRIPTS[name]
    built = []
    line = lane_mod.step_line
    monkeypatch.setattr(lane_mod, "step_line", lambda rec: built.append(rec[1]) or line(rec))
    with_lane, probe = _run(script, monkeypatch, lane=True)
    if name == "scripts_own_hooks":
        assert OWN_HOOKS_SEEN == [40, 40]     # each of them once a forward, on the lane too
    without, probe0 = _run(script, monkeypatch, lane=False)
    assert probe0._lane.steps == 0
    if lanes:
        assert probe._lane.steps > 10, (name, probe._lane.steps)   # the lane took steps: it was tested
        assert len(built) >= probe._lane.steps // 3, (name, len(built), probe._lane.steps)   # quiet steps: built by the writer
        # every script here takes its lane steps through the lane's call on its model (HandOver.take_call)
        assert probe._handover.calls_taken > 0, name
    errors = [e for e in with_lane if e["kind"] == "probe_error"]
    assert not errors, errors
    _same(with_lane, without)
    # lane steps are the unsampled ones, and say so
    lane_steps = [e for e in with_lane if e["kind"] == "step" and e.get("sampled") is False]
    assert len(lane_steps) >= probe._lane.steps


@pytest.mark.parametrize("name", ["plain", "accumulation_fetching_first", "closure_accumulating", "tokens_keywords",
                                  "forward_raises", "scripts_own_hooks"])
def test_the_lane_through_the_probes_hooks_writes_the_same_evidence(name, monkeypatch):
    """With the lane's call off (DIAG_PROBE_LANE_CALL=0: the lane's model keeps the probe's hooks, as a
    model with hooks of its own, or one compiled, does) the lane takes the same steps, and the evidence
    is the full path's."""
    script, _ = SCRIPTS[name]
    hooked, probe = _run(script, monkeypatch, lane=True, call=False)
    assert probe._lane.steps > 10 and probe._handover.calls_taken == 0, (probe._lane.steps, name)
    if name == "scripts_own_hooks":
        assert OWN_HOOKS_SEEN == [40, 40]
    without, _ = _run(script, monkeypatch, lane=False)
    _same(hooked, without)


def test_the_quiet_steps_line_is_the_encoders():
    """step_line writes the text json's encoder (the sink's) writes for build_step's event, and hands
    over the event itself where the encoder's own rules must apply (a value not finite, not an int)."""
    import json

    from diag.probe.lane import build_step, step_line
    from diag.probe.sink import FileSink

    enc = json.JSONEncoder(default=str, allow_nan=False)
    base = (step_line, 7, 0.00043125, 1.5e-05, 0.000123, 0.0002, 3.3e-05, 16, None, 1, 2.5e-06, 20123.4, False,
            "train.py:41:Net", 8, 123456789012, 1.25, 0, {}, 1)
    variants = [base, base[:8] + (None, 512) + base[10:], base[:12] + (True,) + base[13:],
                base[:17] + (3, {"run": "r-1\"x"}, 1), base[:6] + (-1e-7,) + base[7:],
                base[:9] + (None,) + base[10:], base[:13] + ('a "site" é',) + base[14:],
                base[:19] + (4,)]     # four micro-batches (gradient accumulation)
    for rec in variants:
        got = step_line(rec)
        assert got == enc.encode(build_step(rec)), rec
        assert json.loads(got) == build_step(rec)
    for odd in (base[:2] + (float("nan"),) + base[3:], base[:7] + (16.0,) + base[8:]):
        assert isinstance(step_line(odd), dict)
    sink = FileSink.__new__(FileSink)
    sink._enc = enc
    assert json.loads(sink._line(base[:2] + (float("nan"),) + base[3:]))["total_s"] is None


def test_lane_through_a_callback_sink(monkeypatch):
    """A sink with no writer thread (``diag.watch()``'s callback): the lane's steps are built on the step's
    thread and are the same events."""
    with_lane, probe = _run(plain, monkeypatch, lane=True, file=False)
    without, _ = _run(plain, monkeypatch, lane=False, file=False)
    assert probe._lane.steps > 10
    _same(with_lane, without)


def test_what_a_lane_step_reads_comes_first_in_the_probes_dicts(monkeypatch):
    """diag.probe.hooks.hot_first: the probe's and the hand-over's attributes that a lane step reads, first
    in their dicts (in a few cache lines), and the lane runs as before."""
    from diag.probe.core import HOT

    _events, probe = _run(plain, monkeypatch, lane=True, file=False)
    assert probe._lane.steps > 10
    assert list(vars(probe))[:len(HOT)] == list(HOT)
    assert list(vars(probe._handover))[:3] == ["active", "_call", "steps"]


@pytest.mark.parametrize("name", ["plain", "accumulation_fetching_first", "teacher"])
def test_quiet_steps_flushed_at_every_step_write_the_same_evidence(name, monkeypatch):
    """The lane keeps its quiet steps' clock values and turns them into records at the next decision
    (Lane.flush), or QUIET_NS after the last flush: flushed at every step instead, the same evidence."""
    import diag.probe.lane as lane_mod

    monkeypatch.setattr(lane_mod, "QUIET_NS", -1)
    script, _ = SCRIPTS[name]
    with_lane, probe = _run(script, monkeypatch, lane=True)
    assert probe._lane.steps > 10
    without, _ = _run(script, monkeypatch, lane=False)
    _same(with_lane, without)


def test_quiet_steps_reach_the_file_when_the_writer_cannot_take_them(monkeypatch):
    """The sink's writer stops taking records mid-run (``ready`` False, as a failed write leaves it): the
    quiet steps the lane kept go through the sink's call, as events, and none is lost."""
    import diag.probe.lane as lane_mod
    from diag.probe.sink import FileSink

    built = []
    build = lane_mod.build_step
    monkeypatch.setattr(lane_mod, "build_step", lambda rec: built.append(rec[1]) or build(rec))

    class Stalling(FileSink):
        def __init__(self, path):
            super().__init__(path)
            put, n = self._pending.append, [0]

            def defer(rec):
                n[0] += 1
                if n[0] == 3:
                    self.ready = False
                put(rec)
            self.defer = defer

    with_lane, probe = _run(plain, monkeypatch, lane=True, sink_cls=Stalling)
    assert probe._lane.steps > 10 and len(built) > 10, (probe._lane.steps, len(built))
    without, _ = _run(plain, monkeypatch, lane=False)
    _same(with_lane, without)


MARKS: list = []


def with_an_event_of_the_probe_mid_run():
    model, crit = _model(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(_loader(120)):
        opt.zero_grad()
        crit(model(x), y).backward()
        opt.step()
        if i % 25 == 24:
            MARKS[0].emit("marker", after=i + 1)


def test_an_event_emitted_mid_run_keeps_its_place_after_the_quiet_steps(monkeypatch):
    """An event the probe emits between two lane steps lands in the file after every step before it,
    the quiet steps the lane still keeps on the step's thread included (Probe.emit_dict flushes them)."""
    from diag.probe.core import Probe

    install = Probe.install

    def capture(self, *a, **k):
        MARKS[:] = [self]
        return install(self, *a, **k)

    monkeypatch.setattr(Probe, "install", capture)
    events, probe = _run(with_an_event_of_the_probe_mid_run, monkeypatch, lane=True)
    assert probe._lane.steps > 10
    last, seen = 0, []
    for e in events:
        if e["kind"] == "step":
            assert e["index"] == last + 1
            last = e["index"]
        elif e["kind"] == "marker":
            assert last == e["after"], (last, e)
            seen.append(e["after"])
    assert seen == [25, 50, 75, 100], seen


def test_lane_hands_back_mid_step(monkeypatch):
    """A step the lane had begun is handed back inside it (not only at a boundary): the forward from
    another line, and the run's end by the script's exception after its forward."""
    _ev, probe = _run(with_another_line, monkeypatch, lane=True)
    assert probe._lane.handed_back >= 2
    _ev, probe = _run(with_exception_at(80), monkeypatch, lane=True)
    assert probe._lane.handed_back >= 1     # the run ended inside a step the lane had begun


def test_lane_stops_at_the_step_limit(monkeypatch):
    a, _ = _run(plain, monkeypatch, lane=True, max_steps=70)
    b, _ = _run(plain, monkeypatch, lane=False, max_steps=70)
    assert [e["index"] for e in a if e["kind"] == "step"][-1] == 70
    _same(a, b)


def test_lane_off_by_environment(monkeypatch):
    _ev, probe = _run(plain, monkeypatch, lane=False)
    assert not probe._lane.allowed and probe._lane.steps == 0


def test_budget_quiet_feeding_is_after_step_each():
    """Budget.feed_quiet over the steps Budget.quiet_until allows decides what after_step would have."""
    import random

    from diag.probe.budget import Budget

    def run(quiet: bool):
        rnd = random.Random(1)
        b = Budget()
        out, tot, core, until = [], [], [], 0
        for i in range(1, 1500):
            t, c = 4e-4 + rnd.random() * 1e-5, 1.5e-5 + rnd.random() * 1e-6
            x = 5e-5 if b.sampled else 0.0
            if quiet and not b.sampled and i <= until:
                tot.append(t)
                core.append(c)
                out.append(False)
                continue
            if tot:
                b.feed_quiet(tot, core)
                tot, core = [], []
            out.append(b.after_step(t, c, x, b.sampled))
            until = 0 if out[-1] else b.quiet_until()
        return out, b.period, [ch["step"] for ch in b.changes]

    plain_run, quiet_run = run(False), run(True)
    assert plain_run[1] == quiet_run[1] > 1
    assert plain_run[2] == quiet_run[2]
    assert plain_run[0][:1490] == quiet_run[0][:1490]
    assert quiet_run[0].count(False) > 1000


def test_the_device_timeline_rides_the_lane(monkeypatch):
    """The device timeline is LANE: on a CUDA run the lane takes its unsampled steps too. Its marks (here
    on a host-backed stand-in for CUDA events) are the same, label for label, with and without the lane:
    none on an unsampled step but the end of the one before a sampled step; its count of unsampled steps
    is the same."""
    from test_timeline_probe import HostClock, Recording

    from diag.evidence import Evidence
    from diag.fold import fold
    from diag.probe.core import Probe

    def run(lane: bool):
        monkeypatch.setenv("DIAG_PROBE_LANE", "1" if lane else "0")
        monkeypatch.setenv("DIAG_PROBE_BUDGET", "0.0001%")
        gc.collect()
        clock = HostClock()
        ext = Recording(clock=clock)
        events: list = []
        probe = Probe(events.append, extensions=[ext]).install()
        try:
            plain()
            probe.finish("completed", 0)
        finally:
            probe.uninstall()
        ev = Evidence()
        for e in events:
            fold(ev, e)
        return clock.labels, ext.rec.unsampled, ev.primary.timeline, probe, events

    labels, unsampled, tl, probe, with_lane = run(True)
    labels0, unsampled0, tl0, probe0, without = run(False)
    assert probe._lane.steps > 50 and probe0._lane.steps == 0
    assert labels == labels0
    assert unsampled == unsampled0 > 50
    assert [s["index"] for s in tl.steps] == [s["index"] for s in tl0.steps]
    _same(with_lane, without)


def test_a_slow_last_lane_step_does_not_make_every_step_sampled(monkeypatch):
    """The budget prices a sampled step's extras as its probe time beyond the lane's core. The core is
    the median of the lane's last steps, without the extensions' step-end work the last unsampled step
    before a sampled one carries: when it was that one step's time, an extension slow there (or a
    collection inside that close) made the sampled step look free, the budget went to sampling every
    step and the lane stopped for the rest of the run (bench_depth's 11-call step, 1 run in 5)."""
    import time

    from diag.probe.core import Probe
    from diag.probe.lane import Lane

    class SlowBeforeSampled:
        LANE = True
        name = "slow-before-sampled"

        def install(self, ctx):
            self.slept = 0

        def on_step_end(self, ctx, step):
            if ctx.sampled and ctx.steps_done > 30:   # the next step is sampled: the lane's last before it
                self.slept += 1
                time.sleep(0.004)

    monkeypatch.setenv("DIAG_PROBE_LANE", "1")
    monkeypatch.delenv("DIAG_PROBE_BUDGET", raising=False)     # the default: 1% of the step
    gc.collect()
    events: list = []
    slow = SlowBeforeSampled()
    probe = Probe(events.append, extensions=[slow], script=__file__).install()
    try:
        model = _model()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in _loader(400, batch=2):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        probe.finish("completed", 0)
    finally:
        probe.uninstall()
    periods = [e["period"] for e in events if e["kind"] == "probe_sampling"]
    # a sampled step is never priced as free: no review of the run samples every step
    assert periods and min(periods) > 1, [e["reason"] for e in events if e["kind"] == "probe_sampling"]
    assert probe._lane.steps > 300, probe._lane.steps
    assert slow.slept >= 3          # the slow step-end happened: what is tested was there

    lane = Lane(True)
    lane.cores = [20e3] * 9 + [4e6]
    lane.off(probe)
    assert lane.core_ns == 20e3


@pytest.mark.parametrize("name,after", [("evaluation", 81), ("no_loader", 101)])
def test_the_lane_goes_on_after_an_evaluation(name, after, monkeypatch):
    # an evaluation pass (a DataLoader's, or forwards under no_grad on batches the script built) used
    # to keep the lane off for the rest of the run: every step after a script's first evaluation went
    # on the full path. The evidence is the same either way (test_lane_writes_the_same_evidence...)
    events, probe = _run(SCRIPTS[name][0], monkeypatch, lane=True)
    assert any(e["kind"] == "evaluation" for e in events)     # the script evaluated, and the probe saw it
    unsampled = [e["index"] for e in events if e["kind"] == "step" and e.get("sampled") is False]
    assert sum(1 for i in unsampled if i >= after) >= 10, unsampled[-20:]
    assert probe._lane.steps >= len(unsampled) - 1


def test_the_loss_module_rides_the_lane(monkeypatch):
    """A parameterless outermost module called after the model forward (a loss module: most scripts call
    one) goes through the probe's full forward hooks on the first lane step only; after it, the
    hand-over's trampolines take it (two clock reads, HandOver._local_pre/_local_post) and the step
    event is the same (the "plain" script above: test_lane_writes_the_same_evidence_as_the_full_path)."""
    import collections

    from diag.probe.core import Probe

    seen: collections.Counter = collections.Counter()
    orig = Probe.fwd_pre

    def counting(self, module, args):
        seen[type(module).__name__] += 1
        return orig(self, module, args)

    monkeypatch.setattr(Probe, "fwd_pre", counting)
    events, probe = _run(plain, monkeypatch, lane=True)
    steps = [e for e in events if e["kind"] == "step"]
    lane = probe._lane.steps
    assert lane > 60, lane
    # one full-hook call a step off the lane, and about one a lane stretch (each sampled step ends one)
    assert seen["CrossEntropyLoss"] <= len(steps) - lane + len(steps) // 8, (seen, len(steps), lane)
    # and with the lane off, every step's loss goes through them
    seen.clear()
    events0, _ = _run(plain, monkeypatch, lane=False)
    assert seen["CrossEntropyLoss"] == len([e for e in events0 if e["kind"] == "step"])


@pytest.mark.parametrize("lane", [True, False])
def test_a_step_inside_the_optimizers_step_is_one_step(lane, monkeypatch):
    """A subclass's step() that works for 1 ms, then calls super().step() (torch fires the step hooks at
    both levels): one optimizer step a step, the optimizer phase the outer call's (the 1 ms in it), and no
    discovery window for "a step no known forward fed" (a window a step, blaming the script, before)."""
    class Slow(_ClippedSGD):
        def step(self, closure=None):
            end = time.perf_counter() + 0.001
            while time.perf_counter() < end:
                pass
            return super().step(closure)

    def script():
        model, crit = _model(), nn.CrossEntropyLoss()
        torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        opt = Slow(model.parameters(), lr=0.1)
        for x, y in _loader(80):
            opt.zero_grad()
            crit(model(x), y).backward()
            opt.step()

    events, probe = _run(script, monkeypatch, lane=lane)
    steps = [e for e in events if e["kind"] == "step"]
    assert len(steps) == 80 and all(s["ended_by"] == "optimizer" for s in steps)
    assert all(s["optimizer_s"] >= 0.001 for s in steps[1:]), [s["optimizer_s"] for s in steps]
    opt = [e for e in events if e["kind"] == "optimizer" and e["cls"] == "Slow"]
    assert opt and opt[-1]["steps"] == 80
    reasons = [r for _, r in probe._handover.windows]
    assert "a step no known forward fed" not in reasons, reasons
    assert (probe._lane.steps > 40) is lane
