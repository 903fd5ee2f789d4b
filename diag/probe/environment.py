"""Introspection of the environment: versions, devices and the torch flags that change speed
(the ``env`` event), with an allowlist of environment variables (nothing else is read)."""
from __future__ import annotations

import os
import socket
from typing import Any


ENV_ALLOWLIST = (
    "CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF",
    "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NCCL_DEBUG", "NCCL_P2P_DISABLE", "NCCL_IB_DISABLE",
    "TORCH_CUDNN_V8_API_ENABLED", "CUBLAS_WORKSPACE_CONFIG", "TORCH_DISTRIBUTED_DEBUG",
    "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_PROCID",
)


def environment() -> dict:
    import platform

    import torch

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": None,
        "cuda_available": False,
        "device_count": 0,
        "devices": [],
        "mps_available": False,
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
        "cudnn_deterministic": bool(torch.backends.cudnn.deterministic),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "allow_tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "allow_tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "anomaly_detection": bool(torch.is_anomaly_enabled()),
        "cpu_count": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_count_logical": os.cpu_count(),
        "torch_num_threads": torch.get_num_threads(),
        "env": {k: os.environ[k] for k in ENV_ALLOWLIST if k in os.environ},
    }
    try:
        env["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:
        pass
    try:
        # is_available() does not initialise CUDA in the parent of forked DataLoader workers
        if torch.cuda.is_available():
            env["cuda_available"] = True
            env["device_count"] = torch.cuda.device_count()
            for i in range(env["device_count"]):
                p = torch.cuda.get_device_properties(i)
                env["devices"].append({
                    "index": i, "name": p.name, "type": "cuda", "capability": [p.major, p.minor],
                    "total_memory": int(p.total_memory),
                    "multi_processor_count": int(getattr(p, "multi_processor_count", 0)) or None,
                })
    except Exception:
        pass
    try:
        env["mps_available"] = bool(torch.backends.mps.is_available())
    except Exception:
        pass
    return env

