"""`loader.balance: speed` in a real 2-rank gloo job under torchrun: the shares follow the
ranks' measured speed, and the invariants of the equal split still hold."""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from training.config import RUNS_FOLDER, LoaderConfig, TrainConfig
from training.data.split_memory import FILE_NAME, remembered_reading, remembered_split
from training.launch import LocalJob, RetryPolicy, run_job
from training.models.config import ModelConfig

MODEL = "tests.training.balance_model:PerSampleSlowClassifier"
ROWS, BATCH = 640, 16


def recorded_rows(record_dir: Path, rank: int) -> list[list[int]]:
    """The ids of each step rank `rank` trained, in order."""
    lines = (record_dir / f"ids-rank{rank}.txt").read_text().splitlines()
    return [[int(i) for i in line.split()[2:]] for line in lines]


@pytest.mark.slow
def test_speed_moves_rows_off_a_slow_rank_and_trains_each_sample_once(
    dataset_cache: Callable[..., str], tmp_path: Path
) -> None:
    """Rank 1 sleeps 4 ms per sample: under `balance: speed` (re-planned every 2 steps)
    both ranks run the same number of steps, every train sample is trained exactly once in
    the epoch, every step still has 2 x batch_size rows, and over the last steps rank 1
    takes fewer rows than rank 0 (about a third when the sleep dominates). The split
    learned is remembered in the output dir under the job's world size and hosts, with
    rank 1's share the smaller, with the controller's reading at the job's global batch,
    at its top (shared by its runs), not in the run's folder."""
    record_dir = tmp_path / "record"
    record_dir.mkdir()
    cfg = TrainConfig(
        dataset=dataset_cache(ROWS, row_group_size=32),
        output_dir=str(tmp_path / "run"),
        max_epochs=1,
        strategy="ddp",
        loader=LoaderConfig(batch_size=BATCH, balance="speed", balance_every_n_steps=2),
        model=ModelConfig(
            class_path=MODEL,
            hidden_sizes=[16],
            options={"record_dir": str(record_dir), "slow_rank": 1, "sample_sleep_s": 0.004},
        ),
    )
    summary = run_job(
        cfg, LocalJob(num_processes_per_node=2, timeout_s=300, retry=RetryPolicy(attempts=1))
    )
    ranks = [recorded_rows(record_dir, rank) for rank in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == ROWS // (2 * BATCH)
    ids = [i for rank in ranks for step in rank for i in step]
    assert sorted(ids) == list(range(ROWS))
    assert all(len(a) + len(b) == 2 * BATCH for a, b in zip(*ranks, strict=True))
    late = slice(-5, None)
    assert sum(map(len, ranks[1][late])) < 0.8 * sum(map(len, ranks[0][late]))
    assert summary["samples_per_s_per_rank"][0] > summary["samples_per_s_per_rank"][1]
    host = socket.gethostname()
    remembered = remembered_split(cfg.output_dir, [host, host])
    assert remembered is not None and remembered[1] < remembered[0]
    learned = remembered_reading(cfg.output_dir, [host, host], 2 * BATCH)
    assert learned is not None and learned.history  # the step model's points, for the next job
    assert remembered_reading(cfg.output_dir, [host, host], BATCH) is None  # at its batch only
    assert not list(Path(cfg.output_dir, RUNS_FOLDER).rglob(FILE_NAME))  # in no run's folder
