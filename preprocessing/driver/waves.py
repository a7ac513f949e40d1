"""Dask tasks in waves: a bounded number in flight, results in task order.

A stage of a reshard can have millions of tasks. Submitting them all at once puts a
future per task in the driver and a task per task in the scheduler, with their
arguments. Here at most `limit` tasks are in flight; each result that comes back frees a
slot for the next, whose arguments are made only then. The driver holds the results (one
small descriptor per task) and the scheduler O(limit) tasks. A task that fails raises
here; the ones still in flight are released.

What every task of a stage shares (plans, layout, schema) goes to the cluster once, by
`share`: as the result of a task, not as scattered data. The scheduler can recompute a
task's result when every worker holding it has died; scattered data it can only forget,
cancelling every task that needs it. A broadcast scatter does not help: the active memory
manager drops replicas no waiting task needs, so the value soon lives on one worker
(a killed worker then failed 3 of 5 soak runs with FutureCancelledError).
"""

from __future__ import annotations

import sys
import uuid
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from distributed import Client, Future, as_completed
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


def share(client: Client, value: Any) -> Future:
    """`value` on the cluster for tasks to take as an argument, recomputed (from the copy
    the scheduler keeps in the task) if every worker holding it dies. Its key starts with
    the value's type name."""
    key = f"{type(value).__name__}-shared-{uuid.uuid4().hex}"
    with warnings.catch_warnings():
        # Dask warns of a task over 10 MB, meant for data repeated in a graph: this value is
        # sent once per stage, which is the point (a big exchange layout can pass 10 MB).
        warnings.filterwarnings("ignore", "Sending large graph", UserWarning)
        return client.submit(_value, value, key=key)


def _value(value: Any) -> Any:
    return value


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
