"""A 2-rank DDP job (torchrun, gloo on CPU) SIGKILLed mid-epoch and resumed from its last
checkpoint consumes every sample of the epoch exactly once, in the uninterrupted order."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from training.config import LoaderConfig
from training.data.loader import ShardStream
from training.launch.processes import child_env

JOB = Path(__file__).with_name("ddp_resume_job.py")
BATCH_SIZE, EVERY_N_STEPS, NUM_ROWS = 8, 6, 1200
STARTUP_S, STALL_S = 240.0, 60.0


def job_command(root: str, out: Path, phase: str, step_sleep_s: float) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
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
        str(EVERY_N_STEPS),
        "--batch-size",
        str(BATCH_SIZE),
        "--num-workers",
        "1",
        "--step-sleep-s",
        str(step_sleep_s),
    ]


def read_steps(path: Path) -> list[tuple[int, list[int]]]:
    """(global step, ids) per line of a rank's consumed-ids file."""
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(int(row[0]), [int(i) for i in row[1:]]) for row in rows]


def checkpoint_passed(out: Path) -> bool:
    """A mid-epoch checkpoint exists and both ranks have trained 3 steps past it."""
    saved = [int(p.stem.rsplit("step=", 1)[1]) for p in (out / "checkpoints").glob("*step=*.ckpt")]
    if not saved:
        return False
    logged = [read_steps(out / f"ids-kill-rank{rank}.txt") for rank in range(2)]
    return all(steps and steps[-1][0] >= max(saved) + 3 for steps in logged)


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants, from /proc (torchrun starts each rank in its own
    session, so killing torchrun's process group alone would leave the ranks running)."""
    tree, index = [pid], 0
    while index < len(tree):
        for task in Path(f"/proc/{tree[index]}/task").glob("*"):
            children = (task / "children").read_text().split() if task.exists() else []
            tree += [int(child) for child in children]
        index += 1
    return tree


def kill_job(job: subprocess.Popen) -> None:
    """SIGKILL torchrun, every rank and every loader worker at once, as a lost node would."""
    for pid in process_tree(job.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    job.wait(timeout=30)


def steps_logged(out: Path) -> int:
    """How many training steps the two ranks have logged so far, together."""
    return sum(len(read_steps(out / f"ids-kill-rank{rank}.txt")) for rank in range(2))


def run_until_killed(command: list[str], out: Path, log: Path) -> None:
    """Start the job; SIGKILL all its processes once a checkpoint has been passed.

    The job gets STARTUP_S to log its first step (torchrun, two ranks importing Lightning
    and a loader worker each: 15 s alone, several times that while the suite's other
    workers start jobs of their own on the same 2 cores), then fails as stalled only after
    STALL_S without a new step."""
    with open(log, "wb") as output:
        job = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=child_env())
        started, seen = time.monotonic(), 0
        deadline = started + STARTUP_S
        while not checkpoint_passed(out):
            if (logged := steps_logged(out)) > seen:
                seen, deadline = logged, time.monotonic() + STALL_S
            ended = job.poll()
            if ended is not None or time.monotonic() > deadline:
                kill_job(job)
                what = "stalled" if ended is None else f"ended with exit code {ended}"
                pytest.fail(
                    f"job {what} after {time.monotonic() - started:.0f} s and {seen} logged "
                    f"steps, before passing a checkpoint:\n{log.read_text()}"
                )
            time.sleep(0.02)
        kill_job(job)


def reference_ids(root: str, rank: int) -> list[int]:
    """What rank `rank` of 2 consumes in an uninterrupted epoch 0."""
    stream = ShardStream(root, "train", LoaderConfig(batch_size=BATCH_SIZE), seed=5)
    return [i for batch in stream.iterate((rank, 2)) for i in batch["id"].tolist()]


@pytest.mark.slow
def test_sigkilled_ddp_job_resumes_exactly_where_its_checkpoint_was(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """Per rank: the ids of steps up to the checkpoint's global step, followed by the ids the
    resumed job consumed, equal the uninterrupted epoch's ids, in order: none lost, none
    repeated, although the killed job had consumed batches past the checkpoint. Over both
    ranks every sample of the epoch (all but the dropped remainder) appears exactly once."""
    root = make_dataset(NUM_ROWS, holdout_rows=40, num_shards=4, row_group_size=32)
    out = tmp_path / "job"
    out.mkdir()
    run_until_killed(job_command(root, out, "kill", 0.15), out, tmp_path / "kill.log")
    saved_step = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    steps_per_epoch = NUM_ROWS // (2 * BATCH_SIZE)
    assert EVERY_N_STEPS <= saved_step < steps_per_epoch
    resumed = subprocess.run(
        job_command(root, out, "resume", 0.0),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stdout[-4000:] + resumed.stderr[-4000:]
    consumed = []
    for rank in range(2):
        killed = read_steps(out / f"ids-kill-rank{rank}.txt")
        assert killed[-1][0] > saved_step  # batches past the checkpoint were lost with the kill
        before = [i for step, ids in killed if step <= saved_step for i in ids]
        after = [i for _, ids in read_steps(out / f"ids-resume-rank{rank}.txt") for i in ids]
        assert before + after == reference_ids(root, rank)
        consumed += before + after
    assert len(consumed) == len(set(consumed)) == steps_per_epoch * 2 * BATCH_SIZE
