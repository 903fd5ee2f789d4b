"""What the distributed probe extension can read of a sharded model's configuration (FSDP2's
``fully_shard``, FSDP1's ``FullyShardedDataParallel``), once per model, from the objects the
framework built. Nothing here changes the model: attributes are read, nothing is called that
communicates or allocates.

FSDP2 (``torch.distributed.fsdp.fully_shard``): each ``fully_shard(module)`` call makes ``module`` an
``FSDPModule`` (``units`` counts them) with one parameter group (none when its submodules' own calls
took every parameter: ``param_groups``), the unit FSDP all-gathers before that module's forward and
reduce-scatters after its backward. Recorded per parameter group: its name in the model, parameter count
and bytes, ``reshard_after_forward`` as it is in effect (FSDP2 turns it off for the root after its
first forward), explicit forward/backward prefetch targets (``set_modules_to_forward_prefetch``),
the mixed-precision policy (``MixedPrecisionPolicy``) and the offload policy
(``CPUOffloadPolicy``).

FSDP1 (``FullyShardedDataParallel``): each FSDP instance (the wrapper and the ones its
``auto_wrap_policy`` nested) is a unit owning one flat parameter. Recorded: ``sharding_strategy``,
``backward_prefetch``, ``forward_prefetch``, ``limit_all_gathers``, ``cpu_offload``,
``mixed_precision``, ``use_orig_params`` and the units' flat-parameter sizes.

DeepSpeed (``deepspeed.initialize``'s engine): the ZeRO stage, ``overlap_comm``, the bucket sizes
(``reduce_bucket_size``, ``allgather_bucket_size``, ``stage3_prefetch_bucket_size``), offload
devices, bf16/fp16, through the engine's own ``zero_*()`` accessors.
"""
from __future__ import annotations

import sys

MAX_UNITS = 64        # units listed one by one (the counts cover them all)


def _numel_bytes(params) -> tuple[int, int, str | None]:
    n = b = 0
    dtype = None
    for p in params:
        try:
            k = int(p.numel())
            n += k
            b += k * int(p.element_size())
            if dtype is None:
                dtype = str(p.dtype).replace("torch.", "")
        except Exception:
            continue
    return n, b, dtype


def _policy(obj) -> dict | None:
    """A policy dataclass as plain fields (dtypes as names); None for None."""
    if obj is None:
        return None
    out = {"cls": type(obj).__name__}
    fields = getattr(obj, "__dataclass_fields__", None) or {}
    for name in list(fields)[:12]:
        v = getattr(obj, name, None)
        if v is None or isinstance(v, (bool, int, float, str)):
            out[name] = v
        else:
            out[name] = str(v).replace("torch.", "")
    return out


def fsdp2_classes():
    """``FSDPModule`` when the script imported FSDP2 (never imported here)."""
    mod = sys.modules.get("torch.distributed.fsdp._fully_shard._fully_shard")
    return getattr(mod, "FSDPModule", None) if mod is not None else None


def fsdp1_class():
    mod = sys.modules.get("torch.distributed.fsdp.fully_sharded_data_parallel")
    return getattr(mod, "FullyShardedDataParallel", None) if mod is not None else None


def _is_deepspeed(module) -> bool:
    return any(c.__name__ == "DeepSpeedEngine" for c in type(module).__mro__)


def _call(obj, name):
    fn = getattr(obj, name, None)
    try:
        return fn() if callable(fn) else None
    except Exception:
        return None


