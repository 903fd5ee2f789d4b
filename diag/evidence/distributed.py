"""``RankEvidence.distributed``: torch.distributed as the probe extension saw it (docs/distributed.md)."""
from __future__ import annotations

from typing import Any

from diag.evidence._schema import Section


class DistributedSection(Section):
    """Backend, DDP, collectives and communication timing of one rank."""
    world_size: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    launcher: dict[str, Any] | None = None  # torchrun's environment: run_id, nnodes, ...
    active: bool | None = None          # a process group was used
    initialized: bool | None = None     # torch.distributed.is_initialized()
    backend: str | None = None          # nccl | gloo | ...
    backend_config: str | None = None   # e.g. "cpu:gloo,cuda:nccl"
    available: dict[str, Any] | None = None  # which backends this torch build has
    distributed: bool | None = None     # torch.distributed is available
    nccl: bool | None = None
    gloo: bool | None = None
    mpi: bool | None = None
    nccl_version: str | None = None
    ddp: dict[str, Any] | None = None   # DDP models (options, devices), forwards with/without no_sync
    comm: dict[str, Any] | None = None  # grad/buffer sync wait [seconds], collectives {name: {calls, s, bytes, exposed_s, async, found_done, in_flight_s, kind}}: every torch.distributed collective (the script's, FSDP's, DeepSpeed's)
    comm_device: list[Any] | None = None  # per sampled step {step, exposed_s, comm_s, kinds}: collectives and their waits on the compute stream (CUDA events), seconds
    fsdp: dict[str, Any] | None = None  # the sharded model: api (fsdp2 | fsdp1), units, unit_list, reshard_after_forward, prefetch, mixed_precision, offload, sharding_strategy (diag/probe/fsdp.py)
    memory: dict[str, Any] | None = None  # this rank's peak memory as the distributed probe read it
    launcher_exit: dict[str, Any] | None = None  # what torchrun said when a rank failed
