"""From py-spy's speedscope document to per-process summaries: phase shares, the user's hottest lines,
host-device synchronisation lines, a stuck stack, step-like cycles, and what DataLoader workers do.

Everything here is plain data in, plain data out (no py-spy, no psutil), so it is tested on hand-made
documents as well as real recordings.
"""
from __future__ import annotations

import linecache
import re
from collections import Counter
from dataclasses import dataclass, field

from diag.attach.phases import (
    PHASES, TRAINING_PHASES, Frame, classify, frame_phase, is_user_frame, line_text, user_line,
)

_PROFILE_NAME = re.compile(r"Process\s+(\d+)\s+Thread\s+(\d+)(?:\s+\"(.*)\")?", re.IGNORECASE)

MIN_STUCK_SAMPLES = 10
MAX_LINES = 10


@dataclass
class ThreadSamples:
    pid: int
    tid: int
    name: str
    stacks: list[tuple[Frame, ...]] = field(default_factory=list)   # outermost first, in sampling order
    weights: list[float] = field(default_factory=list)


def parse_speedscope(doc: dict) -> dict[int, list[ThreadSamples]]:
    """Threads by process id. py-spy's synthetic frames (process/thread labels) are dropped."""
    frames_raw = ((doc.get("shared") or {}).get("frames")) or []
    frames = [Frame(name=str(f.get("name") or "?"), file=str(f.get("file") or ""), line=int(f.get("line") or 0))
              for f in frames_raw]
    out: dict[int, list[ThreadSamples]] = {}
    for prof in doc.get("profiles") or []:
        m = _PROFILE_NAME.search(str(prof.get("name") or ""))
        if not m:
            continue
        pid, tid, name = int(m.group(1)), int(m.group(2)), m.group(3) or ""
        th = ThreadSamples(pid=pid, tid=tid, name=name)
        samples = prof.get("samples") or []
        weights = prof.get("weights") or [0.0] * len(samples)
        for idx, w in zip(samples, weights):
            stack = tuple(frames[i] for i in idx if 0 <= i < len(frames) and frames[i].file)
            th.stacks.append(stack)
            th.weights.append(float(w or 0.0))
        out.setdefault(pid, []).append(th)
    return out


def main_thread(threads: list[ThreadSamples], pid: int) -> ThreadSamples | None:
    for t in threads:
        if t.tid == pid:
            return t
    for t in threads:
        if t.name == "MainThread":
            return t
    return max(threads, key=lambda t: len(t.stacks), default=None)


def _loc(f: Frame | None) -> dict | None:
    if f is None:
        return None
    return {"file": f.file, "line": f.line, "function": f.name.rsplit(".", 1)[-1], "code": line_text(f)}


def _what_waits(stack: tuple[Frame, ...]) -> str:
    """In words, what an innermost stack waits on (a lock, a queue, a collective, sleep...)."""
    names = [(f.name, f.file) for f in stack]
    for name, file in reversed(names):
        if "/torch/distributed/" in file:
            return f"the collective {name.rsplit('.', 1)[-1]} (torch.distributed)"
    rules = (
        (lambda n, f: "/torch/utils/data/" in f, lambda n: "the DataLoader (waiting for a batch)"),
        (lambda n, f: f.endswith("/queue.py") and n.endswith("get"), lambda n: "a queue.Queue.get() with no timeout"),
        (lambda n, f: f.endswith("/multiprocessing/queues.py"), lambda n: "a multiprocessing queue"),
        (lambda n, f: f.endswith("/threading.py") and ("wait" in n or "acquire" in n or "join" in n),
         lambda n: f"threading ({n})"),
    )
    for test, say in rules:
        for name, file in reversed(names):
            if test(name, file):
                return say(name)
    leaf = stack[-1] if stack else None
    code = line_text(leaf) if leaf else ""
    if re.search(r"\.acquire\(|with\s+\w*lock", code, re.IGNORECASE):
        return f"a lock (`{code}`)"
    if "sleep(" in code:
        return f"a sleep (`{code}`)"
    if "join(" in code:
        return f"a join (`{code}`)"
    if ".get(" in code:
        return f"a blocking get (`{code}`)"
    return f"`{code}`" if code else "the same call"


def count_cycles(phases: list[str]) -> int:
    """Step-like cycles: how many times the main thread entered a training phase (data, forward,
    backward, optimizer) coming from another phase; 0 when it never changed phase."""
    runs = [p for i, p in enumerate(phases) if i == 0 or p != phases[i - 1]]
    if len(runs) < 2:
        return 0
    return sum(1 for i, p in enumerate(runs) if i > 0 and p in TRAINING_PHASES)


