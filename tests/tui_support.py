"""Helpers for the TUI tests: the recorded demo run, simulated GPUs on a frozen clock, text of widgets.

The recorded run (tests/fixtures/tui/) comes from a real `diag check` of the bundled demo; see
tests/fixtures/tui/make_fixture.py.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console

from diag.evidence import load_evidence
from diag.findings import Finding

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "tui"
EVIDENCE = FIXTURES / "evidence.json"
EPOCH = 1796220000.0          # the unix time simulated GPUs start at (fixed)


def demo_evidence():
    return load_evidence(EVIDENCE)


def demo_findings() -> list[Finding]:
    return [Finding.from_dict(d) for d in json.loads((FIXTURES / "findings.json").read_text())]


def frozen_clock():
    """A clock stopped 30 s after the recorded run started."""
    ev = demo_evidence()
    t = (ev.run.started_at or EPOCH) + 30.0
    return lambda: t


def sim_sampler(scenario: str = "healthy-8", samples: int = 60, interval: float = 1.0):
    """A sampler of simulated GPUs already holding `samples` readings, on a frozen clock (no thread)."""
    from diag.gpu import Sampler, SimulatedProvider

    now = [1000.0]
    prov = SimulatedProvider(scenario, clock=lambda: now[0], epoch=EPOCH)
    sampler = Sampler(prov, interval=interval, host=prov.host)
    for _ in range(samples):
        now[0] += interval
        sampler.sample_once()
    return sampler


def sim_gpu(scenario: str = "healthy-8", samples: int = 60):
    from diag.tui.models.gpus import GpuFeed

    return GpuFeed(sim_sampler(scenario, samples), own=False)


def replay_app(tab: str = "checks", scenario: str | None = "healthy-8", evidence=None, findings=None,
               **kw):
    """The app on the recorded demo run (nothing executes), with simulated GPUs and a frozen clock."""
    from diag.tui.app import DiagApp
    from diag.tui.live import ReplaySource

    ev = evidence if evidence is not None else demo_evidence()
    fs = findings if findings is not None else demo_findings()
    source = ReplaySource(ev, findings=fs, path=str(EVIDENCE), label="tests/fixtures/tui/evidence.json")
    gpu = sim_gpu(scenario) if scenario else None
    return DiagApp(source, gpu, clock=frozen_clock(), initial_tab=tab, **kw)


def monitor_app(scenario: str = "healthy-8", tab: str = "gpus", **kw):
    from diag.tui.app import DiagApp
    from diag.tui.live import Source

    return DiagApp(Source(), sim_gpu(scenario), clock=frozen_clock(), initial_tab=tab, **kw)


def plain(renderable, width: int = 100) -> str:
    """A rich renderable (or Text, or str) as plain text."""
    if isinstance(renderable, str):
        return renderable
    plain_attr = getattr(renderable, "plain", None)
    if isinstance(plain_attr, str):
        return plain_attr
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False,
                      record=True)
    console.print(renderable)
    return console.export_text()


def widget_text(app, selector: str, width: int = 100) -> str:
    """The text a Static shows."""
    from textual.widgets import Static

    w = app.query_one(selector, Static)
    return plain(w.content, width)


def freeze_catalogue(monkeypatch) -> None:
    """The Cost tab prices with a copy of the GPU catalogue taken when the snapshots were made
    (tests/fixtures/tui/gpus.toml), so that a price update in diag/cost/gpus.toml does not change them."""
    import diag.cost.catalog as cat
    import diag.tui.models.cost as cf

    monkeypatch.setattr(cat, "BUILTIN_PATH", FIXTURES / "gpus.toml")
    monkeypatch.setattr(cat, "_BUILTIN_CACHE", None)
    monkeypatch.setattr(cf, "_catalog", cat.load_catalog(user=False))
