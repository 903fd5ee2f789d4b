"""``Evidence.run`` (what was run and how it ended) and ``RankEvidence.exceptions``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunInfo:
    id: str = ""
    script: str | None = None           # absolute path of the user's script (None for in-process runs)
    args: list[str] = field(default_factory=list)
    cwd: str = ""
    command: list[str] = field(default_factory=list)  # what diag executed
    launcher: str = "python"            # python | torchrun | in-process | merged
    started_at: float | None = None     # unix time
    ended_at: float | None = None
    wall_s: float | None = None
    status: str = "running"             # running | completed | failed | oom | stopped | timeout | interrupted | killed
    exit_code: int | None = None        # the script's exit status, when it ended by itself
    stop_reason: str | None = None      # why diag stopped it ("--steps 20 reached", "--max-time 60 s")
    limits: dict[str, Any] = field(default_factory=dict)  # {"steps": N, "max_time": S}
    run_dir: str | None = None
    log_path: str | None = None
    simulated_gpus: str | None = None   # scenario name when GPU values are simulated
    sources: list[str] = field(default_factory=list)  # for merged evidence: the files merged


@dataclass
class ExceptionInfo:
    type: str = ""
    message: str = ""
    traceback: str = ""
    is_oom: bool = False
    step: int | None = None
    t: float | None = None
    location: dict | None = None        # innermost frame in the user's script
