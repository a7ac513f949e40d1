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

import contextlib
import logging
import statistics
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable
from typing import Any

from distributed import Client, Future, as_completed
from tqdm import tqdm

Progress = Callable[[str, int, int], None]
log = logging.getLogger(__name__)


class StageProgress:
    """Counts a stage's finished tasks: a terminal bar, and `progress(stage, done, total)`
    for an orchestrator; and how long they took, for the stall deadline (`deadline_s`).

    A stage is one call of `run_in_waves` with this counter: scan, exchange and write on
    the staged route, the one pass on a single-pass route."""

    def __init__(
        self,
        stage: str,
        total: int,
        progress: Progress | None,
        deadline_s: float | None = None,
        deadline_factor: float = 0.0,
    ) -> None:
        self.stage, self.total, self.done, self._progress = stage, total, 0, progress
        self.floor_s, self.factor = deadline_s, deadline_factor  # see StallWatch
        self.task_seconds: list[float] = []
        self._bar = tqdm(total=total, desc=stage, unit="task", disable=not sys.stderr.isatty())

    def advance(self, seconds: float | None = None) -> None:
        """One more task done, in `seconds` from its submission (None: not timed)."""
        self.done += 1
        if seconds is not None:
            self.task_seconds.append(seconds)
        self._bar.update(1)
        if self._progress is not None:
            self._progress(self.stage, self.done, self.total)

    @property
    def deadline_s(self) -> float | None:
        """The stall deadline now: see `stall_deadline_s` (None: no watch)."""
        if self.floor_s is None:
            return None
        return stall_deadline_s(self.floor_s, self.factor, self.task_seconds)

    def close(self) -> None:
        self._bar.close()


def stall_deadline_s(floor_s: float, factor: float, task_seconds: list[float]) -> float:
    """How long a worker may go unheard while a stage runs: `floor_s`, or `factor` x the
    median time of the stage's tasks so far when that is longer (a task that keeps its
    worker from heartbeating, holding the GIL in C code, may last about as long as its
    peers). A task's time counts from its submission to its result: an upper bound of
    its run, so the deadline errs long, never short."""
    if not task_seconds:
        return floor_s
    return max(floor_s, factor * statistics.median(task_seconds))


class StallWatch:
    """No silent stall: while a stage runs, a worker not heard from (its scheduler
    heartbeat) for the deadline (`deadline_s`: a figure, or read anew at each check from
    the stage's counter: `stall_deadline_s`) is named in the log (address, the tasks it runs and the
    results it holds, seconds silent) and removed from the scheduler, which moves its
    tasks to the other workers and recomputes what only it held. Without this a
    SIGSTOPped worker froze a reshard for 592 s, until Dask's own timeout.

    Running a task is not the only way a frozen worker blocks a stage: one frozen just
    after finishing its task holds that result, and the driver's gather of it waits on a
    process that never answers; so silence alone counts."""

    def __init__(
        self, client: Client, stage: str, deadline_s: float | Callable[[], float | None]
    ) -> None:
        self.client, self.stage = client, stage
        self._deadline = deadline_s if callable(deadline_s) else (lambda: deadline_s)
        self.retired: list[str] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True, name="stall-watch")

    def __enter__(self) -> StallWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopped.set()
        self._thread.join()

    @property
    def deadline_s(self) -> float:
        """The deadline now (it grows with the stage's task times: StageProgress)."""
        return self._deadline() or 0.0

    def _watch(self) -> None:
        while not self._stopped.wait(min(5.0, self.deadline_s / 4)):
            try:
                self.check()
            except Exception as error:  # the watch never fails the stage it watches
                log.debug("stall watch of %s: %s", self.stage, error)

    def check(self) -> None:
        """Name and retire each worker silent past the deadline (see `to_retire`)."""
        workers = self.client.scheduler_info(n_workers=-1)["workers"]
        deadline_s = self.deadline_s
        silent = to_retire(workers, time.time(), deadline_s)
        running, holding = (
            (self.client.processing(), self.client.has_what()) if silent else ({}, {})
        )
        for address, silent_s in silent.items():
            log.warning(
                "stage %s: worker %s silent for %.0f s (deadline %.0f s) running %s and "
                "holding %d results; removing it, its tasks run on the other workers",
                self.stage,
                address,
                silent_s,
                deadline_s,
                ", ".join(str(key) for key in running.get(address, ())[:3]) or "no task",
                len(holding.get(address, ())),
            )
            self.client.run_on_scheduler(_remove_worker, address)
            self.retired.append(address)


def to_retire(workers: dict[str, dict], now: float, deadline_s: float) -> dict[str, float]:
    """The workers silent past the deadline (address -> seconds silent), but only while
    some other worker was heard from within it. On a host starved of CPU every worker's
    heartbeat can lag at once; removing them all would leave a stage no worker to run
    on (a removed live worker shuts itself down), where waiting costs only time."""
    silent_s = {address: now - info.get("last_seen", now) for address, info in workers.items()}
    late = {address: s for address, s in silent_s.items() if s > deadline_s}
    return late if len(late) < len(silent_s) else {}


async def _remove_worker(address: str, dask_scheduler: Any = None) -> None:
    # close=False: a frozen worker cannot answer a close; the scheduler forgets it.
    await dask_scheduler.remove_worker(
        address=address, close=False, stimulus_id=f"ballast-stall-{time.time()}"
    )


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


def _stall_watch(client: Client, counter: StageProgress | None) -> StallWatch | None:
    """The stage's stall watch, reading its deadline from `counter`; None: unwatched."""
    if counter is None or counter.floor_s is None:
        return None
    return StallWatch(client, counter.stage, lambda: counter.deadline_s)


def run_in_waves(
    client: Client,
    function: Callable[..., Any],
    arguments: Iterable[tuple],
    total: int,
    limit: int,
    counter: StageProgress | None = None,
    **shared: Any,
) -> list[Any]:
    """`function(*args, **shared)` for each of the `total` argument tuples, at most `limit`
    in flight; the results in the order of `arguments`."""
    results: list[Any] = [None] * total
    feed = enumerate(arguments)
    slots: dict[Any, tuple[int, float]] = {}  # key -> (index, submitted at)
    pending = as_completed()

    def submit_next() -> None:
        item = next(feed, None)
        if item is not None:
            future = client.submit(function, *item[1], pure=False, **shared)
            slots[future.key] = (item[0], time.monotonic())
            pending.add(future)

    for _ in range(max(1, limit)):
        submit_next()
    watch = _stall_watch(client, counter)
    with watch or contextlib.nullcontext():
        for future in pending:
            index, submitted = slots.pop(future.key)
            results[index] = future.result()
            future.release()
            submit_next()
            if counter is not None:
                counter.advance(time.monotonic() - submitted)
    return results
