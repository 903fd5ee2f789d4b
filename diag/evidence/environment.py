"""``Evidence.environment``: versions, devices and flags of the (rank 0) process."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DeviceInfo:
    index: int = 0                        # device index
    name: str = ""                        # device name as torch reports it
    type: str = "cuda"                  # cuda | mps | xpu
    capability: list[int] | None = None  # compute capability (major, minor), CUDA
    total_memory: int | None = None     # bytes
    multi_processor_count: int | None = None  # streaming multiprocessors


@dataclass
class Environment:
    python: str = ""                      # Python version
    platform: str = ""                    # platform.platform()
    hostname: str = ""                    # host name
    torch: str | None = None              # torch.__version__
    cuda: str | None = None             # torch.version.cuda (None on CPU builds)
    cudnn: int | None = None              # cuDNN version
    cuda_available: bool = False          # torch.cuda.is_available()
    device_count: int = 0                 # CUDA devices visible
    devices: list[DeviceInfo] = field(default_factory=list)  # the accelerators (DeviceInfo)
    mps_available: bool = False           # Apple MPS available
    cudnn_benchmark: bool | None = None   # torch.backends.cudnn.benchmark
    cudnn_deterministic: bool | None = None  # torch.backends.cudnn.deterministic
    float32_matmul_precision: str | None = None   # highest | high | medium
    allow_tf32_matmul: bool | None = None  # torch.backends.cuda.matmul.allow_tf32
    allow_tf32_cudnn: bool | None = None  # torch.backends.cudnn.allow_tf32
    anomaly_detection: bool | None = None  # torch.is_anomaly_enabled()
    cpu_count: int | None = None        # usable CPUs (sched_getaffinity)
    cpu_count_logical: int | None = None  # os.cpu_count()
    torch_num_threads: int | None = None  # torch.get_num_threads()
    env: dict[str, str] = field(default_factory=dict)  # allowlisted variables only, never secrets
