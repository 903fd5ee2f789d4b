"""torchrun on diag's side (no torch): the launcher options, the local rendezvous, the failing rank.

- :func:`parse_nproc` / :func:`validate_torchrun`: the launcher options are checked before anything
  starts (one clear sentence each);
- :func:`root_cause` / :func:`format_root_cause`: which rank failed first and its traceback, shown
  once after a torchrun job ends (the other ranks' errors are consequences, summarised in a line).
"""
from __future__ import annotations

import re

from diag.errors import DiagError

NPROC_WORDS = ("cpu", "gpu", "auto", "xpu")

# torchrun options diag passes through, as `diag check` spells them (dest name -> torchrun flag)
TORCHRUN_OPTIONS = {
    "nnodes": "--nnodes",
    "node_rank": "--node-rank",
    "master_addr": "--master-addr",
    "master_port": "--master-port",
    "rdzv_endpoint": "--rdzv-endpoint",
    "rdzv_backend": "--rdzv-backend",
    "rdzv_id": "--rdzv-id",
    "rdzv_conf": "--rdzv-conf",
    "max_restarts": "--max-restarts",
    "local_addr": "--local-addr",
}


def parse_nproc(value) -> int | str:
    """A --nproc-per-node value as torchrun accepts it: a positive whole number, or cpu/gpu/auto/xpu."""
    if isinstance(value, bool):
        raise ValueError(f"expected a positive whole number or one of {', '.join(NPROC_WORDS)}, got {value!r}")
    if isinstance(value, int):
        n = value
    else:
        text = str(value).strip()
        if text.lower() in NPROC_WORDS:
            return text.lower()
        try:
            n = int(text)
        except ValueError:
            raise ValueError(f"expected a positive whole number or one of {', '.join(NPROC_WORDS)}, "
                             f"got {text!r}") from None
    if n <= 0:
        raise ValueError(f"must be a positive number of processes, got {n}")
    return n


def parse_nnodes(text: str) -> tuple[int, int]:
    """torchrun's --nnodes: N or MIN:MAX."""
    parts = str(text).split(":")
    try:
        nums = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"expected N or MIN:MAX (whole numbers), got {text!r}") from None
    if len(nums) == 1:
        lo = hi = nums[0]
    elif len(nums) == 2:
        lo, hi = nums
    else:
        raise ValueError(f"expected N or MIN:MAX, got {text!r}")
    if lo <= 0 or hi < lo:
        raise ValueError(f"expected 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


def parse_port(text) -> int:
    try:
        port = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"expected a port number, got {text!r}") from None
    if not 0 < port < 65536:
        raise ValueError(f"a port is between 1 and 65535, got {port}")
    return port


def parse_endpoint(text: str) -> str:
    """HOST[:PORT] (an IPv6 host in brackets)."""
    text = str(text).strip()
    m = re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^:\s\[\]]+)(?::(\d+))?", text)
    if not m:
        raise ValueError(f"expected HOST or HOST:PORT, got {text!r}")
    if m.group(2) is not None:
        parse_port(m.group(2))
    return text


def _opt(args: list[str], flag: str) -> str | None:
    """The value of a torchrun option in an argument list (--flag=v, --flag v, --flag_name v)."""
    names = {flag, flag.replace("-", "_").replace("__", "--", 1)}
    value = None
    for i, a in enumerate(args):
        for n in names:
            if a == n and i + 1 < len(args):
                value = args[i + 1]
            elif a.startswith(n + "="):
                value = a[len(n) + 1:]
    return value


def _has(args: list[str], flag: str) -> bool:
    names = {flag, flag.replace("-", "_").replace("__", "--", 1)}
    return any(a in names or any(a.startswith(n + "=") for n in names) for a in args)