def _describe_deepspeed(engine) -> dict:
    """A DeepSpeed engine's ZeRO configuration, through its own accessors."""
    numel = nbytes = 0
    dtypes = set()
    try:
        for p in engine.module.parameters():
            k = int(getattr(p, "ds_numel", None) or p.numel())   # ZeRO-3 partitions: ds_numel is the full size
            numel += k
            nbytes += k * int(p.element_size())
            dtypes.add(str(p.dtype).replace("torch.", ""))
    except Exception:
        pass
    dev = getattr(engine, "device", None)

    def _offload(cfg):
        d = getattr(cfg, "device", None) if cfg is not None else None
        d = getattr(d, "value", d)
        return None if d in (None, "none") else str(d)

    off_param, off_opt = _offload(_call(engine, "zero_offload_param")), _offload(_call(engine, "zero_offload_optimizer"))
    bf16, fp16 = bool(_call(engine, "bfloat16_enabled")), bool(_call(engine, "fp16_enabled"))
    return {
        "api": "deepspeed", "units": None, "unit_list": [], "params": numel, "param_bytes": nbytes,
        "param_dtypes": sorted(dtypes), "devices": [str(dev).split(":")[0]] if dev is not None else [],
        "shard_world": _call(engine, "world_size") if callable(getattr(engine, "world_size", None)) else getattr(engine, "world_size", None),
        "zero_stage": _call(engine, "zero_optimization_stage"),
        "overlap_comm": _call(engine, "zero_overlap_comm"),
        "reduce_bucket_size": _call(engine, "zero_reduce_bucket_size"),
        "allgather_bucket_size": _call(engine, "zero_allgather_bucket_size"),
        "stage3_prefetch_bucket_size": _call(engine, "zero_prefetch_bucket_size"),
        "contiguous_gradients": _call(engine, "zero_contiguous_gradients"),
        "mixed_precision": {"cls": "deepspeed", "bf16": bf16, "fp16": fp16} if bf16 or fp16 else None,
        "offload": {"cls": "deepspeed", "offload_param": off_param, "offload_optimizer": off_opt}
        if off_param or off_opt else None,
    }


def describe(module) -> dict | None:
    """The sharding configuration of ``module`` (FSDP2 units or FSDP1 instances inside it, or a
    DeepSpeed engine), or None when it is not sharded."""
    if _is_deepspeed(module):
        try:
            return _describe_deepspeed(module)
        except Exception:
            return None
    fsdp2 = fsdp2_classes()
    fsdp1 = fsdp1_class()
    if fsdp2 is None and fsdp1 is None:
        return None
    try:
        named = list(module.named_modules())
    except Exception:
        return None
    if fsdp2 is not None:
        units = [(n, m) for n, m in named if isinstance(m, fsdp2)]
        if units:
            return _describe_fsdp2(units)
    if fsdp1 is not None:
        units = [(n, m) for n, m in named if isinstance(m, fsdp1)]
        if units:
            return _describe_fsdp1(units)
    return None


def _clean(name: str) -> str:
    """A module name without FSDP1's and torch.compile's wrapper segments."""
    parts = [p for p in name.split(".") if p not in ("_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module", "module")]
    return ".".join(parts) or "(root)"


