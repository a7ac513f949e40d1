"""The Lightning logger that sends a training job's metrics to its MLflow run."""

from __future__ import annotations

import os

from lightning.pytorch.utilities.rank_zero import rank_zero_only

from tracking.buffered_logger import BufferedMlflowLogger
from tracking.config import TrackingConfig
from tracking.run import create_run


def make_lightning_logger(config: TrackingConfig, spill_dir: str) -> BufferedMlflowLogger:
    """A buffered logger bound to `config.run_id` (made by the launcher before ranks start).

    Lightning calls loggers on rank 0 only, so the other ranks never touch the backend
    (docs/architecture.md M6). Without a run id (a job started by hand) rank 0 creates the run.
    Checkpoints are not uploaded here: FSDP2 writes directories, which MLFlowLogger
    skips silently (docs/architecture.md M4); tracking.artifacts logs them after the job.
    """
    # The logger retries on its own schedule; MLflow's own long retry loop would only
    # delay the report at the end of a job while the server is down.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    run_id = config.run_id or _create_run_on_rank_zero(config)
    return BufferedMlflowLogger(config.tracking_uri, run_id or "", spill_dir)


@rank_zero_only
def _create_run_on_rank_zero(config: TrackingConfig) -> str:
    return create_run(config)
