"""Launch topologies and faults on this machine: two torchrun "nodes" meeting at a c10d
rendezvous on localhost, and one rank SIGKILLed mid-epoch, recovered by the launcher's
retry, which resumes on the version pinned at launch although a newer one was committed."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.services import free_port
from tests.training.conftest import write_dataset
from training.config import load_train_config
from training.launch import LocalJob, MultiNodeJob, RetryPolicy
from training.launch.launchers import MultiNodeTorchrunLauncher
from training.launch.processes import child_env, stop_process_group
from training.summary import read_summary

RECORDING_MODEL = "tests.training.recording_model:RecordingClassifier"


def write_config(path: Path, **fields: Any) -> Path:
    path.write_text(yaml.safe_dump(fields))
    return path


@pytest.mark.slow
def test_two_torchrun_nodes_on_localhost_train_the_same_steps(
    dataset_cache: Callable[..., str], tmp_path: Path
) -> None:
    """Two launcher processes, one rank each, form one job of node ranks 0 and 1 through the
    c10d rendezvous; it completes, and both ranks run the same batches and optimizer steps."""
    config = write_config(
        tmp_path / "train.yaml",
        dataset=dataset_cache(640, row_group_size=64),
        output_dir=str(tmp_path / "run"),
        max_epochs=1,
        process_group_timeout_s=60,
        loader={"batch_size": 32},
        model={"hidden_sizes": [16]},
    )
    spec = MultiNodeJob(
        kind="multinode",
        num_nodes=2,
        num_processes_per_node=1,
        job_name="two-nodes",
        rdzv_endpoint=f"127.0.0.1:{free_port()}",
    )
    command = MultiNodeTorchrunLauncher(spec).command(str(config))
    logs = [open(tmp_path / f"node{i}.log", "wb") for i in range(2)]  # noqa: SIM115
    nodes = [
        subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True
        )
        for log in logs
    ]
    try:
        codes = [node.wait(timeout=300) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                stop_process_group(node)
        for log in logs:
            log.close()
    assert codes == [0, 0], (tmp_path / "node0.log").read_text()[-3000:]
    summary = read_summary(str(tmp_path / "run"))
    assert summary["world_size"] == 2 and sorted(summary["node_rank_per_rank"]) == [0, 1]
    assert summary["global_step_per_rank"] == [640 // 64] * 2
    assert summary["batches_per_rank"] == [640 // 64] * 2


def read_records(path: Path) -> list[tuple[str, int, list[int]]]:
    """(torchrun run id, global step before the step, sample ids) per recorded step."""
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return [(row[0], int(row[1]), [int(i) for i in row[2:]]) for row in rows]


class RankKiller(threading.Thread):
    """SIGKILLs rank 1 once its records show two steps past the first checkpoint (5), then
    commits a newer version (twice the rows) into the dataset root, before the retry."""

    def __init__(self, records: Path, checkpoint: Path, root: Path) -> None:
        super().__init__(daemon=True)
        self.records, self.checkpoint, self.root = records, checkpoint, root
        self.killed_at: float | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 180
        log = self.records / "ids-rank1.txt"
        while time.monotonic() < deadline:
            steps = [step for _, step, _ in read_records(log)] if log.exists() else []
            if steps and max(steps) >= 7 and self.checkpoint.exists():
                os.kill(int((self.records / "pid-rank1").read_text()), signal.SIGKILL)
                self.killed_at = time.time()
                write_dataset(self.root, 2400, num_shards=4, row_group_size=32)
                return
            time.sleep(0.02)


JOB = LocalJob(
    num_processes_per_node=2, timeout_s=300, retry=RetryPolicy(attempts=2, first_delay_s=0)
)


def through_the_flow_task(config: Path) -> dict[str, Any]:
    """The flows' training task, in a flow on the session's temporary API (the
    `prefect_harness` fixture): it runs the job through the launcher, whose policy retries;
    the task itself has no retries."""
    from prefect import flow

    from flows import tasks

    assert tasks.train.retries == 0

    @flow
    def train() -> dict[str, Any]:
        return tasks.train(load_train_config(config), JOB, run_key="killed").figures()

    return train()


@pytest.mark.slow
def test_sigkilled_rank_fails_fast_and_the_retry_resumes_every_sample_once(
    make_dataset: Callable[..., str], tmp_path: Path, prefect_harness: None
) -> None:
    """A rank SIGKILLed mid-epoch ends its attempt well within the process-group timeout (no
    hang); the launcher's retry, run by the flows' training task (which calls the launcher
    and returns its summary, so a run of the launcher alone would check nothing more),
    resumes from the last checkpoint into the same MLflow run, on the dataset version pinned
    at launch although a newer one was committed after the kill, and ends at the step count of an
    uninterrupted epoch; over both attempts every sample of the epoch is trained exactly
    once (the steps after the checkpoint are redone, none is skipped)."""
    from mlflow.tracking import MlflowClient

    records, out = tmp_path / "records", tmp_path / "run"
    records.mkdir()
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    root = make_dataset(1200, num_shards=4, row_group_size=32)
    config = write_config(
        tmp_path / "train.yaml",
        dataset=root,
        output_dir=str(out),
        max_epochs=1,
        process_group_timeout_s=30,
        checkpoint_every_n_steps=5,
        loader={"batch_size": 8},
        model={
            "class_path": RECORDING_MODEL,
            "hidden_sizes": [16],
            "options": {"record_dir": str(records), "step_sleep_s": 0.05},
        },
        tracking={
            "tracking_uri": uri,
            "experiment": "retry",
            "registered_model_name": None,
            "artifact_location": str(tmp_path / "artifacts"),
        },
    )
    # The job's own folder (training/launch/job.py): `runs/<run key>` of its output_dir.
    killer = RankKiller(records, out / "runs" / "killed" / "checkpoints" / "last.ckpt", Path(root))
    killer.start()
    summary = through_the_flow_task(config)
    killer.join()
    assert killer.killed_at is not None, "the job ended before a rank could be killed"
    first, second = summary["attempts"]
    assert first["returncode"] != 0 and second["returncode"] == 0
    assert (first["resume"], second["resume"]) == (False, True)
    failed_after_s = first["ended_at"] - killer.killed_at
    assert failed_after_s < 30, f"the attempt ended {failed_after_s:.1f} s after the kill"
    assert summary["global_step"] == 1200 // 16 and summary["resumed_from"].endswith("last.ckpt")
    trained = []
    for rank in range(2):
        rows = read_records(records / f"ids-rank{rank}.txt")
        attempt_ids = list(dict.fromkeys(run_id for run_id, _, _ in rows))
        assert len(attempt_ids) == 2
        resumed_at = min(step for run_id, step, _ in rows if run_id == attempt_ids[1])
        killed = [(step, ids) for run_id, step, ids in rows if run_id == attempt_ids[0]]
        assert 5 <= resumed_at <= max(step for step, _ in killed)  # mid-epoch, some redone
        trained += [i for step, ids in killed if step < resumed_at for i in ids]
        trained += [i for run_id, _, ids in rows if run_id == attempt_ids[1] for i in ids]
    assert sorted(trained) == list(range(1200))
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("retry")
    assert experiment is not None
    assert [run.info.run_id for run in client.search_runs([experiment.experiment_id])] == [
        summary["run_id"]
    ]
    assert client.get_metric_history(summary["run_id"], "comm/allreduce_bytes")
