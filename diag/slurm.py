"""``diag check`` as the program of a Slurm step (``srun diag check ...``). No torch; no ``scontrol``.

Two ways to run (docs/distributed.md, "Slurm"):

(a) one task per node, each running torchrun::

        srun --ntasks-per-node=1 diag check --script train.py --nnodes $SLURM_NNODES \\
             --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint $head:29500

(b) one task per GPU, no torchrun: each task is one rank. RANK, LOCAL_RANK, WORLD_SIZE,
    LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT are derived from Slurm's variables when the user's
    environment does not set them (``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_NTASKS``, the first
    host of ``SLURM_STEP_NODELIST``/``SLURM_JOB_NODELIST``, a port from the job id)::

        srun --ntasks-per-node=8 diag check --script train.py

Every task writes its evidence into one shared job directory (``--run-dir DIR``; by default
``$SLURM_SUBMIT_DIR/.diag/runs/slurm-<job id>.<step id>``)::

    DIR/job.json                 the step: expected parts, nodes, mode
    DIR/part-<K>/                task K's own run directory (evidence.json, log.txt, events)
    DIR/parts/<K>.done           written (atomic rename) when task K's run has ended
    DIR/.merge-claim-<id>        created with O_EXCL by the one task that merges
    DIR/evidence.json            the job's merged evidence; DIR/report.json its report

The last task to finish (the one that sees every part done, and wins the O_EXCL claim when two
finish at once) merges the parts (:func:`diag.merge.merge_evidence`) and reports on the whole job;
the others print one line. ``diag merge DIR`` does the same afterwards (a task that was killed never
writes its part: the merge says which are missing). The protocol needs only atomic ``rename`` and
``O_EXCL`` create on the shared filesystem (NFS v3+, Lustre, GPFS have both).
"""
from __future__ import annotations

import json
import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from diag.errors import DiagError

PORT_BASE = 20000
PORT_SPAN = 20000
SPECIAL_STEPS = 0xFFFFFFF0     # Slurm's batch (0xFFFFFFFE), extern (0xFFFFFFFD) and other reserved step ids


# ---------------------------------------------------------------------------------------------------
# Slurm's compressed lists

def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in {text!r}")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError(f"unbalanced '[' in {text!r}")
    out.append(cur)
    return [x.strip() for x in out if x.strip()]


def _expand_range(body: str) -> list[str]:
    vals: list[str] = []
    for part in body.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"bad range {part!r}")
        a, b = m.group(1), m.group(2)
        if b is None:
            vals.append(a)
            continue
        lo, hi = int(a), int(b)
        if hi < lo:
            raise ValueError(f"bad range {part!r} (end before start)")
        if hi - lo > 100000:
            raise ValueError(f"range {part!r} is too long")
        width = len(a) if a.startswith("0") else 0      # node[01-03]: keep the zero padding
        vals.extend(str(i).zfill(width) for i in range(lo, hi + 1))
    return vals


def parse_nodelist(text: str) -> list[str]:
    """Expand Slurm's hostlist form: ``node[01-03,07],gpu5`` -> node01 node02 node03 node07 gpu5;
    several bracket groups make every combination (``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2).
    ValueError on a malformed list."""
    hosts: list[str] = []
    for item in _split_top(str(text or "")):
        parts = re.split(r"(\[[^\]]*\])", item)
        names = [""]
        for p in parts:
            if p.startswith("[") and p.endswith("]"):
                vals = _expand_range(p[1:-1])
                names = [n + v for n in names for v in vals]
            elif "[" in p or "]" in p:
                raise ValueError(f"unbalanced brackets in {item!r}")
            else:
                names = [n + p for n in names]
        hosts.extend(names)
    return hosts


def parse_tasks_per_node(text: str) -> list[int]:
    """``SLURM_TASKS_PER_NODE`` / ``SLURM_STEP_TASKS_PER_NODE``: ``2(x3),1`` -> [2, 2, 2, 1]."""
    out: list[int] = []
    for part in str(text or "").split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part)
        if not m:
            raise ValueError(f"bad tasks-per-node entry {part!r}")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


# ---------------------------------------------------------------------------------------------------
# the step

