"""A rank that stops making progress (SIGSTOPped mid-epoch) is detected by the watchdog of
the rank waiting for it, the attempt fails naming the stuck rank, and the launcher's retry
resumes from the last checkpoint: the job ends, and every sample of the epoch is trained
exactly once across the two attempts (training/distributed/watchdog.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from training.config import LoaderConfig, TrainConfig
from training.data.loader import ShardStream
from training.distributed.hangs import hang_log_uri, take_hang_reports, write_hang_report
from training.distributed.watchdog import KEY, stuck_peers
from training.launch import LocalJob, RetryPolicy, run_job
from training.models.config import ModelConfig

RECORDING_MODEL = "tests.training.recording_model:RecordingClassifier"
NUM_ROWS, BATCH_SIZE, EVERY_N_STEPS, HANG_TIMEOUT_S = 640, 8, 5, 4.0


def test_hang_reports_are_read_in_rank_order_and_only_once(tmp_path: Path) -> None:
    """The launcher reads every rank's line, rank 10 after rank 2, and removes them, so a
    later attempt's failure is not blamed on this attempt's hang."""
    for rank in (10, 2):
        write_hang_report(str(tmp_path), rank, f"hang on rank {rank}")
    assert take_hang_reports(str(tmp_path)) == ["hang on rank 2", "hang on rank 10"]
    assert take_hang_reports(str(tmp_path)) == []


def read_steps(path: Path) -> list[tuple[str, int, list[int]]]:
    """(torchrun run id, global step before the step, ids) per line of a rank's ids file."""
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(row[0], int(row[1]), [int(i) for i in row[2:]]) for row in rows]


class Stopper(threading.Thread):
    """SIGSTOPs rank 1 once a mid-epoch checkpoint exists and rank 1 is 2 steps past it;
    SIGKILLs it once rank 0's watchdog has written its hang report. torchrun would kill it
    too, but only after a fixed 30 s grace (its `_stop_workers` ignores
    `--shutdown-timeout`), 30 s of nothing this test checks: the cause is the report."""

    def __init__(self, records: Path, checkpoint: Path, report: Path) -> None:
        super().__init__(daemon=True)
        self.records, self.checkpoint, self.report = records, checkpoint, report
        self.pid: int | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and self.pid is None:
            steps = read_steps(self.records / "ids-rank1.txt")
            if self.checkpoint.exists() and steps and steps[-1][1] >= EVERY_N_STEPS + 2:
                self.pid = int((self.records / "pid-rank1").read_text())
                os.kill(self.pid, signal.SIGSTOP)
            time.sleep(0.02)
        while time.monotonic() < deadline and not self.report.exists():
            time.sleep(0.02)
        self.release()

    def release(self) -> None:
        """Nothing stopped outlives the test: SIGKILL (and SIGCONT) rank 1 if it is left."""
        if self.pid is None:
            return
        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
            if "training" in Path(f"/proc/{self.pid}/cmdline").read_text():
                os.kill(self.pid, signal.SIGKILL)
                os.kill(self.pid, signal.SIGCONT)


def reference_ids(root: str, cfg: TrainConfig, rank: int) -> list[int]:
    """What rank `rank` of 2 consumes in an uninterrupted epoch 0."""
    stream = ShardStream(root, "train", cfg.loader, seed=cfg.seed)
    return [i for batch in stream.iterate((rank, 2)) for i in batch["id"].tolist()]