def validate_torchrun(nproc, torchrun_args: list[str], python: str | None = None) -> int | str:
    """Check the launcher options before launch; returns the normalised --nproc-per-node.
    Every problem is a DiagError with one sentence. With ``python``, ``gpu``/``xpu`` are checked
    against that interpreter's torch (a subprocess: diag's own process does not import torch)."""
    args = [str(a) for a in (torchrun_args or [])]
    if nproc is None:
        if args:
            raise DiagError(f"torchrun options ({' '.join(args)}) need --nproc-per-node "
                            "(how many processes to start on this node)")
        return None
    try:
        n = parse_nproc(nproc)
    except ValueError as e:
        raise DiagError(f"--nproc-per-node: {e}") from None
    if _has(args, "--nproc-per-node"):
        raise DiagError("give --nproc-per-node once, as diag's own option")
    for flag in ("--no-python", "--module", "-m", "--run-path"):
        if _has(args, flag):
            raise DiagError(f"torchrun's {flag} cannot be passed through: diag starts each rank itself "
                            "(python -m diag.probe SCRIPT); give the script with --script")
    for flag, parse in (("--nnodes", parse_nnodes), ("--master-port", parse_port),
                        ("--rdzv-endpoint", parse_endpoint)):
        v = _opt(args, flag)
        if v is not None:
            try:
                parse(v)
            except ValueError as e:
                raise DiagError(f"{flag}: {e}") from None
    nnodes = parse_nnodes(_opt(args, "--nnodes")) if _opt(args, "--nnodes") else (1, 1)
    node_rank = _opt(args, "--node-rank")
    if node_rank is not None:
        try:
            nr = int(node_rank)
        except ValueError:
            raise DiagError(f"--node-rank: expected a whole number, got {node_rank!r}") from None
        if nr < 0:
            raise DiagError(f"--node-rank: must be 0 or more, got {nr}")
        if nnodes[0] == nnodes[1] and nr >= nnodes[1]:
            raise DiagError(f"--node-rank {nr} is out of range for --nnodes {nnodes[1]} "
                            f"(node ranks go from 0 to {nnodes[1] - 1})")
    master_addr = _opt(args, "--master-addr")
    if master_addr is not None and not master_addr.strip():
        raise DiagError("--master-addr is empty")
    endpoint = _opt(args, "--rdzv-endpoint")
    standalone = _has(args, "--standalone")
    if nnodes[1] > 1:
        if standalone:
            raise DiagError("--standalone runs a single node; it cannot be used with --nnodes "
                            f"{_opt(args, '--nnodes')}")
        if not master_addr and not endpoint:
            raise DiagError(f"--nnodes {_opt(args, '--nnodes')} needs --master-addr (with --node-rank) "
                            "or --rdzv-endpoint, so that the nodes can find each other")
        backend = _opt(args, "--rdzv-backend") or "static"
        if backend == "static" and not endpoint and node_rank is None:
            raise DiagError(f"--nnodes {_opt(args, '--nnodes')} with --master-addr needs --node-rank "
                            "(0 on the node at --master-addr, 1, 2, ... on the others)")
    if python and n in ("gpu", "xpu"):
        _check_accelerator(python, n)
    return n


RENDEZVOUS_FLAGS = ("--standalone", "--master-addr", "--master-port", "--rdzv-endpoint", "--rdzv-backend",
                    "--rdzv-id", "--node-rank")


def with_local_rendezvous(torchrun_args: list[str], environ=None) -> list[str]:
    """torchrun's arguments, plus ``--standalone`` for a one-node job that names no rendezvous (neither
    as an option nor as torchrun's PET_* environment variables). Recent torch does this by itself; torch
    before that listens on the fixed port 29500, and two jobs on one machine (two CI jobs, a job and
    its ``diag check``) collide. ``--standalone`` rendezvouses on a free local port."""
    import os

    environ = os.environ if environ is None else environ
    args = [str(a) for a in (torchrun_args or [])]
    if any(_has(args, f) for f in RENDEZVOUS_FLAGS):
        return args
    if any(k.startswith(("PET_MASTER_", "PET_RDZV_")) or k in ("PET_STANDALONE", "PET_NODE_RANK")
           for k in environ):
        return args
    nnodes = _opt(args, "--nnodes")
    if nnodes is not None:
        try:
            if parse_nnodes(nnodes) != (1, 1):
                return args
        except ValueError:
            return args
    return [*args, "--standalone"]