def _describe_fsdp2(units: list) -> dict:
    out_units = []
    mp = offload = None
    seen_groups = set()
    mesh = None
    dtypes = set()
    devices = set()
    total_params = total_bytes = 0
    for name, m in units:
        try:
            state = m._get_fsdp_state()
        except Exception:
            continue
        groups = list(getattr(state, "_fsdp_param_groups", None) or [])
        if not groups and getattr(state, "_fsdp_param_group", None) is not None:
            groups = [state._fsdp_param_group]
        for pg in groups:
            if id(pg) in seen_groups:
                continue
            seen_groups.add(id(pg))
            params = [getattr(fp, "sharded_param", None) for fp in getattr(pg, "fsdp_params", [])]
            # the unsharded sizes: what each all-gather brings in
            numel = 0
            nbytes = 0
            dtype = None
            for fp in getattr(pg, "fsdp_params", []):
                try:
                    size = fp._orig_size
                    k = 1
                    for d in size:
                        k *= int(d)
                    sp = fp.sharded_param
                    numel += k
                    nbytes += k * int(sp.element_size())
                    dtype = dtype or str(sp.dtype).replace("torch.", "")
                    devices.add(str(getattr(sp, "device", "")).split(":")[0])
                except Exception:
                    n, b, dt = _numel_bytes([p for p in params if p is not None])
                    numel, nbytes, dtype = numel + n, nbytes + b, dtype or dt
                    break
            if dtype:
                dtypes.add(dtype)
            total_params += numel
            total_bytes += nbytes
            pmp = _policy(getattr(pg, "mp_policy", None))
            if pmp is not None and any(pmp.get(k) for k in ("param_dtype", "reduce_dtype")):
                mp = mp or pmp
            pol = getattr(pg, "offload_policy", None)
            if pol is not None and type(pol).__name__ != "OffloadPolicy":
                offload = offload or _policy(pol)
            mi = getattr(pg, "mesh_info", None)
            if mesh is None and mi is not None:
                mesh = getattr(mi, "shard_mesh_size", None)
            if len(out_units) < MAX_UNITS:
                out_units.append({
                    "module": _clean(name) if name else "(root)",
                    "params": len(getattr(pg, "fsdp_params", []) or []),
                    "numel": numel, "bytes": nbytes,
                    "reshard_after_forward": bool(getattr(pg, "post_forward_mesh_info", None) is not None),
                    "forward_prefetch": len(getattr(state, "_states_to_forward_prefetch", None) or []),
                    "backward_prefetch": len(getattr(state, "_states_to_backward_prefetch", None) or []),
                    "root": not name,
                })
    with_params = [u for u in out_units if u["numel"]]
    last = next((u for u in reversed(with_params) if not u["root"]), None)
    return {
        "api": "fsdp2", "units": len(units), "param_groups": len(seen_groups),
        "unit_list": out_units, "params": total_params, "param_bytes": total_bytes,
        "param_dtypes": sorted(dtypes), "devices": sorted(d for d in devices if d),
        "shard_world": mesh,
        "reshard_after_forward_units": sum(1 for u in out_units if u["reshard_after_forward"]),
        "explicit_forward_prefetch": sum(1 for u in out_units if u["forward_prefetch"]),
        "explicit_backward_prefetch": sum(1 for u in out_units if u["backward_prefetch"]),
        "last_unit": last["module"] if last else None,
        "last_unit_reshards": bool(last and last["reshard_after_forward"]),
        "mixed_precision": mp, "offload": offload,
    }


def _enum(v) -> str | None:
    if v is None:
        return None
    return getattr(v, "name", None) or str(v)


def _describe_fsdp1(units: list) -> dict:
    name0, top = units[0]
    out_units = []
    dtypes = set()
    devices = set()
    total = total_bytes = 0
    for name, m in units:
        handle = getattr(m, "_handle", None)
        fp = getattr(handle, "flat_param", None) if handle is not None else None
        numel = nbytes = 0
        if fp is not None:
            try:
                numel = int(getattr(fp, "_unpadded_unsharded_size", fp.size()).numel())
                nbytes = numel * int(fp.element_size())
                dtypes.add(str(fp.dtype).replace("torch.", ""))
                devices.add(str(fp.device).split(":")[0])
            except Exception:
                pass
        total += numel
        total_bytes += nbytes
        if len(out_units) < MAX_UNITS:
            out_units.append({"module": _clean(name) if name else "(root)", "numel": numel, "bytes": nbytes,
                              "root": not name})
    cpu_offload = getattr(top, "cpu_offload", None)
    mp = getattr(top, "mixed_precision", None)
    mp_d = _policy(mp)
    if mp_d is not None and not any(mp_d.get(k) for k in ("param_dtype", "reduce_dtype", "buffer_dtype")):
        mp_d = None
    return {
        "api": "fsdp1", "units": len(units), "unit_list": out_units, "params": total, "param_bytes": total_bytes,
        "param_dtypes": sorted(dtypes), "devices": sorted(d for d in devices if d),
        "shard_world": getattr(top, "world_size", None),
        "sharding_strategy": _enum(getattr(top, "sharding_strategy", None)),
        "backward_prefetch": _enum(getattr(top, "backward_prefetch", None)),
        "forward_prefetch": bool(getattr(top, "forward_prefetch", False)),
        "limit_all_gathers": bool(getattr(top, "limit_all_gathers", False)),
        "cpu_offload": bool(getattr(cpu_offload, "offload_params", False)),
        "use_orig_params": bool(getattr(top, "_use_orig_params", False)),
        "mixed_precision": mp_d,
        "offload": {"cls": "CPUOffload", "offload_params": True} if getattr(cpu_offload, "offload_params", False) else None,
    }