@pytest.mark.slow
def test_a_sigstopped_rank_fails_the_attempt_and_the_retry_trains_every_sample_once(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """Rank 1 is SIGSTOPped mid-epoch: rank 0's watchdog fails the first attempt within the
    hang timeout (not the 120 s collective timeout), its one-line cause naming rank 1 as
    silent; the second attempt resumes from the mid-epoch checkpoint and completes. Per
    rank, the first attempt's steps before the resumed step plus the second attempt's
    equal the uninterrupted epoch's ids in order, and over both ranks every sample of the
    epoch is trained exactly once."""
    root, records = make_dataset(NUM_ROWS, holdout_rows=32, row_group_size=16), tmp_path / "rec"
    records.mkdir()
    cfg = TrainConfig(
        dataset=root,
        output_dir=str(tmp_path / "run"),
        max_epochs=1,
        strategy="ddp",
        checkpoint_every_n_steps=EVERY_N_STEPS,
        process_group_timeout_s=120,
        hang_timeout_s=HANG_TIMEOUT_S,
        loader=LoaderConfig(batch_size=BATCH_SIZE),
        model=ModelConfig(
            class_path=RECORDING_MODEL,
            hidden_sizes=[8],
            options={"record_dir": str(records), "step_sleep_s": 0.15},
        ),
    )
    run = cfg.of_run("hang")  # the folders run_job gives the job of that key
    stopper = Stopper(records, Path(run.last_checkpoint_uri), Path(hang_log_uri(run.output_dir, 0)))
    stopper.start()
    try:
        summary = run_job(
            cfg,
            run_key="hang",
            job=LocalJob(
                num_processes_per_node=2,
                timeout_s=400,
                retry=RetryPolicy(attempts=2, first_delay_s=0),
            ),
        )
    finally:
        stopper.join(timeout=1)
        stopper.release()
    assert stopper.pid is not None, "rank 1 was never stopped"
    first, second = summary["attempts"]
    assert first["returncode"] != 0 and second["returncode"] == 0 and second["resume"]
    assert first["cause"].startswith(
        f"training hung: hang on rank 0: no train step for {HANG_TIMEOUT_S:g} s"
    )
    assert "stuck: rank 1 (silent" in first["cause"]
    assert first["elapsed_s"] < 100  # the watchdog ended it, not the 120 s collective timeout
    consumed = []
    for rank in range(2):
        lines = read_steps(records / f"ids-rank{rank}.txt")
        run_ids = list(dict.fromkeys(run for run, _, _ in lines))
        assert len(run_ids) == 2, run_ids
        resumed = [(step, ids) for run, step, ids in lines if run == run_ids[1]]
        assert resumed[0][0] >= EVERY_N_STEPS  # from the mid-epoch checkpoint, not step 0
        before = [
            i for run, step, ids in lines if run == run_ids[0] and step < resumed[0][0] for i in ids
        ]
        after = [i for _, ids in resumed for i in ids]
        assert before + after == reference_ids(root, cfg, rank)
        consumed += before + after
    assert len(consumed) == len(set(consumed)) == NUM_ROWS // (2 * BATCH_SIZE) * 2 * BATCH_SIZE


def test_the_stuck_peers_are_the_silent_the_behind_and_the_unheard(tmp_path: Path) -> None:
    """Read from a real TCPStore while rank 0 waits at step 7: rank 1's heartbeat does not
    move (silent), rank 2 beats at step 7 (alive, not named), rank 3 beats at step 6
    (behind), rank 4 never published; with no peer to blame the line says so."""
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=5)
    )
    store.set(KEY.format(rank=1), "7 3")
    stop = threading.Event()

    def beat() -> None:
        count = 0
        while not stop.wait(0.05):
            count += 1
            store.set(KEY.format(rank=2), f"7 {count}")
            store.set(KEY.format(rank=3), f"6 {count}")

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        time.sleep(0.1)
        named = stuck_peers(store, 0, 5, 7, 0.3)
        three = stuck_peers(store, 0, 3, 7, 0.3)
    finally:
        stop.set()
        beater.join()
    assert named == (
        "rank 1 (silent for 0.3 s; last heartbeat at step 7), rank 3 (behind, at "
        "step 6), rank 4 (no heartbeat readable)"
    )
    assert three == "rank 1 (silent for 0.3 s; last heartbeat at step 7)"
    assert stuck_peers(store, 0, 1, 7, 0.01).startswith("no peer is silent or behind")
