"""The stall watch under its shipped defaults (`progress_deadline_s`,
`progress_deadline_factor`): a stage whose tasks run past a minute on a slowed worker
removes nothing (the watch judges a worker's heartbeat, not its tasks), and a worker
SIGSTOPped in a short reshard's exchange is named within 90 s, then the run commits the
clean run's bytes. The analogues with a 3-10 s floor are in tests/preprocessing/
test_stall.py; these take minutes, so they run in the nightly tier (`make nightly`),
never in `make test`."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path

import pytest
from distributed import Client

from preprocessing.config import ReshardConfig
from preprocessing.driver.reshard import run_reshard
from preprocessing.driver.waves import StageProgress, run_in_waves
from tests.log_records import records_of
from tests.preprocessing.test_stall import WAVES, staged_config, throttled, two_worker_client

pytestmark = [pytest.mark.slow, pytest.mark.nightly]
LONG_CPU_S = 45.0  # on a worker running 0.7 s of every second: over 60 s of wall time


def _burn(cpu_s: float, value: int) -> int:
    """Spin until this thread has used `cpu_s` of CPU: a task that a slowed worker makes
    longer, as a throttled host would (a sleep would not be slowed)."""
    start = time.thread_time()
    while time.thread_time() - start < cpu_s:
        sum(range(10_000))
    return value


def test_tasks_of_over_a_minute_on_a_slowed_worker_remove_nothing() -> None:
    """Invariant: with the defaults, a worker stopped 0.3 s of every second runs tasks of
    over 60 s, past the stage's deadline at their end (the median task is short, so the
    deadline is the 60 s floor); it is never named silent nor removed, and every result
    arrives in order."""
    floor_s = ReshardConfig.model_fields["progress_deadline_s"].default
    factor = ReshardConfig.model_fields["progress_deadline_factor"].default
    arguments = [(LONG_CPU_S if i in (2, 5) else 0.05, i) for i in range(8)]
    with records_of(WAVES, logging.WARNING) as logged, two_worker_client() as client:
        pids = client.run(os.getpid)
        counter = StageProgress("slow", len(arguments), None, floor_s, factor)
        started = time.monotonic()
        with throttled(pids[sorted(pids)[0]], 0.3, 0.7), throttled(pids[sorted(pids)[1]], 0.3, 0.7):
            results = run_in_waves(client, _burn, arguments, len(arguments), 2, counter)
        took_s = time.monotonic() - started
        assert set(client.scheduler_info()["workers"]) == set(pids)
    print(
        f"stage took {took_s:.0f} s, deadline {counter.deadline_s:.0f} s, longest task "
        f"{max(counter.task_seconds):.0f} s"
    )
    assert results == list(range(len(arguments)))
    assert counter.deadline_s is not None and max(counter.task_seconds) > counter.deadline_s
    assert not [r for r in logged if "silent" in r.getMessage()]


def test_a_worker_frozen_in_a_short_reshard_is_named_within_90_s_by_default(
    tiny_raw: Path, tmp_path: Path, dask_client: Client
) -> None:
    """Invariant: with the shipped defaults, a worker SIGSTOPped mid-exchange of a reshard
    of a few seconds is named silent after the 60 s floor and within 90 s of the freeze
    (issue 61's case: 180 s before), and the same call commits the clean run's bytes."""
    config = staged_config(tiny_raw, tmp_path / "frozen")  # the shipped stall defaults
    frozen: list[float] = []
    with records_of(WAVES, logging.WARNING) as logged, two_worker_client() as client:
        address, victim = sorted(client.run(os.getpid).items())[0]

        def freeze_one(at: str, done: int, total: int) -> None:
            if at == "exchange" and done < total and not frozen:
                os.kill(victim, signal.SIGSTOP)
                frozen.append(time.time())

        try:
            result = run_reshard(config, client, progress=freeze_one)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim, signal.SIGCONT)
    named = [r for r in logged if address in r.getMessage() and "silent" in r.getMessage()]
    assert frozen and named, "the frozen worker was not named"
    named_after_s = named[0].created - frozen[0]
    print(f"named {named_after_s:.1f} s after the freeze: {named[0].getMessage()}")
    assert config.progress_deadline_s <= named_after_s < 90
    clean = run_reshard(config.model_copy(update={"output_root": str(tmp_path / "c")}), dask_client)
    digests = [[s.sha256 for s in r.manifest.split("train").shards] for r in (result, clean)]
    assert result.manifest.version_id == clean.manifest.version_id and digests[0] == digests[1]
