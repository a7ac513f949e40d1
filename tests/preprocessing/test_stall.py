"""No silent stall in a data stage (preprocessing/driver/waves.py `StallWatch`): a Dask
worker SIGSTOPped mid-exchange or mid-write is named in the run's log (address, the tasks
it holds, seconds silent) within the progress deadline, removed from the cluster, and
the same `run_reshard` call commits the version a clean run makes, byte-identical. Before,
such a run printed nothing for 300 s and went on only at Dask's own 592 s. A worker
frozen after its task finished runs nothing but holds the result the driver is about to
gather: it is retired the same way (before, that gather waited 600 s in CI)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from distributed import Client, LocalCluster, wait
from hypothesis import given
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import run_reshard
from preprocessing.driver.waves import (
    StageProgress,
    StallWatch,
    run_in_waves,
    stall_deadline_s,
    to_retire,
)
from tests.log_records import records_of

DEADLINE_S = 10.0
WAVES = "preprocessing.driver.waves"  # the stall watch names a silent worker here


@contextlib.contextmanager
def two_worker_client() -> Iterator[Client]:
    """A client of a local cluster of two single-threaded worker processes, one to freeze."""
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def staged_config(raw: Path, root: Path, **settings: float) -> ReshardConfig:
    """A reshard of `raw` on the staged route in many small tasks, two in flight: a stage
    with tasks left whenever a worker is frozen."""
    return ReshardConfig(
        dataset=DatasetSpec(inputs=[str(raw)]),
        output_root=str(root),
        target_shard_rows=100,
        max_piece_rows=60,
        exchange_task_bytes=1,
        single_pass_bytes=0,  # the staged route's stages
        exchange_fan_in=2,
        max_tasks_in_flight=2,
        **settings,
    )


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["exchange", "write"])
def test_a_frozen_worker_is_named_and_retired_and_the_run_commits(
    tiny_raw, tmp_path, dask_client, stage: str
) -> None:
    """Invariant: see the module; named within 90 s of the freeze, shards byte-identical."""
    config = staged_config(tiny_raw, tmp_path / "frozen", progress_deadline_s=DEADLINE_S)
    frozen: list[tuple[int, float]] = []
    with records_of(WAVES, logging.WARNING) as logged, two_worker_client() as client:
        pids = client.run(os.getpid)
        address, victim = sorted(pids.items())[0]

        def freeze_one(at: str, done: int, total: int) -> None:
            if at == stage and done < total and not frozen:
                os.kill(victim, signal.SIGSTOP)
                frozen.append((victim, time.monotonic()))

        try:
            result = run_reshard(config, client, progress=freeze_one)
        finally:
            with contextlib.suppress(ProcessLookupError):  # its nanny may have ended it
                os.kill(victim, signal.SIGCONT)
    named = [r for r in logged if address in r.getMessage() and "silent" in r.getMessage()]
    assert frozen and named, "the frozen worker was not named"
    named_after_s = named[0].created - (time.time() - time.monotonic() + frozen[0][1])
    print(f"{stage}: named {named_after_s:.1f} s after the freeze: {named[0].getMessage()}")
    assert named_after_s < 90
    clean = run_reshard(
        config.model_copy(update={"output_root": str(tmp_path / "clean")}), dask_client
    )

    def digests(r):
        return [s.sha256 for split in ("train", "holdout") for s in r.manifest.split(split).shards]

    assert result.manifest.version_id == clean.manifest.version_id
    assert digests(result) == digests(clean)


def _square(x: int) -> int:
    return x * x


@pytest.mark.slow
def test_a_worker_frozen_holding_only_a_finished_result_is_retired() -> None:
    """Invariant: a silent worker that runs no task but holds a result the driver gathers is
    named and removed, and the result (recomputed on the other worker) arrives well
    before Dask's own timeout."""
    with records_of(WAVES, logging.WARNING) as logged, two_worker_client() as client:
        address, victim = sorted(client.run(os.getpid).items())[0]
        future = client.submit(_square, 7, workers=[address], allow_other_workers=True)
        wait(future)
        assert client.has_what()[address] and not client.processing()[address]
        os.kill(victim, signal.SIGSTOP)
        try:
            with StallWatch(client, "test", deadline_s=DEADLINE_S) as watch:
                assert future.result(timeout=120) == 49
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)
    assert watch.retired == [address]
    assert any(address in r.getMessage() and "silent" in r.getMessage() for r in logged)


def test_a_worker_is_retired_only_while_another_was_heard_from() -> None:
    """Invariant: workers silent past the deadline are retired while another worker is
    responsive; when every worker is silent (a host starved of CPU) none is, since
    removing them all would leave the stage nothing to run on."""
    seen = {"a": {"last_seen": 100.0}, "b": {"last_seen": 95.0}, "c": {"last_seen": 80.0}}
    assert to_retire(seen, 101.0, 10.0) == {"c": 21.0}
    assert to_retire(seen, 89.0, 10.0) == {}
    assert to_retire(seen, 120.0, 10.0) == {}
    assert to_retire({"a": {"last_seen": 0.0}}, 60.0, 10.0) == {}