@dataclass
class SlurmStep:
    job_id: str
    step_id: str
    procid: int
    localid: int
    ntasks: int
    nnodes: int
    nodeid: int
    nodes: list[str] = field(default_factory=list)
    tasks_per_node: list[int] = field(default_factory=list)
    launch_ip: str | None = None
    submit_dir: str | None = None
    restart: str = "0"

    @property
    def key(self) -> str:
        return f"{self.job_id}.{self.step_id}" + (f".r{self.restart}" if self.restart not in ("", "0") else "")

    def node_of(self, procid: int) -> str | None:
        """The node task ``procid`` runs on under Slurm's default block distribution."""
        if self.tasks_per_node and self.nodes:
            seen = 0
            for host, n in zip(self.nodes, self.tasks_per_node):
                if procid < seen + n:
                    return host
                seen += n
        if self.nodes and self.ntasks == len(self.nodes):
            return self.nodes[procid] if procid < len(self.nodes) else None
        return None

    def master_addr(self) -> str | None:
        """Where rank 0 runs: the first node of the step (block distribution), else the node srun
        was started from."""
        if self.nodes:
            return self.nodes[0]
        return self.launch_ip

    def master_port(self) -> int:
        digits = re.sub(r"\D", "", self.job_id) or "0"
        return PORT_BASE + int(digits) % PORT_SPAN


def _int(environ, *names) -> int | None:
    for n in names:
        v = environ.get(n)
        if v not in (None, ""):
            try:
                return int(str(v).split("(")[0])
            except ValueError:
                raise DiagError(f"Slurm's {n}={v!r} is not a number") from None
    return None