def summarise_main(th: ThreadSamples, rate: float) -> dict:
    """The main thread of one training process over the window."""
    linecache.checkcache()        # the user's files may have changed since an earlier window
    n = len(th.stacks)
    phases = [classify(list(s)) for s in th.stacks]
    counts = Counter(phases)
    phase_d = {p: {"samples": counts.get(p, 0), "share": round(counts.get(p, 0) / n, 4) if n else 0.0}
               for p in PHASES}
    lines: Counter = Counter()
    line_phase: dict = {}
    sync_lines: Counter = Counter()
    for s, ph in zip(th.stacks, phases):
        u = user_line(list(s))
        if u is None:
            continue
        key = (u.file, u.line, u.name)
        lines[key] += 1
        line_phase.setdefault(key, Counter())[ph] += 1
        if ph == "sync":
            sync_lines[key] += 1
    hot = []
    for (file, line, name), c in lines.most_common(MAX_LINES):
        d = _loc(Frame(name, file, line))
        d.update(samples=c, share=round(c / n, 4), phase=line_phase[(file, line, name)].most_common(1)[0][0])
        hot.append(d)
    syncs = []
    for (file, line, name), c in sync_lines.most_common(MAX_LINES):
        d = _loc(Frame(name, file, line))
        d.update(samples=c, share=round(c / n, 4))
        syncs.append(d)
    stuck = None
    if n >= MIN_STUCK_SAMPLES:
        stack, c = Counter(th.stacks).most_common(1)[0]
        # stuck: one stack in every sample (1 in 100 may differ: a torn non-blocking read), and not a
        # sleep (a loop that sleeps between short bursts of work looks the same at a low rate)
        sleeping = bool(stack) and "sleep(" in line_text(stack[-1])
        # ... and not a wait that ends now and then: a sample in another training phase (a DDP rank waiting
        # ~99% of each step in backward's all-reduce for a slower rank, its forward and optimizer step in
        # the rest) is the thread moving, not a torn read (a rank at a 0.2 s straggler's pace was
        # "stuck" in 4-s windows whenever the 100 Hz samples caught its forward fewer than 5 times)
        top = classify(list(stack))
        moved = c < n and any(ph != top and ph in TRAINING_PHASES for s2, ph in zip(th.stacks, phases) if s2 != stack)
        if c >= n - n // 100 and th.stacks[0] == stack and th.stacks[-1] == stack and not sleeping and not moved:
            u = user_line(list(stack))
            leaf = stack[-1] if stack else None
            stuck = {"samples": c, "share": round(c / n, 4), "seconds_at_least": round(n / rate, 1) if rate else None,
                     "where": _loc(u), "innermost": _loc(leaf), "phase": top,
                     "waits_on": _what_waits(stack),
                     "stack": [f.to_dict() for f in stack[-12:]]}
    ddp = any("/torch/nn/parallel/distributed.py" in f.file for s in th.stacks for f in s)
    return {
        "samples": n, "phases": phase_d, "hot_lines": hot, "sync_lines": syncs, "stuck": stuck,
        "cycles": count_cycles(phases), "ddp": ddp,
        "phase_sequence": _compress(phases)[-200:],
    }


def _compress(phases: list[str]) -> list[list]:
    out: list[list] = []
    for p in phases:
        if out and out[-1][0] == p:
            out[-1][1] += 1
        else:
            out.append([p, 1])
    return out


_WORKER_IDLE = ("/multiprocessing/queues.py", "/multiprocessing/connection.py", "/threading.py", "/selectors.py")


def summarise_worker(threads: list[ThreadSamples], pid: int) -> dict:
    """A DataLoader worker (or any child): the share of samples spent fetching (busy) versus
    waiting for work, and its top frames."""
    th = main_thread(threads, pid)
    if th is None or not th.stacks:
        return {"pid": pid, "samples": 0, "busy_share": None, "top_frames": []}
    busy = 0
    tops: Counter = Counter()
    for s in th.stacks:
        if not s:
            continue
        # a forked worker carries its parent's frames above the fork: look below the worker loop only
        start = 0
        for i, f in enumerate(s):
            if "/torch/utils/data/_utils/worker.py" in f.file:
                start = i + 1
                break
        own = s[start:] or s[-1:]
        leaf = own[-1]
        working = any("/torch/utils/data/_utils/fetch.py" in f.file or is_user_frame(f) for f in own)
        if working or not leaf.file.endswith(_WORKER_IDLE):
            busy += 1
            u = user_line(list(own)) or leaf
            tops[(u.file, u.line, u.name)] += 1
    n = len(th.stacks)
    top = []
    for (file, line, name), c in tops.most_common(5):
        d = _loc(Frame(name, file, line))
        d.update(samples=c, share=round(c / n, 4))
        top.append(d)
    return {"pid": pid, "samples": n, "busy_share": round(busy / n, 4), "top_frames": top}


def other_threads(threads: list[ThreadSamples], main: ThreadSamples | None) -> list[dict]:
    out = []
    for t in threads:
        if t is main or not t.stacks:
            continue
        leafs = Counter(s[-1] for s in t.stacks if s)
        leaf = leafs.most_common(1)[0][0] if leafs else None
        out.append({"tid": t.tid, "name": t.name, "samples": len(t.stacks),
                    "top": None if leaf is None else f"{leaf.name} ({leaf.short})",
                    "phase": None if leaf is None else frame_phase(leaf)})
    return out[:20]
