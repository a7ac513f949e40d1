"""Real jobs through the launcher (torchrun, gloo on CPU), as a flow launches them: a
two-rank DDP run, the dataset version pinned at launch, config or data errors that fail
once, in one line, and tracking credentials that reach the ranks but no file. The two
tests that only read a finished job share one (`tracked_job`)."""

from __future__ import annotations

import base64
import math
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow.tracking import MlflowClient

from preprocessing.contract.manifest import (
    ManifestError,
    read_current_version,
    resolve_manifest_uri,
)
from tests.training.conftest import write_dataset
from tracking.config import TrackingConfig
from training.config import LoaderConfig, SelectBestConfig, TrainConfig, load_train_config
from training.launch import LocalJob, RetryPolicy, TrainingFailed, run_job
from training.launch.job import PINNED_CONFIG_NAME
from training.launch.processes import child_env
from training.models.config import ModelConfig

RECORDING_MODEL = "tests.training.recording_model:RecordingClassifier"
# The tracked job: a learning rate high enough that val_loss turns up before MAX_EPOCHS,
# so that select_best stops it early with a best epoch before its last.
MAX_EPOCHS, VALIDATION_ROWS, SELECTION_LEARNING_RATE = 10, 257, 0.01


def local_job(num_processes: int, attempts: int = 1) -> LocalJob:
    return LocalJob(
        num_processes_per_node=num_processes,
        timeout_s=300,
        retry=RetryPolicy(attempts=attempts, first_delay_s=0),
    )


@dataclass(frozen=True)
class TrackedJob:
    """What the tests that only read the module's one two-rank job see of it."""

    summary: dict[str, Any]
    run_dir: Path
    password: str
    proxy_address: str
    requests: dict[str, int]  # authorized / rejected, as the proxy counted them
    records: Path  # each rank's weights at each validation (RecordingClassifier)


@pytest.fixture(scope="module")
def tracked_job(mlflow_uri: str, tmp_path_factory: pytest.TempPathFactory) -> TrackedJob:
    """One two-rank DDP job (up to MAX_EPOCHS over 2000 train rows in 4 shards, 301
    holdout rows, VALIDATION_ROWS validation rows; `select_best` on val_loss, patience 1,
    each rank's weights recorded at every validation) whose tracking URI holds
    user:password, in front of a server (a loopback proxy) that refuses any request
    without them."""
    root = tmp_path_factory.mktemp("tracked-job")
    password = f"pw-{uuid.uuid4().hex}"
    proxy = BasicAuthProxy(mlflow_uri, f"ada:{password}")
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    dataset = write_dataset(
        root / "data",
        2000,
        holdout_rows=301,
        num_shards=4,
        row_group_size=128,
        validation_rows=VALIDATION_ROWS,
    )
    records = root / "records"
    records.mkdir()
    cfg = TrainConfig(
        dataset=dataset,
        output_dir=str(root / "run"),
        max_epochs=MAX_EPOCHS,
        process_group_timeout_s=120,
        loader=LoaderConfig(batch_size=64, num_workers=1),
        model=ModelConfig(
            class_path=RECORDING_MODEL,
            learning_rate=SELECTION_LEARNING_RATE,
            options={"record_dir": str(records), "record_weights": True},
        ),
        select_best=SelectBestConfig(monitor="val_loss", patience=1),
        tracking=TrackingConfig(
            tracking_uri=f"http://ada:{password}@{proxy.address}",
            experiment="credentials",
            registered_model_name=None,
        ),
    )
    try:
        summary = run_job(cfg, local_job(2))
    finally:
        proxy.shutdown()
    return TrackedJob(
        summary, Path(summary["output_dir"]), password, proxy.address, dict(proxy.counts), records
    )