def detect(environ=None) -> SlurmStep | None:
    """The Slurm step this process is a task of, when it is one of several (``SLURM_JOB_ID``,
    ``SLURM_STEP_ID`` and ``SLURM_PROCID`` set, more than one task); None otherwise (a batch script,
    a one-task step, no Slurm). ``DIAG_SLURM=0`` turns it off."""
    environ = os.environ if environ is None else environ
    if str(environ.get("DIAG_SLURM", "")).strip().lower() in ("0", "off", "no", "false"):
        return None
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    step = environ.get("SLURM_STEP_ID") or environ.get("SLURM_STEPID")
    if not job or step in (None, "") or environ.get("SLURM_PROCID") in (None, ""):
        return None
    if not str(step).isdigit() or int(step) >= SPECIAL_STEPS:
        return None      # the batch script ("batch", 4294967294) or the extern step: not an srun step
    ntasks = _int(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS") or 1
    if ntasks <= 1:
        return None
    procid = _int(environ, "SLURM_PROCID") or 0
    if not 0 <= procid < ntasks:
        raise DiagError(f"SLURM_PROCID={procid} is outside the step's {ntasks} tasks")
    nodes: list[str] = []
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if environ.get(name):
            try:
                nodes = parse_nodelist(environ[name])
            except ValueError as e:
                raise DiagError(f"cannot read Slurm's {name}={environ[name]!r}: {e}") from None
            break
    tpn: list[int] = []
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if environ.get(name):
            try:
                tpn = parse_tasks_per_node(environ[name])
            except ValueError:
                tpn = []
            break
    return SlurmStep(job_id=str(job), step_id=str(step), procid=procid,
                     localid=_int(environ, "SLURM_LOCALID") or 0, ntasks=ntasks,
                     nnodes=_int(environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES") or
                     max(1, len(nodes)),
                     nodeid=_int(environ, "SLURM_NODEID") or 0, nodes=nodes, tasks_per_node=tpn,
                     launch_ip=environ.get("SLURM_LAUNCH_NODE_IPADDR") or None,
                     submit_dir=environ.get("SLURM_SUBMIT_DIR") or None,
                     restart=str(environ.get("SLURM_RESTART_COUNT", "0") or "0"))


def rank_env(step: SlurmStep, environ=None) -> dict[str, str]:
    """Mode (b), one task per rank: the variables ``init_process_group("env://")`` reads, from Slurm's,
    for those the user's environment does not set."""
    environ = os.environ if environ is None else environ
    local_n = None
    if step.tasks_per_node and step.nodeid < len(step.tasks_per_node):
        local_n = step.tasks_per_node[step.nodeid]
    derived = {"RANK": str(step.procid), "LOCAL_RANK": str(step.localid), "WORLD_SIZE": str(step.ntasks),
               "MASTER_PORT": str(step.master_port())}
    if local_n:
        derived["LOCAL_WORLD_SIZE"] = str(local_n)
    addr = step.master_addr()
    if addr:
        derived["MASTER_ADDR"] = addr
    return {k: v for k, v in derived.items() if not environ.get(k)}


def default_job_dir(step: SlurmStep, runs_root: str = ".diag/runs") -> Path:
    base = Path(step.submit_dir) if step.submit_dir and not os.path.isabs(runs_root) else Path(".")
    return base / runs_root / f"slurm-{step.key}"


# ---------------------------------------------------------------------------------------------------
# the shared job directory

class JobDir:
    """The shared directory of one Slurm step's diag runs, and the last-to-finish protocol."""

    def __init__(self, path, step: SlurmStep, mode: str):
        self.path = Path(path)
        self.step = step
        self.mode = mode

    @property
    def part_dir(self) -> Path:
        return self.path / f"part-{self.step.procid}"

    def prepare(self) -> None:
        try:
            (self.path / "parts").mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise DiagError(f"cannot create the Slurm job directory {str(self.path)!r}: {e.strerror}") from None
        stale = self.path / "parts" / f"{self.step.procid}.done"
        try:
            stale.unlink()       # a rerun of this task: its earlier part is no longer done
        except OSError:
            pass
        info = {"job_id": self.step.job_id, "step_id": self.step.step_id, "key": self.step.key,
                "expected": self.step.ntasks, "nnodes": self.step.nnodes, "nodes": self.step.nodes,
                "tasks_per_node": self.step.tasks_per_node, "mode": self.mode}
        _atomic_write(self.path / "job.json", json.dumps(info, indent=1), f".{self.step.procid}")

    def mark_done(self, status: str) -> None:
        rec = {"procid": self.step.procid, "host": socket.gethostname(), "status": status, "time": time.time(),
               "run_dir": f"part-{self.step.procid}", "key": self.step.key}
        _atomic_write(self.path / "parts" / f"{self.step.procid}.done", json.dumps(rec), "")

    def done_parts(self) -> list[int]:
        """The tasks of this step whose run has ended (a marker left by another job in a reused
        directory does not count)."""
        return sorted(k for k, rec in _markers(self.path).items()
                      if rec.get("key") in (None, self.step.key) and k < self.step.ntasks)

    def claim(self) -> bool:
        """True for exactly one caller: the one whose O_EXCL create of the claim file succeeds."""
        try:
            fd = os.open(self.path / f".merge-claim-{self.step.key}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(f"{self.step.procid} {socket.gethostname()} {time.time()}\n")
        return True


def _atomic_write(path: Path, text: str, suffix: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}{suffix}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _markers(path: Path) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for p in (Path(path) / "parts").glob("*.done"):
        if not p.stem.isdigit():
            continue
        try:
            rec = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            rec = {}
        out[int(p.stem)] = rec if isinstance(rec, dict) else {}
    return out


def read_job(path) -> dict:
    p = Path(path) / "job.json"
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def merge_dir(path, *, partial: bool = False):
    """The merged Evidence of a job directory. DiagError (one sentence) for a directory that is not
    one, holds no part, or is missing parts (unless ``partial``): which tasks and nodes are missing."""
    from diag.evidence import load_evidence
    from diag.merge import merge_evidence

    d = Path(path)
    if not d.is_dir():
        raise DiagError(f"{str(path)!r} is not a directory: give the Slurm job directory diag check wrote "
                        "(its --run-dir, or .diag/runs/slurm-<job>.<step>)")
    job = read_job(d)
    parts = sorted((p for p in d.glob("part-*") if (p / "evidence.json").is_file()),
                   key=lambda p: int(p.name[5:]) if p.name[5:].isdigit() else 1 << 30)
    if not job and not parts:
        raise DiagError(f"{str(path)!r} holds no Slurm job: no job.json and no part-*/evidence.json "
                        "(diag check writes them when it runs as the program of an srun step)")
    if not parts:
        raise DiagError(f"{str(path)!r} holds no task's evidence yet: no part-*/evidence.json "
                        f"(expected {job.get('expected', '?')} parts)")
    expected = int(job.get("expected") or len(parts))
    parts = [p for p in parts if p.name[5:].isdigit() and int(p.name[5:]) < expected]   # not an older job's
    have = {int(p.name[5:]) for p in parts}
    key = job.get("key")
    done = {k for k, rec in _markers(d).items() if rec.get("key") in (None, key)}
    missing = sorted(set(range(expected)) - have)
    unfinished = sorted(have - done) if (d / "parts").is_dir() else []
    if (missing or unfinished) and not partial:
        step = SlurmStep(job_id=str(job.get("job_id", "?")), step_id=str(job.get("step_id", "?")), procid=0,
                         localid=0, ntasks=expected, nnodes=int(job.get("nnodes") or 1), nodeid=0,
                         nodes=list(job.get("nodes") or []), tasks_per_node=list(job.get("tasks_per_node") or []))
        what = []
        if missing:
            what.append(f"{len(missing)} of {expected} parts have no evidence: " + _parts_text(missing, step))
        if unfinished:
            what.append("still running or killed before the end: " + _parts_text(unfinished, step))
        raise DiagError(f"the job in {str(path)!r} is incomplete ({'; '.join(what)})",
                        hint=f"diag merge {path} --partial judges the parts that are there")
    if not parts:
        raise DiagError(f"{str(path)!r} holds no evidence of this job's {expected} tasks (part-0 to part-{expected - 1})")
    evs = [load_evidence(str(p / "evidence.json")) for p in parts]
    merged = merge_evidence(evs, sources=[p.name for p in parts]) if len(evs) > 1 else evs[0]
    if partial and (missing or unfinished):
        merged.notes.append(f"partial job: {len(parts)} of {expected} parts merged"
                            + (f"; missing {', '.join(f'part-{m}' for m in missing)}" if missing else ""))
    merged.run.run_dir = str(d.resolve())
    merged.run.log_path = None
    return merged


def _parts_text(procids: list[int], step: SlurmStep) -> str:
    out = []
    for k in procids[:16]:
        node = step.node_of(k)
        out.append(f"task {k}" + (f" (node {node})" if node else ""))
    if len(procids) > 16:
        out.append(f"and {len(procids) - 16} more")
    return ", ".join(out)


# ---------------------------------------------------------------------------------------------------
# diag check under srun

class CheckPart:
    """What ``diag check`` does differently as one task of a Slurm step: its run directory is a part
    of the shared job directory; mode (b) gets the rank variables; at the end, the last task merges."""

    def __init__(self, step: SlurmStep, job: JobDir):
        self.step = step
        self.job = job

    @classmethod
    def for_check(cls, args, cfg, environ=None) -> "CheckPart | None":
        environ = os.environ if environ is None else environ
        step = detect(environ)
        if step is None:
            return None
        torchrun = bool(cfg.nproc_per_node)
        path = Path(args.run_dir) if getattr(args, "run_dir", None) else default_job_dir(step, cfg.runs_root)
        job = JobDir(path.absolute(), step, "torchrun per node" if torchrun else "one task per rank")
        job.prepare()
        cfg.run_dir = str(job.part_dir)
        if torchrun:
            _fill_torchrun(cfg, step)
        else:
            cfg.env.update(rank_env(step, {**environ, **cfg.env}))
        return cls(step, job)

    def finish(self, evidence):
        """(merged evidence, None) for the task that merges; (None, the one-line message) for the others."""
        self.job.mark_done(evidence.run.status or "completed")
        done = self.job.done_parts()
        n = self.step.ntasks
        who = f"task {self.step.procid + 1}/{n}" if self.job.mode == "one task per rank" else \
            f"node {self.step.procid + 1}/{n}"
        later = (f"{who} done; the job's report will be written by the last task to finish: {self.job.path}"
                 f" (or run: diag merge {self.job.path})")
        if len(set(done) & set(range(n))) < n or not self.job.claim():
            return None, later
        try:
            merged = merge_dir(self.job.path)
        except DiagError as e:
            return None, f"{who} done, last to finish, but the job could not be merged: {e.message}"
        try:
            merged.save(self.job.path / "evidence.json")
            os.chmod(self.job.path / "evidence.json", 0o600)
        except OSError:
            pass
        return merged, None


def _fill_torchrun(cfg, step: SlurmStep) -> None:
    """Mode (a): a static rendezvous (--master-addr without --node-rank) takes this node's rank from
    SLURM_NODEID; without any rendezvous option, the first node of the step is the master."""
    args = list(cfg.torchrun_args)
    names = " ".join(args)
    multi = any(a.startswith("--nnodes=") and a.split("=", 1)[1] not in ("1", "1:1") for a in args)
    if not multi:
        return
    has_endpoint = "--rdzv-endpoint" in names or "--rdzv_endpoint" in names
    if not has_endpoint and "--master-addr" not in names and step.master_addr():
        args.append(f"--master-addr={step.master_addr()}")
        if "--master-port" not in names:
            args.append(f"--master-port={step.master_port()}")
    if not has_endpoint and "--node-rank" not in names:
        args.append(f"--node-rank={step.nodeid}")
    cfg.torchrun_args = args
