"""``Evidence.gpu``: GPU telemetry sampled by diag's own process (NVML), shape in docs/gpus.md."""
from __future__ import annotations

from typing import Any

from diag.evidence._schema import Section


class GpuTelemetry(Section):
    """What the sampler recorded during the run."""
    provider: str | None = None         # nvml | simulated | none
    simulated: bool | None = None
    scenario: str | None = None         # the simulation's name
    reason: str | None = None           # why there are no devices
    interval_s: float | None = None     # sampling interval
    burst_interval_s: float | None = None  # the faster interval of the run's first burst_s seconds (null: none)
    burst_s: float | None = None        # how long the run was sampled at burst_interval_s, from the first sample
    t0: float | None = None             # unix time of the first sample (series "t" are seconds after it) [unix time (s)]
    samples: int | None = None          # rounds taken
    sample_ms_mean: float | None = None  # mean cost of a round
    sampler_errors: int | None = None
    last_error: str | None = None
    pending: bool | None = None         # true until the first sample
    driver: dict[str, Any] | None = None  # driver_version, cuda_driver_version, nvml_version
    notes: list[str] | None = None      # provider notes
    throttle_bits: dict[str, Any] | None = None  # {reason name: bit} for the "throttle" series
    devices: list[dict[str, Any]] | None = None  # static fields, visible, used_by_run, lost, stats, series
    processes: dict[str, Any] | None = None  # the run's process tree: pids, RSS, CPU, GPU processes, series
    host: dict[str, Any] | None = None  # host CPU count, memory [bytes] and series
