"""Evidence: everything diag observed about one run, as plain, versioned JSON.

Checks see nothing else. Evidence is built by folding probe events (see :mod:`diag.fold`), saved to
``evidence.json`` in the run directory as it grows, and can be loaded anywhere with
:func:`load_evidence` to re-run the checks without executing anything.

The field-by-field documentation lives in ``docs/evidence.md``; keep the two in step.

Layout::

    Evidence
      schema_version, run (RunInfo), environment (Environment)
      ranks: [RankEvidence]       one per process (rank 0 only for a single-process run)
      gpu: {...}                  telemetry sampled by diag's own process (shape: docs/gpus.md)
      memory_plan: {...}          the batch-size plan when one was estimated (memory planner)
      notes: [str]                things diag wants the reader to know (e.g. "simulated GPUs")

This module must not import torch.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diag.errors import DiagError

SCHEMA_VERSION = 1

# Bounds that keep Evidence small for long runs: the newest steps are kept in full, older ones
# only in the running aggregates (`StepStats`).
MAX_STEPS_KEPT = 2000
MAX_EXCEPTIONS_KEPT = 20
MAX_LIST_SECTION = 2000


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
    source: str = "probe"               # probe: observed by the probe in the script | attach: sampled from outside (diag attach)


@dataclass
class DeviceInfo:
    index: int = 0
    name: str = ""
    type: str = "cuda"                  # cuda | mps | xpu
    capability: list[int] | None = None  # [major, minor] (CUDA)
    total_memory: int | None = None     # bytes
    multi_processor_count: int | None = None


@dataclass
class Environment:
    python: str = ""
    platform: str = ""
    hostname: str = ""
    torch: str | None = None
    cuda: str | None = None             # torch.version.cuda (None on CPU builds)
    cudnn: int | None = None
    cuda_available: bool = False
    device_count: int = 0
    devices: list[DeviceInfo] = field(default_factory=list)
    mps_available: bool = False
    cudnn_benchmark: bool | None = None
    cudnn_deterministic: bool | None = None
    float32_matmul_precision: str | None = None   # highest | high | medium
    allow_tf32_matmul: bool | None = None
    allow_tf32_cudnn: bool | None = None
    anomaly_detection: bool | None = None
    cpu_count: int | None = None        # usable CPUs (sched_getaffinity)
    cpu_count_logical: int | None = None
    torch_num_threads: int | None = None
    env: dict[str, str] = field(default_factory=dict)  # allowlisted variables only, never secrets


@dataclass
class StepRecord:
    index: int = 0              # 1-based training step number
    t: float = 0.0              # seconds since the rank's probe started, at the step's end
    total_s: float = 0.0
    data_s: float = 0.0         # waiting in DataLoader.__next__
    forward_s: float = 0.0      # top-level training forwards
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    other_s: float = 0.0        # the rest (loss, logging, hand-made batching, ...)
    n_forward: int = 0
    n_backward: int = 0
    samples: int | None = None  # the step's batch: dim 0 of its first training forward's input, summed
                                # over its micro-batches (every training forward at that call site)
    tokens: int | None = None   # samples x sequence length, for integer (token) inputs
    micro_batches: int | None = None  # forwards summed into samples (gradient accumulation: > 1)
    epoch: int | None = None
    ended_by: str = "optimizer"  # optimizer: ended by optimizer.step(); manual: ended after backward()
    instrumented: bool = False  # a step diag slowed on purpose (FLOP counting): excluded from timing stats
    extra: dict[str, Any] = field(default_factory=dict)  # per-step values from probe extensions

    @property
    def batch(self) -> int | None:
        """The batch of one forward (a micro-batch under gradient accumulation): what activation
        memory scales with."""
        if not self.samples:
            return None
        return max(1, self.samples // self.micro_batches) if self.micro_batches else self.samples


@dataclass
class StepStats:
    """Aggregates over every step (not just the kept ones)."""
    count: int = 0
    timed: int = 0              # steps included in the sums (not instrumented)
    total_s: float = 0.0
    data_s: float = 0.0
    forward_s: float = 0.0
    backward_s: float = 0.0
    optimizer_s: float = 0.0
    other_s: float = 0.0
    samples: int = 0
    tokens: int = 0


@dataclass
class DataLoaderInfo:
    id: int = 0
    num_workers: int = 0
    pin_memory: bool = False
    batch_size: int | None = None
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    drop_last: bool = False
    dataset_type: str = ""
    dataset_len: int | None = None
    iterable_dataset: bool = False
    location: dict | None = None        # where the script iterated it
    epochs: int = 0                     # iterators created
    batches: int = 0
    wait_s: float = 0.0                 # total time in __next__
    first_batch_s: list[float] = field(default_factory=list)  # per epoch (iterator), first __next__
    max_wait_s: float = 0.0


@dataclass
class ForwardSite:
    """Top-level forward calls, grouped by model, call site and mode."""
    key: str = ""
    model: int = 0                      # ModelInfo.id
    module: str = ""                    # class name of the called module
    location: dict | None = None        # the user's line that called the model
    count: int = 0
    training: bool = True
    grad_enabled: bool = True
    inference_mode: bool = False
    autocast: str | None = None         # dtype name when autocast was on, e.g. "bfloat16"
    autocast_device: str | None = None
    output_requires_grad: bool = False
    in_step: bool = False               # a training forward (its output fed the step's backward)
    backpropagated: bool = False        # made in eval mode, yet a backward went through its output
    first_step: int | None = None       # step index when first seen
    input_shapes: list[list[int]] = field(default_factory=list)  # first call's tensor inputs
    input_dtypes: list[str] = field(default_factory=list)


@dataclass
class ModelInfo:
    id: int = 0
    cls: str = ""
    wrappers: list[str] = field(default_factory=list)  # DataParallel, DistributedDataParallel, compiled
    params_total: int = 0
    params_trainable: int = 0
    param_bytes: int = 0
    buffer_bytes: int = 0
    dtypes: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    n_modules: int = 0
    module_types: dict[str, int] = field(default_factory=dict)   # class name -> count
    layer_shapes: list[dict] = field(default_factory=list)       # Linear/Conv/Embedding dims (bounded)
    ddp: dict[str, Any] = field(default_factory=dict)            # find_unused_parameters, gradient_as_bucket_view, ...


@dataclass
class OptimizerInfo:
    id: int = 0
    cls: str = ""
    param_groups: int = 0
    params: int = 0
    lr: float | None = None
    foreach: bool | None = None
    fused: bool | None = None
    steps: int = 0
    zero_grad_calls: int = 0
    zero_grad_set_to_none: bool | None = None   # the last zero_grad() call's argument
    zero_grad_s: float = 0.0                    # total time inside optimizer.zero_grad()
    state_bytes: int | None = None


@dataclass
class ExceptionInfo:
    type: str = ""
    message: str = ""
    traceback: str = ""
    is_oom: bool = False
    step: int | None = None
    t: float | None = None
    location: dict | None = None        # innermost frame in the user's script


@dataclass
class RankEvidence:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    host: str = ""
    pid: int | None = None
    started_at: float | None = None
    status: str = "running"             # as RunInfo.status, for this process
    exit_code: int | None = None
    steps: list[StepRecord] = field(default_factory=list)     # newest MAX_STEPS_KEPT
    step_stats: StepStats = field(default_factory=StepStats)
    dataloaders: list[DataLoaderInfo] = field(default_factory=list)
    models: list[ModelInfo] = field(default_factory=list)
    forwards: list[ForwardSite] = field(default_factory=list)
    optimizers: list[OptimizerInfo] = field(default_factory=list)
    backward_calls: int = 0
    exceptions: list[ExceptionInfo] = field(default_factory=list)
    # Sections filled by probe extensions; each one's shape is documented in docs/evidence.md.
    memory: dict[str, Any] = field(default_factory=dict)      # CUDA allocator stats, breakdown, OOM, estimate
    flops: dict[str, Any] = field(default_factory=dict)       # FlopCounterMode over one real step
    amp: dict[str, Any] = field(default_factory=dict)         # GradScaler use, autocast
    sync: dict[str, Any] = field(default_factory=dict)        # host-device synchronisations
    distributed: dict[str, Any] = field(default_factory=dict)  # backend, collectives, comm hook timing
    extras: dict[str, Any] = field(default_factory=dict)      # anything else a probe extension records

    # ---- convenience for checks -------------------------------------------------------------
    def timed_steps(self, skip_warmup: int = 1) -> list[StepRecord]:
        """Kept steps that are usable for timing: instrumented ones dropped, the first
        ``skip_warmup`` dropped when enough remain."""
        steps = [s for s in self.steps if not s.instrumented]
        if len(steps) > skip_warmup + 2:
            steps = [s for s in steps if s.index > skip_warmup]
        return steps

    def median_step(self, skip_warmup: int = 1) -> dict[str, float] | None:
        """Median of each phase over the timed steps (None without steps)."""
        steps = self.timed_steps(skip_warmup)
        if not steps:
            return None
        out = {}
        for name in ("total_s", "data_s", "forward_s", "backward_s", "optimizer_s", "other_s"):
            out[name] = _median([getattr(s, name) for s in steps])
        out["n"] = len(steps)
        return out

    def model(self, model_id: int) -> ModelInfo | None:
        for m in self.models:
            if m.id == model_id:
                return m
        return None


@dataclass
class Evidence:
    schema_version: int = SCHEMA_VERSION
    diag_version: str = ""
    run: RunInfo = field(default_factory=RunInfo)
    environment: Environment = field(default_factory=Environment)
    ranks: list[RankEvidence] = field(default_factory=list)
    gpu: dict[str, Any] = field(default_factory=dict)          # telemetry (docs/gpus.md#evidencegpu)
    memory_plan: dict[str, Any] = field(default_factory=dict)  # batch-size plan when estimated
    notes: list[str] = field(default_factory=list)

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

    @property
    def multi_rank(self) -> bool:
        return len(self.ranks) > 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, default=_json_default, allow_nan=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Evidence":
        if not isinstance(data, dict):
            raise DiagError("the evidence file does not hold a JSON object")
        version = data.get("schema_version")
        if not isinstance(version, int):
            raise DiagError("the evidence file has no schema_version: it was not written by diag")
        if version > SCHEMA_VERSION:
            raise DiagError(
                f"the evidence file uses schema_version {version}, newer than this diag understands "
                f"({SCHEMA_VERSION}); upgrade diag to read it"
            )
        try:
            return _from_dict(cls, data)
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise DiagError(f"the evidence file is malformed ({e})") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (a reader never sees half a file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = self.to_json()
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


def load_evidence(path: str | os.PathLike) -> Evidence:
    """Load an evidence file; every problem is a :class:`DiagError` with one clear sentence."""
    p = Path(path)
    if not p.exists():
        raise DiagError(f"evidence file {str(p)!r} does not exist")
    if p.is_dir():
        cand = p / "evidence.json"
        if cand.is_file():
            p = cand
        else:
            raise DiagError(f"{str(p)!r} is a directory with no evidence.json in it")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DiagError(f"cannot read evidence file {str(p)!r}: {e}") from None
    if not text.strip():
        raise DiagError(f"evidence file {str(p)!r} is empty")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DiagError(
            f"evidence file {str(p)!r} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); "
            "it may be truncated"
        ) from None
    return Evidence.from_dict(data)


# ---- helpers ---------------------------------------------------------------------------------------

def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    if n == 0:
        return 0.0
    mid = n // 2
    return v[mid] if n % 2 else (v[mid - 1] + v[mid]) / 2


def median(values: list[float]) -> float:
    return _median(list(values))


def _json_default(o: Any) -> Any:
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    return str(o)


_HINTS_CACHE: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    h = _HINTS_CACHE.get(cls)
    if h is None:
        h = typing.get_type_hints(cls)
        _HINTS_CACHE[cls] = h
    return h


def _convert(tp: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        for a in args:
            if dataclasses.is_dataclass(a) and isinstance(value, dict):
                return _from_dict(a, value)
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise TypeError(f"expected an object for {tp.__name__}, got {type(value).__name__}")
        return _from_dict(tp, value)
    if origin is list:
        (arg,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list):
            raise TypeError(f"expected a list, got {type(value).__name__}")
        if dataclasses.is_dataclass(arg):
            return [_from_dict(arg, v) for v in value]
        return list(value)
    return value


def _from_dict(cls: type, data: dict[str, Any]) -> Any:
    hints = _hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name])
    # unknown keys (written by a newer minor version) are ignored on purpose
    return cls(**kwargs)
