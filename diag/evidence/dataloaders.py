"""``RankEvidence.dataloaders``: every DataLoader the script iterated."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DataLoaderInfo:
    id: int = 0                           # identity within the rank
    num_workers: int = 0                  # DataLoader(num_workers=)
    pin_memory: bool = False              # DataLoader(pin_memory=)
    batch_size: int | None = None         # DataLoader(batch_size=)
    persistent_workers: bool = False      # DataLoader(persistent_workers=)
    prefetch_factor: int | None = None    # DataLoader(prefetch_factor=)
    drop_last: bool = False               # DataLoader(drop_last=)
    dataset_type: str = ""                # the dataset's class name
    dataset_len: int | None = None        # len(dataset) when it has one
    iterable_dataset: bool = False        # an IterableDataset
    location: dict | None = None        # where the script iterated it
    epochs: int = 0                     # iterators created
    batches: int = 0                      # batches fetched
    wait_s: float = 0.0                 # total time in __next__
    first_batch_s: list[float] = field(default_factory=list)  # per epoch (iterator), first __next__
    max_wait_s: float = 0.0               # the longest wait for one batch
    role: str | None = None               # train: its batches fed training steps; eval: only evaluation forwards