def _check_accelerator(python: str, kind: str) -> None:
    import subprocess

    mod = "cuda" if kind == "gpu" else "xpu"
    code = (f"import sys, torch; m = getattr(torch, {mod!r}, None); "
            "sys.exit(0 if m is not None and m.is_available() and m.device_count() > 0 else 3)")
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, timeout=120, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return          # cannot tell: torchrun will say
    if r.returncode == 3:
        name = "CUDA GPU" if kind == "gpu" else "XPU"
        raise DiagError(f"--nproc-per-node {kind} starts one process per {name}, and torch sees none on "
                        f"this machine; give a number of processes instead (e.g. --nproc-per-node 2)")


# ---------------------------------------------------------------------------------------------------
# the failing rank

def _abs_time(r, t) -> float:
    return (r.started_at or 0.0) + (t or 0.0)


def first_exception(evidence):
    """(rank evidence, ExceptionInfo) of the earliest exception across ranks, or None."""
    best = None
    for r in evidence.ranks:
        for e in r.exceptions:
            key = _abs_time(r, e.t)
            if best is None or key < best[0]:
                best = (key, r, e)
    return (best[1], best[2]) if best else None


def root_cause(evidence) -> dict | None:
    """The rank that failed first in a multi-process run: its exception (when the probe saw one)
    or what the launcher saw (exit code, signal); the other ranks' failures as consequences."""
    failed = [r for r in evidence.ranks if r.status in ("failed", "oom", "killed")
              or r.distributed.get("launcher_exit")]
    if not failed:
        return None
    first = first_exception(evidence)
    if first is not None:
        rank, exc = first
    else:
        # nothing raised in Python (killed by a signal, crashed in native code): the launcher's view
        observed = [r for r in failed if (r.distributed.get("launcher_exit") or {}).get("first_observed")]
        rank, exc = (observed or failed)[0], None
    others = []
    for r in evidence.ranks:
        if r is rank:
            continue
        le = r.distributed.get("launcher_exit") or {}
        if r.exceptions:
            e = r.exceptions[-1]
            others.append((r.rank, f"{e.type}: {_first_line(e.message)}"))
        elif le.get("signal"):
            others.append((r.rank, f"ended by {le['signal']}"))
        elif r.status in ("failed", "oom", "killed"):
            others.append((r.rank, f"ended with status {r.status}"))
    return {"rank": rank.rank, "host": rank.host, "exception": exc,
            "launcher_exit": rank.distributed.get("launcher_exit"), "others": others}


def _first_line(text: str, limit: int = 200) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def root_cause_summary(rc: dict) -> str:
    exc = rc["exception"]
    where = f"rank {rc['rank']}" + (f" on {rc['host']}" if rc.get("host") else "")
    if exc is not None:
        return f"{where} failed first: {exc.type}: {_first_line(exc.message)}"
    le = rc.get("launcher_exit") or {}
    if le.get("signal"):
        return f"{where} was killed by {le['signal']}"
    if le.get("exitcode") is not None:
        return f"{where} exited with status {le['exitcode']}"
    return f"{where} ended without reporting an error"


def format_root_cause(evidence) -> str | None:
    """Text shown once after a failed multi-process run: the first failure's traceback, then one
    line per other rank."""
    rc = root_cause(evidence)
    if rc is None:
        return None
    lines = [f"diag: {root_cause_summary(rc)}"]
    exc = rc["exception"]
    if exc is not None and exc.traceback:
        lines.append(exc.traceback.rstrip("\n"))
    elif exc is None:
        lines.append("  (no Python exception: a native crash, the out-of-memory killer or an external signal; "
                     "the end of the run's log may say more)")
    if rc["others"]:
        lines.append("diag: the other ranks stopped because of it:")
        for rank, what in rc["others"][:16]:
            lines.append(f"  rank {rank}: {what}")
        if len(rc["others"]) > 16:
            lines.append(f"  ... and {len(rc['others']) - 16} more")
    return "\n".join(lines) + "\n"
