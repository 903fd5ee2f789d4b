"""``RankEvidence.models``, ``forwards`` and ``optimizers``: what was trained and how it was called."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ModelInfo:
    id: int = 0                           # identity within the rank
    cls: str = ""                         # innermost class, wrappers removed
    wrappers: list[str] = field(default_factory=list)  # DataParallel, DistributedDataParallel, compiled
    params_total: int = 0                 # parameters (elements)
    params_trainable: int = 0             # parameters with requires_grad
    param_bytes: int = 0
    buffer_bytes: int = 0
    dtypes: list[str] = field(default_factory=list)  # parameter dtypes
    devices: list[str] = field(default_factory=list)  # parameter devices (cuda:0, cpu, ...)
    n_modules: int = 0                    # submodules
    module_types: dict[str, int] = field(default_factory=dict)   # class name -> count
    layer_shapes: list[dict] = field(default_factory=list)       # Linear/Conv/Embedding dims (bounded)
    ddp: dict[str, Any] = field(default_factory=dict)            # find_unused_parameters, gradient_as_bucket_view, ...


@dataclass
class ForwardSite:
    """Top-level forward calls, grouped by model, call site and mode."""
    key: str = ""                         # model:file:line:mode
    model: int = 0                      # ModelInfo.id
    module: str = ""                    # class name of the called module
    location: dict | None = None        # the user's line that called the model
    count: int = 0                        # calls
    training: bool = True                 # the module's training flag
    grad_enabled: bool = True             # torch.is_grad_enabled() at the call
    inference_mode: bool = False          # inside torch.inference_mode()
    autocast: str | None = None         # dtype name when autocast was on, e.g. "bfloat16"
    autocast_device: str | None = None    # the autocast device type
    output_requires_grad: bool = False    # the output requires grad
    in_step: bool = False               # a training forward (its output fed the step's backward)
    backpropagated: bool = False        # made in eval mode, yet a backward went through its output
    first_step: int | None = None       # step index when first seen
    input_shapes: list[list[int]] = field(default_factory=list)  # first call's tensor inputs
    input_dtypes: list[str] = field(default_factory=list)


@dataclass
class OptimizerInfo:
    id: int = 0                           # identity within the rank
    cls: str = ""                         # optimizer class name
    param_groups: int = 0                 # parameter groups
    params: int = 0                       # parameter tensors
    lr: float | None = None               # learning rate of the first group
    foreach: bool | None = None           # as configured; null = torch's default
    fused: bool | None = None             # as configured; null = torch's default
    steps: int = 0                        # optimizer.step() calls
    zero_grad_calls: int = 0              # optimizer.zero_grad() calls
    zero_grad_set_to_none: bool | None = None   # the last zero_grad() call's argument
    zero_grad_s: float = 0.0                    # total time inside optimizer.zero_grad()
    state_bytes: int | None = None        # optimizer state
