"""How fast the loader feeds training, and how long training waited for it.

`DataWaitMeter` wraps a batch iterator in the consuming process and adds up
the samples handed out, the wall time since the iteration began, and the part
of it spent inside `next()` waiting for a batch (what the training step
waited for data: the first batch's start-up included). `StreamLoader.metrics()`
returns its figures; `DataWaitCallback` (training/callbacks.py) logs them per
train epoch. This module, like the loader, imports no Lightning: a process that
only reads (a spawned DataLoader worker, a benchmark's reader) does not pay its import.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

COUNTERS = ("samples", "batches", "wall_s", "data_wait_s")
Batch = dict[str, torch.Tensor]


class DataWaitMeter:
    """Samples received and time waited by the consumer of a batch iterator."""

    def __init__(self) -> None:
        self.samples, self.batches = 0, 0
        self.wall_s, self.data_wait_s = 0.0, 0.0

    def timed(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """Yield `batches`, timing every wait for the next one."""
        started, wall_before = time.perf_counter(), self.wall_s
        while True:
            asked = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            now = time.perf_counter()
            self.data_wait_s += now - asked
            self.wall_s = wall_before + now - started
            self.batches += 1
            self.samples += len(batch["id"])
            yield batch

    def metrics(self) -> dict[str, float]:
        """Totals since construction, with the rates they imply."""
        totals = {name: float(getattr(self, name)) for name in COUNTERS}
        return totals | rates(totals)


def rates(totals: dict[str, float]) -> dict[str, float]:
    """samples_per_s and data_wait_fraction (of wall time) from the counters."""
    wall = totals["wall_s"]
    return {
        "samples_per_s": totals["samples"] / wall if wall > 0 else 0.0,
        "data_wait_fraction": totals["data_wait_s"] / wall if wall > 0 else 0.0,
    }


def interval(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The counters and rates of the time between two `metrics()` readings."""
    totals = {name: after[name] - before[name] for name in COUNTERS}
    return totals | rates(totals)


def loader_metrics(trainer: Any) -> dict[str, float] | None:
    """`metrics()` of the train loader, or None when it has none (not a StreamLoader)."""
    metrics = getattr(trainer.train_dataloader, "metrics", None)
    return metrics() if callable(metrics) else None
