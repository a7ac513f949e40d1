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
import time
from collections.abc import Iterator

import pytest
from distributed import Client, LocalCluster, wait

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import run_reshard
from preprocessing.driver.waves import StallWatch, to_retire
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


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["exchange", "write"])
def test_a_frozen_worker_is_named_and_retired_and_the_run_commits(
    tiny_raw, tmp_path, dask_client, stage: str
) -> None:
    """Invariant: see the module; named within 90 s of the freeze, shards byte-identical."""
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(tiny_raw)]),
        output_root=str(tmp_path / "frozen"),
        target_shard_rows=100,
        max_piece_rows=60,
        exchange_task_bytes=1,
        single_pass_bytes=0,  # the staged route's stages
        exchange_fan_in=2,
        max_tasks_in_flight=2,
        progress_deadline_s=DEADLINE_S,
    )
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
