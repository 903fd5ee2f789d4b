"""The one adapter from a sampling window to Evidence (``run.source = "attach"``).

Everything attach saw goes into each rank's ``extras["attach"]`` (shape in docs/attach.md); the probe's
sections (steps, forwards, optimizers, sync counts ...) stay empty because sampling cannot observe
them exactly. When Evidence becomes a typed package, this function is the only place to port.
"""
from __future__ import annotations

import os
import platform
import socket
import uuid

from diag import __version__
from diag.evidence import Environment, Evidence, RankEvidence, RunInfo

ATTACH_KEY = "attach"


def is_attach(ev) -> bool:
    return getattr(ev.run, "source", "probe") == "attach"


def attach_section(rank) -> dict:
    return (rank.extras or {}).get(ATTACH_KEY) or {}


def window_to_evidence(w) -> Evidence:
    """Build Evidence from a :class:`diag.attach.session.Window`."""
    first = w.processes[0].target if w.processes else None
    run = RunInfo(
        id="attach-" + uuid.uuid4().hex[:8],
        script=first.script if first else None,
        args=list(first.cmdline[2:]) if first and len(first.cmdline) > 2 else [],
        cwd=first.cwd if first else "",
        command=list(first.cmdline) if first else [],
        launcher="attach",
        started_at=w.started_at, ended_at=w.ended_at, wall_s=w.duration_s,
        status="running" if all(p.alive_after for p in w.processes) else "stopped",
        stop_reason=None if all(p.alive_after for p in w.processes) else
        "a sampled process ended during the window",
        limits={"duration": w.duration_s, "rate_hz": w.rate},
        simulated_gpus=w.simulated_gpus,
    )
    run.source = "attach"
    if getattr(w, "interrupted", False):
        run.status = "interrupted"
        run.stop_reason = f"sampling interrupted by Ctrl-C after {w.duration_s:.1f} s (the job was not touched)"
    env = Environment(python=platform.python_version(), platform=platform.platform(), hostname=socket.gethostname(),
                      cpu_count=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
                      cpu_count_logical=os.cpu_count())
    ev = Evidence(diag_version=__version__, run=run, environment=env, gpu=w.gpu)
    for i, p in enumerate(w.processes):
        t = p.target
        rank = t.rank if t.rank is not None else i
        r = RankEvidence(rank=rank, local_rank=t.local_rank if t.local_rank is not None else rank,
                         world_size=t.world_size or len(w.processes), host=env.hostname, pid=t.pid,
                         started_at=t.create_time, status="running" if p.alive_after else "stopped")
        r.extras[ATTACH_KEY] = {
            "source": "attach", "sampled": True, "sampler": "py-spy", "pyspy_version": w.pyspy_version,
            "rate_hz": w.rate, "window_s": w.duration_s, "pid": t.pid, "command": t.cmdline[:50],
            "user": t.username, "job_pid": w.job_pid, "cpu_percent": p.cpu_percent,
            "main": p.main, "workers": p.workers, "threads": p.threads, "alive_after": p.alive_after,
        }
        ev.ranks.append(r)
    ev.ranks.sort(key=lambda r: r.rank)
    ev.notes.append(f"sampled from outside by py-spy at {w.rate} Hz for {w.duration_s:.1f} s "
                    f"(diag attach): phase shares are estimates from stack samples, not timings")
    if w.simulated_gpus:
        ev.notes.append(f"GPU values are simulated (scenario '{w.simulated_gpus}'), not measured")
    return ev
