"""``Evidence.environment``: versions, devices and flags of the (rank 0) process."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
