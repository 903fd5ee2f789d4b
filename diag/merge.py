"""Merge the evidence files of the nodes of one multi-node torchrun job into one Evidence.

    diag check --from node0/evidence.json --from node1/evidence.json

Each node runs ``diag check --nproc-per-node N --nnodes M --node-rank K ...`` and writes its own
run directory holding its own ranks (global rank numbers). Merging keeps every rank, takes the
environment, GPU telemetry and memory plan of the file holding rank 0, and sets the run's
status to the worst of the nodes'. Files that cannot belong to one job are refused with one clear
sentence: a single-process run, the same rank in two files, different world sizes, different
torchrun job ids. Ranks missing from every file (a node's file not given) are allowed and noted.

Pure Python, no torch.
"""
from __future__ import annotations

from diag.errors import DiagError
from diag.evidence import Evidence, RunInfo

STATUS_ORDER = ["oom", "failed", "killed", "interrupted", "timeout", "stopped", "completed", "running"]


def _world_size(ev: Evidence) -> int:
    sizes = {r.world_size for r in ev.ranks if r.world_size}
    for r in ev.ranks:
        ws = r.distributed.get("world_size")
        if isinstance(ws, int):
            sizes.add(ws)
    return max(sizes) if sizes else 1


def _job_id(ev: Evidence) -> str | None:
    """torchrun's job id (--rdzv-id; TORCHELASTIC_RUN_ID), when the job had one of its own."""
    for r in ev.ranks:
        run_id = (r.distributed.get("launcher") or {}).get("run_id")
        if run_id not in (None, "", "none"):
            return str(run_id)
    v = ev.environment.env.get("TORCHELASTIC_RUN_ID")
    return v if v not in (None, "", "none") else None


def _label(source: str) -> str:
    return source if len(source) <= 80 else "…" + source[-79:]


def _ranks_text(ranks) -> str:
    ranks = sorted(ranks)
    if not ranks:
        return "none"
    parts, start, prev = [], ranks[0], ranks[0]
    for r in ranks[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ", ".join(parts)


def merge_evidence(evidences: list[Evidence], sources: list[str] | None = None) -> Evidence:
    """One Evidence holding the ranks of every file; DiagError when they cannot be one job."""
    if not evidences:
        raise DiagError("nothing to merge: no evidence file given")
    sources = [str(s) for s in (sources or [f"file {i + 1}" for i in range(len(evidences))])]
    if len(sources) != len(evidences):
        raise DiagError("merge_evidence: one source name is needed per evidence file")
    if len(evidences) == 1:
        return evidences[0]

    # the same file given twice (or a file and its run directory)
    for i, ev in enumerate(evidences):
        for j in range(i):
            other = evidences[j]
            if ev.run.id and ev.run.id == other.run.id and ev.run.started_at == other.run.started_at:
                raise DiagError(f"{_label(sources[i])} and {_label(sources[j])} are the same run "
                                f"({ev.run.id}); give each node's evidence file once")

    for ev, src in zip(evidences, sources):
        if not ev.ranks:
            raise DiagError(f"{_label(src)} holds no rank (the run observed nothing); it cannot be merged")
        if _world_size(ev) <= 1:
            raise DiagError(f"{_label(src)} is a single-process run (world size 1); only the files of the "
                            "nodes of one torchrun job can be merged")

    sizes = [_world_size(ev) for ev in evidences]
    if len(set(sizes)) > 1:
        detail = ", ".join(f"{_label(s)}: {w}" for s, w in zip(sources, sizes))
        raise DiagError(f"the files come from jobs of different world sizes ({detail}); "
                        "they are not the nodes of one job")
    world = sizes[0]

    jobs = [_job_id(ev) for ev in evidences]
    named = {j for j in jobs if j}
    if len(named) > 1:
        detail = ", ".join(f"{_label(s)}: {j}" for s, j in zip(sources, jobs) if j)
        raise DiagError(f"the files come from different torchrun jobs (job ids {detail}); "
                        "merge only the files of the nodes of one job")

    owner: dict[int, str] = {}
    for ev, src in zip(evidences, sources):
        for r in ev.ranks:
            if r.rank >= world or r.rank < 0:
                raise DiagError(f"{_label(src)} holds rank {r.rank}, outside world size {world}")
            if r.rank in owner:
                raise DiagError(f"rank {r.rank} appears in both {_label(owner[r.rank])} and {_label(src)}; "
                                "each node's file holds different ranks: were these files written by "
                                "the nodes of one job (each with its own --node-rank)?")
            owner[r.rank] = src

    primary_idx = next((i for i, ev in enumerate(evidences) if any(r.rank == 0 for r in ev.ranks)), 0)
    primary = evidences[primary_idx]
    out = Evidence(diag_version=primary.diag_version, environment=primary.environment,
                   gpu=primary.gpu, memory_plan=primary.memory_plan)
    out.run = _merge_run(evidences, sources, primary)
    for ev in evidences:
        out.ranks.extend(ev.ranks)
    out.ranks.sort(key=lambda r: r.rank)

    notes: list[str] = []
    for ev in evidences:
        for n in ev.notes:
            if n not in notes:
                notes.append(n)
    hosts = {}
    for ev, src in zip(evidences, sources):
        hosts[src] = sorted({r.host for r in ev.ranks if r.host})
    notes.append(f"merged from {len(evidences)} evidence files: "
                 + "; ".join(f"{_label(s)} (ranks {_ranks_text([r.rank for r in ev.ranks])}"
                             + (f" on {', '.join(hosts[s])}" if hosts[s] else "") + ")"
                             for ev, s in zip(evidences, sources)))
    missing = sorted(set(range(world)) - set(owner))
    if missing:
        notes.append(f"ranks {_ranks_text(missing)} of world size {world} are in none of the files: "
                     "the checks judge the ranks present only")
    if any(ev.gpu and (ev.gpu.get("provider") not in (None, "none") or ev.gpu.get("devices"))
           for i, ev in enumerate(evidences) if i != primary_idx):
        notes.append(f"GPU telemetry is that of {_label(sources[primary_idx])} (the node of rank 0); "
                     "the other nodes' telemetry is in their own evidence files")
    out.notes = notes
    return out


def _merge_run(evidences: list[Evidence], sources: list[str], primary: Evidence) -> RunInfo:
    p = primary.run
    runs = [ev.run for ev in evidences]
    status = min((r.status for r in runs),
                 key=lambda s: STATUS_ORDER.index(s) if s in STATUS_ORDER else len(STATUS_ORDER))
    worst = next(r for r in runs if r.status == status)
    starts = [r.started_at for r in runs if r.started_at is not None]
    ends = [r.ended_at for r in runs if r.ended_at is not None]
    walls = [r.wall_s for r in runs if r.wall_s is not None]
    exit_code = next((r.exit_code for r in runs if r.exit_code), p.exit_code)
    limits = dict(p.limits)
    return RunInfo(
        id="merged-" + "+".join(r.id or "?" for r in runs),
        script=p.script, args=list(p.args), cwd=p.cwd, command=list(p.command),
        launcher="merged", started_at=min(starts) if starts else None,
        ended_at=max(ends) if ends else None, wall_s=max(walls) if walls else None,
        status=status, exit_code=exit_code, stop_reason=worst.stop_reason, limits=limits,
        run_dir=None, log_path=None,
        simulated_gpus=next((r.simulated_gpus for r in runs if r.simulated_gpus), None),
        sources=list(sources),
    )
