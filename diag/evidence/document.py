"""``Evidence``: the whole document, its JSON form and the one validating loader every command uses."""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag.errors import DiagError
from diag.evidence._schema import SchemaError, build, describe
from diag.evidence.environment import Environment
from diag.evidence.gpu import GpuTelemetry
from diag.evidence.phases import OTHER, STEP_FIELDS
from diag.evidence.plan import MemoryPlan
from diag.evidence.rank import RankEvidence
from diag.evidence.run import RunInfo

# 2: typed sections (validated field by field on load); the probe records FLOPs and the device name
#    and diag judges MFU against its catalogue. 1: the same shape, with the catalogue peak stored by
#    the probe in flops.measured (still read, as a fallback).
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)

MAX_EVIDENCE_BYTES = 512 << 20   # a real evidence file is a few MB (steps, samples and lists are bounded)
MAX_DEPTH = 64                   # nesting of JSON objects and lists
MAX_NODES = 20_000_000

_TOP_SECTIONS = {"gpu": GpuTelemetry, "memory_plan": MemoryPlan}


@dataclass
class Evidence:
    schema_version: int = SCHEMA_VERSION  # of this file's layout (see SCHEMA_VERSION)
    diag_version: str = ""              # the diag that wrote the file
    run: RunInfo = field(default_factory=RunInfo)  # what was run and how it ended
    environment: Environment = field(default_factory=Environment)  # versions, devices, flags (rank 0)
    ranks: list[RankEvidence] = field(default_factory=list)  # one per process (rank 0 only for one process)
    gpu: GpuTelemetry = field(default_factory=GpuTelemetry)  # telemetry sampled by diag's own process
    memory_plan: MemoryPlan = field(default_factory=MemoryPlan)  # batch-size plan when estimated
    notes: list[str] = field(default_factory=list)  # what a reader must know (e.g. "simulated GPUs")

    def __setattr__(self, name: str, value: Any) -> None:
        cls = _TOP_SECTIONS.get(name)
        if cls is not None and isinstance(value, dict) and not isinstance(value, cls):
            value = cls(value)
        object.__setattr__(self, name, value)

    # ---- convenience ---------------------------------------------------------------------------
    @property
    def primary(self) -> RankEvidence:
        """Rank 0 (creating an empty one if none was observed yet)."""
        if not self.ranks:
            self.ranks.append(RankEvidence())
        for r in self.ranks:
            if r.rank == 0:
                return r
        return self.ranks[0]

    def rank(self, rank: int) -> RankEvidence:
        for r in self.ranks:
            if r.rank == rank:
                return r
        r = RankEvidence(rank=rank)
        self.ranks.append(r)
        self.ranks.sort(key=lambda x: x.rank)
        return r

    def run_kind(self) -> str:
        """training | evaluation | training+evaluation | none: what the run did, judged from what was
        observed in rank 0 (``RankEvidence.run_kind``); ``run.kind`` records it when the run ends."""
        if not self.ranks:
            return self.run.kind or "none"
        return self.primary.run_kind()

    @property
    def multi_rank(self) -> bool:
        return len(self.ranks) > 1

    def to_dict(self) -> dict[str, Any]:
        """A deep copy as plain dicts and lists (what ``dataclasses.asdict`` gives, in half the time)."""
        return _plain(self)

    def to_json(self, indent: int | None = 1) -> str:
        """The evidence as JSON text. The encoder walks the objects themselves (no copy first);
        ``indent=None`` (compact) uses the C encoder: a 2,000-step evidence in tens of milliseconds
        where ``indent=1`` takes several times that."""
        return json.dumps(self, indent=indent, default=_json_fields, allow_nan=False)

    @classmethod
    def from_dict(cls, data: Any, source: str | None = None) -> "Evidence":
        """Build from parsed JSON, checking every field's type; a problem is a :class:`DiagError`
        with one sentence naming the file (``source``), the JSON path and the expected type."""
        what = f"evidence file {source!r}" if source else "the evidence file"
        if not isinstance(data, dict):
            raise DiagError(f"{what} does not hold a JSON object (it holds {describe(data)})")
        if "schema_version" not in data or data["schema_version"] is None:
            raise DiagError(f"{what} has no schema_version: it was not written by diag")
        version = data["schema_version"]
        if isinstance(version, bool) or not isinstance(version, int):
            raise DiagError(f"{what} is malformed: schema_version is {describe(version)}, expected an integer")
        if version > SCHEMA_VERSION:
            raise DiagError(
                f"{what} uses schema_version {version}, newer than this diag understands "
                f"({SCHEMA_VERSION}); upgrade diag to read it"
            )
        if version not in READABLE_VERSIONS:
            raise DiagError(f"{what} uses schema_version {version}, which this diag cannot read "
                            f"(it reads {', '.join(map(str, READABLE_VERSIONS))})")
        if version == 1:
            data = _from_v1(data)
        try:
            ev = build(cls, data, "")
        except SchemaError as e:
            raise DiagError(f"{what} is malformed: {e}") from None
        except RecursionError:
            raise DiagError(f"{what} is malformed: it is nested deeper than {MAX_DEPTH} levels") from None
        ev.schema_version = SCHEMA_VERSION
        return ev

    def save(self, path: str | os.PathLike, compact: bool = False) -> None:
        """Write atomically (a reader never sees half a file); ``compact``: no indentation (what a
        running job's evidence is rewritten with: cheaper; the final file is indented)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = self.to_json(indent=None if compact else 1)
        fd, tmp = tempfile.mkstemp(prefix=".evidence-", suffix=".json", dir=str(path.parent))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise


def _from_v1(data: dict) -> dict:
    """Schema 1 has the layout of 2. Its ``flops.measured`` also carries the probe's catalogue lookup
    (``gpu``, ``peak_flops``, ``peak_note``): kept, and used by MFU only when diag's catalogue has no
    figure for the recorded device."""
    return data


def load_evidence(path: str | os.PathLike) -> Evidence:
    """Load an evidence file (or a run directory holding ``evidence.json``); every problem is a
    :class:`DiagError` with one clear sentence naming the file (and the JSON path and expected type
    for a wrong value). Files that are not regular (``/dev/zero``, a pipe), larger than
    ``MAX_EVIDENCE_BYTES`` or nested deeper than ``MAX_DEPTH`` are refused."""
    p = Path(path)
    name = str(p)
    try:
        st = p.stat()
    except FileNotFoundError:
        raise DiagError(f"evidence file {name!r} does not exist") from None
    except OSError as e:
        raise DiagError(f"cannot read evidence file {name!r}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        cand = p / "evidence.json"
        if cand.is_file():
            p, name = cand, str(cand)
            st = p.stat()
        else:
            raise DiagError(f"{name!r} is a directory with no evidence.json in it")
    if not stat.S_ISREG(st.st_mode):
        raise DiagError(f"evidence file {name!r} is not a regular file (a device, a pipe or a socket); "
                        "give the path of an evidence.json")
    if st.st_size > MAX_EVIDENCE_BYTES:
        raise DiagError(f"evidence file {name!r} is {st.st_size / (1 << 20):.0f} MiB, larger than diag reads "
                        f"({MAX_EVIDENCE_BYTES >> 20} MiB): it was not written by diag")
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_EVIDENCE_BYTES + 1)
    except OSError as e:
        raise DiagError(f"cannot read evidence file {name!r}: {e.strerror or e}") from None
    if len(raw) > MAX_EVIDENCE_BYTES:
        raise DiagError(f"evidence file {name!r} is larger than diag reads ({MAX_EVIDENCE_BYTES >> 20} MiB)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DiagError(f"evidence file {name!r} is not UTF-8 text (byte {e.start}): it is not JSON") from None
    if not text.strip():
        raise DiagError(f"evidence file {name!r} is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DiagError(
            f"evidence file {name!r} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
            "it may be truncated"
        ) from None
    except RecursionError:
        raise DiagError(f"evidence file {name!r} is malformed: it is nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:   # an integer of more digits than Python converts (4,300)
        raise DiagError(f"evidence file {name!r} is malformed: {e}") from None
    _check_shape(data, name)
    if _SURROGATE_ESCAPE.search(text):
        data = _no_lone_surrogates(data)
    ev = Evidence.from_dict(data, source=name)
    _check_values(ev, name)
    return ev


# the measured durations of a step (other_s is the remainder, total less the phases: not checked here)
_DURATIONS = tuple(f for f in STEP_FIELDS if f != OTHER.field)


def _check_values(ev: Evidence, name: str) -> None:
    """Values no run can produce (the types are right, the numbers impossible): one sentence."""
    what = f"evidence file {name!r} is malformed"
    seen: dict[int, int] = {}
    for r in ev.ranks:
        if isinstance(r.rank, int):
            seen[r.rank] = seen.get(r.rank, 0) + 1
    twice = sorted(k for k, n in seen.items() if n > 1)
    if twice:
        raise DiagError(f"{what}: rank {twice[0]} appears {seen[twice[0]]} times (each rank is recorded once)")
    wall = ev.run.wall_s
    if isinstance(wall, (int, float)) and wall < 0:
        raise DiagError(f"{what}: run.wall_s is {wall}, a negative duration")
    for r in ev.ranks:
        for s in r.steps:
            for f in _DURATIONS:
                v = getattr(s, f, 0.0)
                if isinstance(v, (int, float)) and (v < -1e-6 or v != v):
                    raise DiagError(f"{what}: rank {r.rank}'s step {s.index} has {f} = {v}, "
                                    "not a duration (negative or NaN)")


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_lone_surrogates(data: Any) -> Any:
    """A lone surrogate (``"\\ud800"`` in the JSON) cannot be written as UTF-8 by any report: each is
    replaced with U+FFFD, in keys and values, without recursion."""
    def fix(v):
        return _SURROGATE.sub("\ufffd", v) if isinstance(v, str) else v

    root = [data]
    stack: list[tuple[Any, Any]] = [(root, 0)]   # (list, index) or (dict, key)
    while stack:
        parent, key = stack.pop()
        value = parent[key]
        if isinstance(value, dict):
            new = {fix(k): v for k, v in value.items()}
            parent[key] = new
            stack.extend((new, k) for k in new)
        elif isinstance(value, list):
            stack.extend((value, i) for i in range(len(value)))
        elif isinstance(value, str):
            parent[key] = fix(value)
    return root[0]


def _check_shape(data: Any, name: str) -> None:
    """Depth and size bounds, without recursion."""
    stack = [(data, 1)]
    nodes = 0
    while stack:
        value, depth = stack.pop()
        nodes += 1
        if depth > MAX_DEPTH:
            raise DiagError(f"evidence file {name!r} is malformed: it is nested deeper than {MAX_DEPTH} levels")
        if nodes > MAX_NODES:
            raise DiagError(f"evidence file {name!r} holds more than {MAX_NODES:,} values: it was not written by diag")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(t: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(t)
    if names is None:
        names = _FIELD_NAMES[t] = tuple(f.name for f in dataclasses.fields(t))
    return names


def _json_fields(o: Any) -> Any:
    """The JSON encoder's ``default``: a dataclass as its fields (not copied: the encoder walks them),
    anything else as :func:`_json_default` has it."""
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return {n: getattr(o, n) for n in _field_names(type(o))}
    return _json_default(o)


_ATOMS = (str, int, float, bool, type(None))


def _plain(o: Any) -> Any:
    """``dataclasses.asdict`` for the evidence's objects: dataclasses as dicts, lists, tuples and
    dicts (sections keep their class) rebuilt, anything else deep-copied."""
    t = type(o)
    if t in _ATOMS:
        return o
    if t is list:
        return [_plain(x) for x in o]
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return {n: _plain(getattr(o, n)) for n in _field_names(t)}
    if isinstance(o, dict):
        return t((_plain(k), _plain(v)) for k, v in o.items())
    if isinstance(o, tuple) and hasattr(o, "_fields"):      # a named tuple
        return t(*[_plain(x) for x in o])
    if isinstance(o, (list, tuple)):
        return t(_plain(x) for x in o)
    return copy.deepcopy(o)


def _json_default(o: Any) -> Any:
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return dataclasses.asdict(o)
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    return str(o)