@given(
    st.floats(0.1, 1e4),
    st.floats(0, 100),
    st.lists(st.floats(0, 1e5, allow_nan=False), max_size=50),
)
def test_the_deadline_is_the_floor_or_the_factor_of_the_median(
    floor_s: float, factor: float, seconds: list[float]
) -> None:
    """Invariant: the stall deadline is never under its floor, is the floor alone until a
    task finished, and is otherwise max(floor, factor x median task time): a stage of
    sub-second tasks is judged at the floor (60 s by default), one of ten-minute tasks at
    3 x ten minutes."""
    deadline = stall_deadline_s(floor_s, factor, seconds)
    assert deadline >= floor_s
    if not seconds:
        assert deadline == floor_s
    else:
        assert deadline == max(floor_s, factor * statistics.median(seconds))
    counter = StageProgress("test", len(seconds), None, floor_s, factor)
    for second in seconds:
        counter.advance(second)
    assert counter.deadline_s == deadline
    assert StageProgress("test", 1, None).deadline_s is None  # no floor: not watched


def _sleep_then(seconds: float, value: int) -> int:
    time.sleep(seconds)
    return value


@contextlib.contextmanager
def throttled(pid: int, stopped_s: float, running_s: float) -> Iterator[list[int]]:
    """Slow process `pid` down: SIGSTOP for `stopped_s` then SIGCONT for `running_s`, over
    and over, until the block ends; yields the list of cycles done."""
    cycles: list[int] = []
    done = threading.Event()

    def cycle() -> None:
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            time.sleep(stopped_s)
            os.kill(pid, signal.SIGCONT)
            cycles.append(1)
            done.wait(running_s)

    thread = threading.Thread(target=cycle, daemon=True)
    thread.start()
    try:
        yield cycles
    finally:
        done.set()
        thread.join()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@pytest.mark.slow
def test_a_slow_worker_that_heartbeats_is_never_removed() -> None:
    """Invariant: a worker throttled (stopped 0.3 s of every 1 s) and running tasks 12 times
    longer than the stage's median, far past the deadline (floor 3 s, factor 1: the
    median task takes well under a second), is never removed, since it still heartbeats;
    every result arrives in order. (The floor stands in for the 60 s default, the task
    lengths for tasks of minutes: what is judged is the heartbeat, not the task time.)"""
    with records_of(WAVES, logging.WARNING) as logged, two_worker_client() as client:
        pids = client.run(os.getpid)
        slow, _ = sorted(pids.items())[0]
        arguments = [(8.0 if i % 5 == 0 else 0.05, i) for i in range(20)]
        counter = StageProgress("slow", len(arguments), None, 3.0, 1.0)
        started = time.monotonic()
        with throttled(pids[slow], 0.3, 0.7) as cycles:
            results = run_in_waves(client, _sleep_then, arguments, 20, 4, counter)
        assert set(client.scheduler_info()["workers"]) == set(pids)
    assert results == list(range(20))
    assert cycles and time.monotonic() - started > 8.0
    assert counter.deadline_s is not None and counter.deadline_s < 8.0  # tasks outlived it
    assert not [r for r in logged if "silent" in r.getMessage()]


@pytest.mark.slow
def test_a_frozen_worker_is_judged_by_the_stages_task_times() -> None:
    """Invariant: in a stage whose tasks take about 2.5 s, with floor 3 s and factor 4, a
    worker frozen mid-stage is named only once silent past 4 x the median (about 10 s),
    not at the floor, and well within a minute; the stage still returns every result."""
    with records_of(WAVES, logging.WARNING) as logged, two_worker_client() as client:
        pids = client.run(os.getpid)
        address, victim = sorted(pids.items())[0]
        counter = StageProgress("timed", 16, None, 3.0, 4.0)
        arguments = [(2.5, i) for i in range(16)]
        frozen: list[float] = []

        def freeze(_: str, done: int, __: int) -> None:
            if done == 6 and not frozen:
                os.kill(victim, signal.SIGSTOP)
                frozen.append(time.time())

        counter._progress = freeze
        try:
            results = run_in_waves(client, _sleep_then, arguments, 16, 2, counter)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)
    named = [r for r in logged if address in r.getMessage() and "silent" in r.getMessage()]
    assert results == list(range(16)) and frozen and named
    named_after_s = named[0].created - frozen[0]
    print(f"named {named_after_s:.1f} s after the freeze: {named[0].getMessage()}")
    assert 9.0 < named_after_s < 60.0
