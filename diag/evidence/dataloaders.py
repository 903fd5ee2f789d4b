"""``RankEvidence.dataloaders``: every DataLoader the script iterated."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


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
