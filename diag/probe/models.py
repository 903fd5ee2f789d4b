"""Introspection of models: wrappers (DDP, DataParallel, FSDP, torch.compile), the description a
``model`` event carries, and small facts the hooks need (has it parameters, on which device)."""
from __future__ import annotations

from typing import Any


def has_parameters(module) -> bool:
    try:
        return next(module.parameters(), None) is not None
    except Exception:
        return True


def wrappers_of(module) -> tuple[str, list[str], Any]:
    """(innermost class name, wrapper names, innermost module)."""
    wrappers = []
    inner = module
    for _ in range(4):
        name = type(inner).__name__
        if name in ("DataParallel", "DistributedDataParallel", "FullyShardedDataParallel") and hasattr(inner, "module"):
            wrappers.append(name)
            inner = inner.module
        elif name == "OptimizedModule" and hasattr(inner, "_orig_mod"):
            wrappers.append("compiled")
            inner = inner._orig_mod
        else:
            break
    return type(inner).__name__, wrappers, inner


def find_ddp(module):
    """The DistributedDataParallel module inside ``module`` (itself, or under torch.compile or
    DataParallel); None when there is none."""
    m = module
    for _ in range(4):
        name = type(m).__name__
        if name == "DistributedDataParallel":
            return m
        if name == "OptimizedModule" and hasattr(m, "_orig_mod"):
            m = m._orig_mod
        elif name == "DataParallel" and hasattr(m, "module"):
            m = m.module
        else:
            return None
    return None


MAX_LAYER_SHAPES = 200


def describe_model(module, model_id: int) -> dict:
    import torch

    cls, wrappers, inner = wrappers_of(module)
    total = trainable = pbytes = 0
    dtypes: dict[str, None] = {}
    devices: dict[str, None] = {}
    for p in module.parameters():
        n = p.numel()
        total += n
        if p.requires_grad:
            trainable += n
        pbytes += n * p.element_size()
        dtypes[str(p.dtype).replace("torch.", "")] = None
        devices[str(p.device)] = None
    bbytes = 0
    for b in module.buffers():
        bbytes += b.numel() * b.element_size()
        devices.setdefault(str(b.device), None)
    module_types: dict[str, int] = {}
    layer_shapes: list[dict] = []
    n_modules = 0
    for m in inner.modules():
        n_modules += 1
        name = type(m).__name__
        module_types[name] = module_types.get(name, 0) + 1
        if len(layer_shapes) < MAX_LAYER_SHAPES:
            if isinstance(m, torch.nn.Linear):
                layer_shapes.append({"type": "Linear", "in": m.in_features, "out": m.out_features})
            elif isinstance(m, torch.nn.Embedding):
                layer_shapes.append({"type": "Embedding", "in": m.num_embeddings, "out": m.embedding_dim})
            elif isinstance(m, torch.nn.modules.conv._ConvNd):
                layer_shapes.append({"type": name, "in": m.in_channels, "out": m.out_channels})
    ddp: dict[str, Any] = {}
    if "DistributedDataParallel" in wrappers:
        ddp_mod = module
        while type(ddp_mod).__name__ != "DistributedDataParallel":
            ddp_mod = ddp_mod.module
        ddp = {
            "find_unused_parameters": bool(getattr(ddp_mod, "find_unused_parameters", False)),
            "gradient_as_bucket_view": bool(getattr(ddp_mod, "gradient_as_bucket_view", False)),
            "static_graph": bool(getattr(ddp_mod, "static_graph", False)),
            "broadcast_buffers": bool(getattr(ddp_mod, "broadcast_buffers", True)),
            "device_ids": [str(d) for d in (getattr(ddp_mod, "device_ids", None) or [])],
        }
    return {
        "id": model_id, "cls": cls, "wrappers": wrappers, "params_total": total,
        "params_trainable": trainable, "param_bytes": pbytes, "buffer_bytes": bbytes,
        "dtypes": list(dtypes), "devices": list(devices) or ["cpu"], "n_modules": n_modules,
        "module_types": module_types, "layer_shapes": layer_shapes, "ddp": ddp,
    }


def device_type(module) -> str:
    try:
        for p in module.parameters():
            return p.device.type
    except Exception:
        pass
    return "cpu"

