"""Dask tasks in waves: a bounded number in flight, results in task order.

A stage of a reshard can have millions of tasks. Submitting them all at once puts a
future per task in the driver and a task per task in the scheduler, with their
arguments. Here at most `limit` tasks are in flight; each result that comes back frees a
slot for the next, whose arguments are made only then. The driver holds the results (one
small descriptor per task) and the scheduler O(limit) tasks. A task that fails raises
here; the ones still in flight are released.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

from distributed import Client, as_completed
from tqdm import tqdm

Progress = Callable[[str, int, int], None]


class StageProgress:
    """Counts a stage's finished tasks: a terminal bar, and `progress(stage, done, total)`
    for an orchestrator."""

    def __init__(self, stage: str, total: int, progress: Progress | None) -> None:
        self.stage, self.total, self.done, self._progress = stage, total, 0, progress
        self._bar = tqdm(total=total, desc=stage, unit="task", disable=not sys.stderr.isatty())

    def advance(self) -> None:
        self.done += 1
        self._bar.update(1)
        if self._progress is not None:
            self._progress(self.stage, self.done, self.total)

    def close(self) -> None:
        self._bar.close()


def run_in_waves(client: Client, function: Callable[..., Any], arguments: Iterable[tuple],
                 total: int, limit: int, counter: StageProgress | None = None,
                 **shared: Any) -> list[Any]:
    """`function(*args, **shared)` for each of the `total` argument tuples, at most `limit`
    in flight; the results in the order of `arguments`."""
    results: list[Any] = [None] * total
    feed = enumerate(arguments)
    slots: dict[Any, int] = {}
    pending = as_completed()

    def submit_next() -> None:
        item = next(feed, None)
        if item is not None:
            future = client.submit(function, *item[1], pure=False, **shared)
            slots[future.key] = item[0]
            pending.add(future)

    for _ in range(max(1, limit)):
        submit_next()
    for future in pending:
        results[slots.pop(future.key)] = future.result()
        future.release()
        submit_next()
        if counter is not None:
            counter.advance()
    return results
