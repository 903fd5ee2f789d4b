"""Widgets of diag's TUI: the run header and one pane per tab."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from textual.containers import Vertical


@dataclass
class UIState:
    """Everything the panes render, held by the app. Panes read it; only the app writes it."""
    mode: str = "run"                 # run | replay | monitor
    snapshot: Any = None              # diag.tui.live.Snapshot (evidence + findings), None until judged
    version: int = 0                  # bumped when a new snapshot arrives
    gpu: Any = None                   # diag.tui.models.gpus.GpuFeed, or None without a GPU sampler
    gpu_version: int = 0              # bumped when new GPU samples arrived
    paused: bool = False
    stopping: bool = False
    clock: Callable[[], float] = field(default=lambda: 0.0)
    source_path: str | None = None    # replay: the evidence file
    log_path: str | None = None
    extra: dict = field(default_factory=dict)

    @property
    def evidence(self):
        return self.snapshot.evidence if self.snapshot else None

    @property
    def findings(self) -> list:
        return self.snapshot.findings if self.snapshot else []


class Pane(Vertical):
    """A tab's content. The app calls :meth:`maybe_refresh` only while the tab is shown, and the
    pane re-renders only when the data it depends on changed (hidden tabs cost nothing)."""

    def __init__(self, *children, **kw) -> None:
        super().__init__(*children, **kw)
        self._seen: Any = object()
        self.renders = 0               # how many times refresh_data ran (tests, bench)

    def data_key(self, state: UIState) -> Any:
        return state.version

    def maybe_refresh(self, state: UIState, force: bool = False) -> bool:
        key = self.data_key(state)
        if not force and key == self._seen:
            return False
        self._seen = key
        self.renders += 1
        self.refresh_data(state)
        return True

    def refresh_data(self, state: UIState) -> None:  # pragma: no cover - overridden
        raise NotImplementedError
