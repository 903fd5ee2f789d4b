"""Helpers for testing checks (plugins and built-ins) without running anything.

    from diag.testing import EvidenceBuilder, run_check

    ev = EvidenceBuilder().cuda_training(device="NVIDIA H100 80GB HBM3").steps(10, total_s=0.2, data_s=0.05,
                                                                            samples=4).build()
    (finding,) = run_check(my_check, ev)
    assert finding.severity == "warning"

Everything here builds the same :class:`diag.evidence.Evidence` that a real run produces.
"""
from __future__ import annotations

from typing import Any

from diag.evidence import (DataLoaderInfo, DeviceInfo, EvalStepRecord, Evidence, ExceptionInfo, ForwardSite,
                           ModelInfo, StepRecord)
from diag.findings import Finding

__all__ = ["EvidenceBuilder", "run_check"]


class EvidenceBuilder:
    """Builds an Evidence step by step; every method returns the builder. ``build()`` returns it.
    Methods act on the current rank (rank 0 unless :meth:`rank` picked another)."""

    def __init__(self, status: str = "completed"):
        self.ev = Evidence()
        self.ev.run.status = status
        self.ev.run.wall_s = 0.0
        self._rank = self.ev.rank(0)

    # ---- run and environment -----------------------------------------------------------------------
    def status(self, status: str, exit_code: int | None = None) -> "EvidenceBuilder":
        self.ev.run.status = status
        self.ev.run.exit_code = exit_code
        return self

    def environment(self, **fields: Any) -> "EvidenceBuilder":
        """Set Environment fields, e.g. ``cpu_count=8, torch="2.4.0"``."""
        for k, v in fields.items():
            if not hasattr(self.ev.environment, k):
                raise AttributeError(f"Environment has no field {k!r}")
            setattr(self.ev.environment, k, v)
        return self

    def rank(self, rank: int, world_size: int | None = None) -> "EvidenceBuilder":
        """Switch to (creating) another rank; ``world_size`` is set on every rank."""
        self._rank = self.ev.rank(rank)
        if world_size is not None:
            for r in self.ev.ranks:
                r.world_size = world_size
        return self

    # ---- what was trained --------------------------------------------------------------------------
    def model(self, cls: str = "Net", device: str = "cpu", params: int = 1_000_000, dtype: str = "float32",
              training: bool = True, autocast: str | None = None, input_shape: list[int] | None = None,
              **fields: Any) -> "EvidenceBuilder":
        """A model and its top-level training forward (``in_step``) on ``device`` ("cuda:0", "cpu")."""
        r = self._rank
        mid = len(r.models) + 1
        r.models.append(ModelInfo(id=mid, cls=cls, params_total=params, params_trainable=params,
                                  param_bytes=params * 4, dtypes=[dtype], devices=[device], **fields))
        r.forwards.append(ForwardSite(
            key=f"{mid}:train.py:10:{'train' if training else 'eval'}", model=mid, module=cls,
            location={"file": "train.py", "line": 10, "function": "main"}, count=max(1, r.step_stats.count),
            training=training, grad_enabled=training, in_step=training, autocast=autocast,
            autocast_device=device.split(":")[0] if autocast else None, output_requires_grad=training,
            input_shapes=[input_shape] if input_shape else [], input_dtypes=[]))
        return self

    def cuda_training(self, device: str = "NVIDIA A100-SXM4-80GB", capability: tuple[int, int] = (8, 0),
                      total_memory: int = 80 << 30, **model: Any) -> "EvidenceBuilder":
        """A CUDA device in the environment and a model trained on it."""
        return self.model(device=self._cuda_device(device, capability, total_memory), **model)

    def _cuda_device(self, name: str, capability: tuple[int, int], total_memory: int) -> str:
        """Add a CUDA device to the environment; its torch name (``cuda:<index>``)."""
        env = self.ev.environment
        env.cuda, env.cuda_available = env.cuda or "12.4", True
        env.devices.append(DeviceInfo(index=len(env.devices), name=name, type="cuda",
                                      capability=list(capability), total_memory=total_memory))
        env.device_count = len(env.devices)
        return f"cuda:{len(env.devices) - 1}"

    def steps(self, n: int, total_s: float = 0.1, data_s: float = 0.0, forward_s: float | None = None,
              backward_s: float | None = None, optimizer_s: float = 0.0, samples: int | None = None,
              tokens: int | None = None) -> "EvidenceBuilder":
        """``n`` training steps of equal timing (seconds); forward/backward split the rest by default."""
        r = self._rank
        rest = max(0.0, total_s - data_s - optimizer_s)
        fwd = rest / 3 if forward_s is None else forward_s
        bwd = rest - fwd if backward_s is None else backward_s
        other = max(0.0, total_s - data_s - fwd - bwd - optimizer_s)
        start = len(r.steps)
        for i in range(n):
            s = StepRecord(index=start + i + 1, t=(start + i + 1) * total_s, total_s=total_s, data_s=data_s,
                           forward_s=fwd, backward_s=bwd, optimizer_s=optimizer_s, other_s=other,
                           n_forward=1, n_backward=1, samples=samples, tokens=tokens, micro_batches=1)
            r.steps.append(s)
            st = r.step_stats
            st.count += 1
            st.timed += 1
            st.total_s += total_s
            st.data_s += data_s
            st.forward_s += fwd
            st.backward_s += bwd
            st.optimizer_s += optimizer_s
            st.other_s += other
            st.samples += samples or 0
            st.tokens += tokens or 0
            r.backward_calls += 1
        for site in r.forwards:
            if site.in_step:
                site.count = r.step_stats.count
        self.ev.run.wall_s = (self.ev.run.wall_s or 0.0) + n * total_s
        return self

    def eval_model(self, cls: str = "Net", device: str = "cpu", params: int = 1_000_000, dtype: str = "float32",
                   training: bool = False, grad_enabled: bool = False, inference_mode: bool = True,
                   autocast: str | None = None, input_shape: list[int] | None = None, line: int = 20,
                   module_types: dict | None = None, **fields: Any) -> "EvidenceBuilder":
        """A model and its top-level evaluation forward (not ``in_step``) on ``device``; the site's key
        is ``s<model id>e`` (what :meth:`eval_steps` names by default)."""
        r = self._rank
        mid = len(r.models) + 1
        r.models.append(ModelInfo(id=mid, cls=cls, params_total=params, params_trainable=params,
                                  param_bytes=params * 4, dtypes=[dtype], devices=[device],
                                  module_types=dict(module_types or {}), **fields))
        r.forwards.append(ForwardSite(
            key=f"s{mid}e", model=mid, module=cls,
            location={"file": "evaluate.py", "line": line, "function": "evaluate"}, count=0,
            training=training, grad_enabled=grad_enabled, inference_mode=inference_mode, in_step=False,
            autocast=autocast, autocast_device=device.split(":")[0] if autocast else None,
            output_requires_grad=grad_enabled, input_shapes=[input_shape] if input_shape else [], input_dtypes=[]))
        return self

    def cuda_eval(self, device: str = "NVIDIA A100-SXM4-80GB", capability: tuple[int, int] = (8, 0),
                  total_memory: int = 80 << 30, **model: Any) -> "EvidenceBuilder":
        """A CUDA device in the environment and a model evaluated on it."""
        return self.eval_model(device=self._cuda_device(device, capability, total_memory), **model)

    def eval_steps(self, n: int, total_s: float = 0.01, data_s: float = 0.0, forward_s: float | None = None,
                   h2d_s: float = 0.0, samples: int | None = None, tokens: int | None = None,
                   site: str | None = None, host_syncs: int = 0, pass_index: int = 1) -> "EvidenceBuilder":
        """``n`` evaluation steps of equal timing (seconds), as the probe folds them: the forward takes
        the rest after data and h2d by default. ``site``: the forward site (the last evaluation model's)."""
        r = self._rank
        if site is None:
            evals = [f for f in r.forwards if not f.in_step]
            site = evals[-1].key if evals else None
        fwd = max(0.0, total_s - data_s - h2d_s) if forward_s is None else forward_s
        other = total_s - data_s - h2d_s - fwd
        start = len(r.eval_steps)
        st = r.eval_stats
        for i in range(n):
            r.eval_steps.append(EvalStepRecord(index=start + i + 1, pass_index=pass_index,
                                               t=(start + i + 1) * total_s, total_s=total_s, data_s=data_s,
                                               h2d_s=h2d_s, forward_s=fwd, other_s=other, forwards=1,
                                               samples=samples, tokens=tokens, site=site, host_syncs=host_syncs))
            st.count += 1
            st.timed += 1
            st.total_s += total_s
            st.data_s += data_s
            st.h2d_s += h2d_s
            st.forward_s += fwd
            st.other_s += other
            st.forwards += 1
            st.samples += samples or 0
            st.tokens += tokens or 0
            st.host_syncs += host_syncs
            st.steps_with_syncs += 1 if host_syncs else 0
        for f in r.forwards:
            if f.key == site:
                f.count += n
        self.ev.run.wall_s = (self.ev.run.wall_s or 0.0) + n * total_s
        return self

    def dataloader(self, num_workers: int = 0, batch_size: int | None = 32, pin_memory: bool = False,
                   **fields: Any) -> "EvidenceBuilder":
        r = self._rank
        r.dataloaders.append(DataLoaderInfo(id=len(r.dataloaders) + 1, num_workers=num_workers,
                                            batch_size=batch_size, pin_memory=pin_memory, **fields))
        return self

    def exception(self, type: str = "RuntimeError", message: str = "boom", is_oom: bool = False,
                  step: int | None = None) -> "EvidenceBuilder":
        self._rank.exceptions.append(ExceptionInfo(type=type, message=message, is_oom=is_oom, step=step))
        self.ev.run.status = "oom" if is_oom else "failed"
        return self

    def section(self, name: str, **values: Any) -> "EvidenceBuilder":
        """Set keys of a rank section recorded by a probe extension (memory, flops, amp, sync,
        distributed, extras), as the probe would."""
        target = getattr(self._rank, name)
        target.update(values)
        return self

    def build(self) -> Evidence:
        return self.ev


def run_check(check: Any, evidence: Evidence) -> list[Finding]:
    """Run one check (the object ``@check`` made) on an Evidence the way the registry does:
    preconditions, ids/titles filled in, crashes turned into ``crashed`` findings."""
    from diag.registry import run_one

    spec = getattr(check, "__diag_check__", check)
    return run_one(spec, evidence, timeout=None)
