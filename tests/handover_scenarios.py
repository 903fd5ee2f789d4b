"""Scenarios for the probe's hook hand-over (issue 20, diag/probe/handover.py): plain torch training
snippets with the cases the hand-over must get right (a model built mid-run, two models, evaluation
only models, a parameterless wrapper, ``model.forward``, closures, a frozen backbone, an EMA deep copy,
a forward that raises, a DataLoader evaluation, ``train()`` every step, DDP, torch.compile).
tests/test_handover.py runs each under the real probe with and without the hand-over and compares
what the probe saw. ``KNOWN_MISS_submodule_no_signal`` is the documented miss (docs/performance.md):
a child called directly with no window signal is seen only in periodic windows."""
from __future__ import annotations

import copy

import torch
from torch import nn


def _mlp(d=8):
    return nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, 4))


def _train(model, steps, x=None, loss_fn=None, opt=None):
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        xb = x if x is not None else torch.randn(4, 8)
        opt.zero_grad()
        out = model(xb)                                         # TRAIN
        (loss_fn(out, torch.zeros(4, dtype=torch.long)) if loss_fn else out.sum()).backward()
        opt.step()
    return opt


def sc_train_then_eval():
    m = _mlp()
    _train(m, 40)
    m.eval()
    with torch.no_grad():
        for _ in range(3):
            m(torch.randn(2, 8))                                # EVAL no_grad
    for _ in range(3):
        m(torch.randn(2, 8))                                    # EVAL grad (eval.no-grad)


def sc_model_built_mid_run():
    m = _mlp()
    _train(m, 40)
    m2 = _mlp()                                                 # built after the hand-over
    _train(m2, 10)


def sc_two_models():
    g, d = _mlp(), nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    og, od = torch.optim.SGD(g.parameters(), lr=0.01), torch.optim.SGD(d.parameters(), lr=0.01)
    for _ in range(40):
        og.zero_grad()
        od.zero_grad()
        d(g(torch.randn(4, 8))).sum().backward()                # G+D
        og.step()
        od.step()


def sc_eval_only_model_built_early():
    m, val = _mlp(), _mlp()                                     # val: built at the start, used only at the end
    val.eval()
    _train(m, 40)
    for _ in range(3):
        val(torch.randn(2, 8))                                  # VAL-ONLY (no loader, no .eval() now)


def sc_eval_only_model_built_late():
    m = _mlp()
    _train(m, 40)
    val = nn.Sequential(nn.Linear(8, 2))
    for _ in range(3):
        val(torch.randn(2, 8))                                  # VAL-LATE


def sc_loss_module_and_wrapper():
    m, loss_fn = _mlp(), nn.CrossEntropyLoss()
    _train(m, 40, loss_fn=loss_fn)

    class Scored(nn.Module):                                    # parameterless, built after the hand-over
        def __init__(self, model):
            super().__init__()
            self.__dict__["model"] = model

        def forward(self, x):
            return self.model(x).softmax(-1)                    # INNER-CALL
    s = Scored(m)
    with torch.no_grad():
        for _ in range(3):
            s(torch.randn(2, 8))                                # WRAPPED


def sc_direct_forward():
    m = _mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for _ in range(40):
        opt.zero_grad()
        m.forward(torch.randn(4, 8)).sum().backward()           # model.forward(x): no hook on the model
        opt.step()


def sc_closure():
    m = _mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for _ in range(40):
        def closure():
            opt.zero_grad()
            loss = m(torch.randn(4, 8)).sum()                   # CLOSURE
            loss.backward()
            return loss
        opt.step(closure)


def sc_frozen_backbone():
    backbone, head = _mlp(), nn.Linear(4, 2)
    for p in backbone.parameters():
        p.requires_grad_(False)
    backbone.eval()
    opt = torch.optim.SGD(head.parameters(), lr=0.01)
    for _ in range(40):
        opt.zero_grad()
        head(backbone(torch.randn(4, 8))).sum().backward()      # FROZEN
        opt.step()


def sc_ema_deepcopy():
    m = _mlp()
    opt = _train(m, 20)
    ema = copy.deepcopy(m)                                      # after the hand-over: m carries hooks
    for _ in range(20):
        _train(m, 1, opt=opt)
        with torch.no_grad():
            ema(torch.randn(2, 8))                              # EMA


def sc_compile():
    m = _mlp()
    _train(m, 20)
    cm = torch.compile(m, backend="eager")                      # compiled after the hand-over
    _train(cm, 20)


def sc_loader_eval():
    from torch.utils.data import DataLoader, TensorDataset
    m = _mlp()
    _train(m, 40)
    val = _mlp()
    with torch.no_grad():
        for (x,) in DataLoader(TensorDataset(torch.randn(6, 8)), batch_size=2):
            val(x)                                              # LOADER-EVAL


def sc_submodule_called_directly():
    m = nn.Sequential(_mlp(), nn.Linear(4, 4))
    _train(m, 40)
    m.eval()
    with torch.no_grad():
        for _ in range(3):
            m[0](torch.randn(2, 8))                             # SUBMODULE (a child, not a root)


def sc_KNOWN_MISS_submodule_no_signal():
    m = nn.Sequential(_mlp(), nn.Linear(4, 4))
    _train(m, 40)
    with torch.no_grad():
        for _ in range(3):
            m[0](torch.randn(2, 8))                             # no .eval(), no loader, no new module


def sc_forward_raises():
    class Flaky(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 4)
            self.n = 0

        def forward(self, x):
            self.n += 1
            if self.n % 5 == 0:
                raise ValueError("flaky")
            return self.lin(x)
    m = Flaky()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for _ in range(50):
        try:
            opt.zero_grad()
            m(torch.randn(4, 8)).sum().backward()               # RAISES every 5th call
            opt.step()
        except ValueError:
            pass


def sc_train_called_every_step():
    m = _mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    for _ in range(40):
        m.train()                                               # no mode change: no window
        opt.zero_grad()
        m(torch.randn(4, 8)).sum().backward()
        opt.step()


def sc_ddp():
    import tempfile

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    with tempfile.NamedTemporaryFile() as f:
        dist.init_process_group("gloo", init_method=f"file://{f.name}", rank=0, world_size=1)
        try:
            m = DDP(_mlp())                                      # wrapped: DDP is the outermost module
            _train(m, 40)
            with m.no_sync():
                m(torch.randn(4, 8)).sum().backward()           # NO-SYNC
        finally:
            dist.destroy_process_group()


SCENARIOS = {k[3:]: v for k, v in dict(globals()).items() if k.startswith("sc_")}