@pytest.mark.slow
def test_two_rank_ddp_run_gives_equal_batches_per_rank(tracked_job: TrackedJob) -> None:
    """Both ranks train the same positive number of batches (DDP never waits on a missing
    one), validation covers every validation row once (the holdout none), and macro F1 is
    a number in [0, 1]."""
    summary = tracked_job.summary
    assert summary["world_size"] == 2
    epochs = summary["selection"]["epochs_validated"]
    assert summary["batches_per_rank"] == [epochs * (2000 // 128)] * 2
    assert sum(map(sum, summary["confusion_matrix"])) == VALIDATION_ROWS
    assert 0.0 <= summary["val_macro_f1"] <= 1.0 and not math.isnan(summary["val_macro_f1"])
    assert math.isfinite(summary["val_loss"]) and summary["val_loss"] > 0
    assert [attempt["returncode"] for attempt in summary["attempts"]] == [0]


@pytest.mark.slow
def test_two_rank_selection_stops_together_and_logs_the_best_epoch(
    tracked_job: TrackedJob, mlflow_uri: str
) -> None:
    """`select_best` under 2-rank DDP: both ranks validated the same epochs (so stopped
    at the same one), early, after `patience` epochs without a lower val_loss; the chosen
    epoch is the first lowest of the run's logged val_loss history; the logged model's
    weights equal exactly what both ranks held at that epoch (not the last one); the
    summary and the run's tags name the epoch and the validation split."""
    summary, records = tracked_job.summary, tracked_job.records
    selection = summary["selection"]
    epochs = [
        sorted(p.name.split("epoch")[1] for p in records.glob(f"weights-rank{r}-*"))
        for r in range(2)
    ]
    assert epochs[0] == epochs[1] and len(epochs[0]) == selection["epochs_validated"]
    assert selection["stopped_early"] and selection["epochs_validated"] < MAX_EPOCHS
    client = MlflowClient(mlflow_uri)
    history = sorted(client.get_metric_history(summary["run_id"], "val_loss"), key=lambda m: m.step)
    losses = [m.value for m in history]
    assert len(losses) == selection["epochs_validated"]
    chosen = selection["epoch"]
    assert chosen == losses.index(min(losses)) and chosen < selection["epochs_validated"] - 1
    best = [torch.load(records / f"weights-rank{r}-epoch{chosen}.pt") for r in range(2)]
    last = torch.load(records / f"weights-rank0-epoch{selection['epochs_validated'] - 1}.pt")
    logged = logged_network_weights(mlflow_uri, summary["model_uri"])
    assert len(logged) == len(best[0])
    for saved, mine, other in zip(logged, best[0].values(), best[1].values(), strict=True):
        assert torch.equal(saved, mine) and torch.equal(mine, other)
    assert not all(torch.equal(a, b) for a, b in zip(logged, last.values(), strict=True))
    tags = client.get_run(summary["run_id"]).data.tags
    assert summary["checkpoint_chosen_on"] == tags["ballast.checkpoint_chosen_on"] == "validation"
    assert tags["ballast.selected_epoch"] == str(chosen)
    assert tags["ballast.selected_by"] == "val_loss (min), patience 1, on the validation split"


def logged_network_weights(tracking_uri: str, model_uri: str) -> list[torch.Tensor]:
    """The weights of the network inside the logged pyfunc, in its layers' order."""
    import mlflow

    before = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)  # a `models:/` URI resolves on the global one
    try:
        network = mlflow.pyfunc.load_model(model_uri).unwrap_python_model().network
    finally:
        mlflow.set_tracking_uri(before)
    return [value.detach().cpu() for value in network.state_dict().values()]


def test_a_missing_dataset_fails_before_any_rank_starts(tmp_path: Path) -> None:
    """A dataset that is not a ballast version is refused by the launcher itself, naming
    it, before a rank starts or a config is written."""
    cfg = TrainConfig(dataset=str(tmp_path / "nowhere"), output_dir=str(tmp_path / "run"))
    with pytest.raises(ManifestError, match=r"nowhere: no _MANIFEST\.json"):
        run_job(cfg, local_job(1, attempts=3))
    assert not (tmp_path / "run").exists()


def test_selection_without_a_validation_split_fails_before_any_rank_starts(
    tmp_path: Path,
) -> None:
    """`select_best` on a version without a validation split is refused by the launcher,
    naming `dataset.validation_fraction`, before a rank starts or a config is written."""
    dataset = write_dataset(tmp_path / "data", 64, holdout_rows=16)
    cfg = TrainConfig(
        dataset=dataset, output_dir=str(tmp_path / "run"), select_best=SelectBestConfig()
    )
    with pytest.raises(ValueError, match=r"no validation split.*dataset\.validation_fraction"):
        run_job(cfg, local_job(1, attempts=3))
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_data_error_on_the_ranks_fails_once_in_one_line(
    dataset_cache: Callable[..., str], tmp_path: Path
) -> None:
    """A train split smaller than one global batch is a data error: both ranks exit with
    the config-error status, the job is not retried although the policy allows 3
    attempts, and TrainingFailed reads as one line naming the cause and the log that
    holds the traceback."""
    cfg = TrainConfig(
        dataset=dataset_cache(40, row_group_size=8),
        output_dir=str(tmp_path / "run"),
        loader=LoaderConfig(batch_size=64),
    )
    with pytest.raises(TrainingFailed) as raised:
        run_job(cfg, local_job(2, attempts=3), run_key="data-error")
    failure = raised.value
    assert len(failure.attempts) == 1 and failure.returncode not in (0, None)
    assert "fewer than one global batch" in str(failure) and "\n" not in str(failure)
    assert failure.config_error is not None and "error on 2 ranks:" in str(failure)
    log = tmp_path / "run" / "runs" / "data-error" / "errors" / "rank-0.log"  # its own folder
    assert f"(traceback: {log})" in failure.config_error
    assert "Traceback (most recent call last)" in log.read_text()


@pytest.mark.slow
def test_a_rank_exits_2_on_a_config_error_with_its_cause_in_one_line(tmp_path: Path) -> None:
    """`python -m training` with an invalid config exits with status 2 (not 1, which any
    crash gives), prints the cause naming the field in its last stderr line, and keeps the
    traceback in the log file that line names."""
    config = tmp_path / "train.yaml"
    config.write_text(f"dataset: x\noutput_dir: {tmp_path}\nmax_epochs: 0\n")
    done = subprocess.run(
        [sys.executable, "-m", "training", "--config", str(config)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("config or data error on rank 0: ValidationError:")
    assert "max_epochs" in last
    log = Path(last.rsplit("(traceback: ", 1)[1].rstrip(")"))
    assert "Traceback (most recent call last)" in log.read_text()


class VersionCommitter(threading.Thread):
    """Commits a second version (twice the rows) into `root` once the launcher has pinned
    the job, i.e. while its ranks start; records when `_CURRENT` moved."""

    def __init__(self, root: Path, pinned_config: Path) -> None:
        super().__init__(daemon=True)
        self.root, self.pinned_config = root, pinned_config
        self.committed_at: float | None = None

    def run(self) -> None:
        deadline = time.monotonic() + 120
        while not self.pinned_config.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        write_dataset(self.root, 1280, row_group_size=32)
        self.committed_at = time.time()


@pytest.mark.slow
def test_every_rank_reads_the_version_pinned_at_launch(tmp_path: Path) -> None:
    """A version committed while the job starts (after the launcher resolved `_CURRENT`,
    before any rank trained) changes nothing: the job names the version current at
    launch, and both ranks train that version's batch count, not the new one's."""
    root, records = tmp_path / "data", tmp_path / "records"
    records.mkdir()
    write_dataset(root, 640, row_group_size=32)
    pinned_version = resolve_manifest_uri(str(root))
    cfg = TrainConfig(
        dataset=str(root),
        output_dir=str(tmp_path / "run"),
        max_epochs=1,
        loader=LoaderConfig(batch_size=32),
        model=ModelConfig(
            class_path=RECORDING_MODEL, hidden_sizes=[8], options={"record_dir": str(records)}
        ),
    )
    committer = VersionCommitter(root, tmp_path / "run" / "runs" / "pinned" / PINNED_CONFIG_NAME)
    committer.start()
    summary = run_job(cfg, local_job(2), run_key="pinned")
    committer.join()
    assert committer.committed_at is not None
    assert read_current_version(str(root)) == "test1280x0x3x32"  # the commit landed
    started = min((records / f"pid-rank{rank}").stat().st_mtime for rank in range(2))
    assert committer.committed_at < started, "the ranks started before the commit"
    assert summary["manifest_uri"] == pinned_version
    assert summary["batches_per_rank"] == [640 // 64] * 2


class BasicAuthProxy(ThreadingHTTPServer):
    """A loopback HTTP proxy in front of `upstream` that answers 401 to any request without
    Basic auth for `credentials` (user:password), and counts both kinds of request."""

    def __init__(self, upstream: str, credentials: str) -> None:
        super().__init__(("127.0.0.1", 0), ForwardingHandler)
        self.upstream = upstream
        self.expected = "Basic " + base64.b64encode(credentials.encode()).decode()
        self.counts = {"authorized": 0, "rejected": 0}

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class ForwardingHandler(BaseHTTPRequestHandler):
    """Checks the Authorization header, then replays the request upstream."""

    server: BasicAuthProxy

    def forward(self) -> None:
        if self.headers.get("Authorization") != self.server.expected:
            self.server.counts["rejected"] += 1
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.server.counts["authorized"] += 1
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {
            k: v
            for k, v in self.headers.items()
            if k.lower() not in ("host", "authorization", "connection")
        }
        request = urllib.request.Request(
            self.server.upstream + self.path,
            data=body or None,
            headers=headers,
            method=self.command,
        )
        try:
            response = urllib.request.urlopen(request, timeout=60)
        except urllib.error.HTTPError as error:
            response = error
        with response:
            payload = response.read()
            self.send_response(response.status)
            for key, value in response.headers.items():
                if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = forward

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the test reads the counts."""


@pytest.mark.slow
def test_tracking_credentials_reach_the_ranks_but_no_file(
    tracked_job: TrackedJob, mlflow_uri: str
) -> None:
    """With a tracking URI holding user:password, in front of a server that refuses any
    request without them: the job's run is created and its metrics arrive (every request,
    both ranks' included, authenticated: none refused), and no file the job wrote, the
    pinned config first, holds the password."""
    summary, run_dir = tracked_job.summary, tracked_job.run_dir
    assert tracked_job.requests["rejected"] == 0 and tracked_job.requests["authorized"] > 0
    assert summary["tracking_delivery"]["kept_locally"] == 0  # every metric reached the server
    assert "train_loss" in MlflowClient(mlflow_uri).get_run(summary["run_id"]).data.metrics
    pinned = load_train_config(run_dir / PINNED_CONFIG_NAME)
    assert pinned.tracking is not None
    assert pinned.tracking.tracking_uri == f"http://{tracked_job.proxy_address}"
    written = [path for path in run_dir.rglob("*") if path.is_file()]
    assert written and not [p for p in written if tracked_job.password.encode() in p.read_bytes()]
