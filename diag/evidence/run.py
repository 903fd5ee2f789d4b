"""``Evidence.run`` (what was run and how it ended) and ``RankEvidence.exceptions``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunInfo:
    id: str = ""                          # the run directory's name (YYYYmmdd-HHMMSS-xxxx)
    script: str | None = None           # absolute path of the user's script (None for in-process runs)
    args: list[str] = field(default_factory=list)  # the script's arguments
    cwd: str = ""                         # the working directory
    command: list[str] = field(default_factory=list)  # what diag executed
    launcher: str = "python"            # python | torchrun | in-process | merged
    started_at: float | None = None     # unix time
    ended_at: float | None = None         # unix time
    wall_s: float | None = None           # wall-clock duration of the run
    status: str = "running"             # running | completed | failed | oom | stopped | timeout | interrupted | killed
    exit_code: int | None = None        # the script's exit status, when it ended by itself
    stop_reason: str | None = None      # why diag stopped it ("--steps 20 reached", "--max-time 60 s")
    limits: dict[str, Any] = field(default_factory=dict)  # {"steps": N, "max_time": S}
    run_dir: str | None = None            # the run directory
    log_path: str | None = None           # log.txt: the script's stdout and stderr
    simulated_gpus: str | None = None   # scenario name when GPU values are simulated
    sources: list[str] = field(default_factory=list)  # for merged evidence: the files merged
    kind: str | None = None             # training | evaluation | training+evaluation | none: what the run did (RankEvidence.run_kind of rank 0; set when the run ends)
    source: str = "probe"               # probe: observed by the probe in the script | attach: sampled from outside (diag attach)
    script_facts: dict[str, Any] | None = None  # read from the script's source by diag (never run): its own flags (flag, dest, line, default), DataLoader(...) calls (line, names, num_workers_from), iterated names per line; null when unreadable


@dataclass
class ExceptionInfo:
    type: str = ""                        # exception class name
    message: str = ""                     # str(exception)
    traceback: str = ""                   # the user's frames; diag's own removed from the top
    is_oom: bool = False                  # a CUDA out-of-memory error
    step: int | None = None               # steps completed before it
    t: float | None = None                # seconds since the probe started
    location: dict | None = None        # innermost frame in the user's script
