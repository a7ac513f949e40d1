"""Elastic resume in real jobs: a 2-rank DDP job (torchrun, gloo on CPU) checkpointed
mid-epoch, resumed by a 1-rank job and, separately, by a 3-rank job (12 partitions serve
1, 2 and 3 ranks), trains every sample of the epoch exactly once, in the global order.
Both resumes start from one run of the 2-rank job (`first_job`), which they only read."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.training.conftest import write_dataset
from tests.training.job_output import job_failure
from training.config import LoaderConfig
from training.data.loader import ShardStream
from training.launch.processes import child_env

JOB = Path(__file__).with_name("ddp_resume_job.py")
BATCH_SIZE, NUM_PARTITIONS, SAVED_STEP = 8, 12, 30
NUM_ROWS = 1200  # a multiple of 1, 2 and 3 global batches: no rank count drops a remainder


def run_job(
    root: str, out: Path, phase: str, num_ranks: int, num_workers: int, *options: str
) -> None:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(num_ranks),
        "--max-restarts",
        "0",
        str(JOB),
        "--dataset",
        root,
        "--out",
        str(out),
        "--phase",
        phase,
        "--every-n-steps",
        str(SAVED_STEP),
        "--batch-size",
        str(BATCH_SIZE),
        "--num-workers",
        str(num_workers),
        "--num-partitions",
        str(NUM_PARTITIONS),
        *options,
    ]
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, job_failure(done.stdout + done.stderr)


def step_batches(out: Path, phase: str, num_ranks: int, up_to: int | None = None) -> list[int]:
    """The ids the job's steps trained, in global order: step by step, rank by rank."""
    per_rank = []
    for rank in range(num_ranks):
        lines = (out / f"ids-{phase}-rank{rank}.txt").read_text().split("\n")
        rows = [[int(word) for word in line.split()] for line in lines if line.strip()]
        per_rank.append([row[1:] for row in rows if up_to is None or row[0] <= up_to])
    assert len({len(batches) for batches in per_rank}) == 1  # every rank the same count
    return [i for step in zip(*per_rank, strict=True) for batch in step for i in batch]


def uninterrupted_epoch(root: str) -> list[int]:
    """The global stream of epoch 0, as one rank would train it."""
    config = LoaderConfig(batch_size=BATCH_SIZE, num_partitions=NUM_PARTITIONS)
    stream = ShardStream(root, "train", config, seed=5)
    return [i for batch in stream.iterate((0, 1)) for i in batch["id"].tolist()]


@pytest.fixture(scope="module")
def first_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """The 2-rank job (2 workers per rank) both resumes start from, run once: it trains
    past its step-30 checkpoint and ends. Its dataset's root and its output folder."""
    base = tmp_path_factory.mktemp("elastic")
    root = write_dataset(base / "data", NUM_ROWS, holdout_rows=40, num_shards=4, row_group_size=32)
    first = base / "first"
    first.mkdir()
    run_job(root, first, "first", 2, 2, "--max-steps", str(SAVED_STEP + 4))
    return root, first


@pytest.mark.slow
@pytest.mark.parametrize(("num_ranks", "num_workers"), [(1, 2), (3, 1)])
def test_two_rank_checkpoint_resumes_on_another_world_size(
    first_job: tuple[str, Path], tmp_path: Path, num_ranks: int, num_workers: int
) -> None:
    """The 2-rank job (2 workers per rank) trains past its step-30 checkpoint and ends; a
    job of `num_ranks` ranks resumed from that checkpoint trains the rest. The ids of the
    steps up to the checkpoint, then the resumed job's, equal the uninterrupted epoch in
    order: every sample once, none lost with the batches trained after the checkpoint."""
    root, first = first_job
    saved = first / "checkpoints" / f"epoch=0-step={SAVED_STEP}.ckpt"
    assert torch.load(saved, weights_only=False)["global_step"] == SAVED_STEP
    resumed = tmp_path / f"on{num_ranks}"
    resumed.mkdir()
    shutil.copy(saved, resumed / "start.ckpt")
    run_job(root, resumed, "resume", num_ranks, num_workers, "--ckpt", str(resumed / "start.ckpt"))
    assert len(step_batches(first, "first", 2)) > 2 * SAVED_STEP * BATCH_SIZE
    before = step_batches(first, "first", 2, up_to=SAVED_STEP)
    after = step_batches(resumed, "resume", num_ranks)
    assert len(after) == NUM_ROWS - 2 * SAVED_STEP * BATCH_SIZE
    assert before + after == uninterrupted_epoch(root)
    assert sorted(before + after) == list(range(NUM_ROWS))
