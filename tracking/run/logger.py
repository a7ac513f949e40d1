"""The Lightning logger that sends a training job's metrics to its MLflow run.

A down or slow server never stops training: values are sent in the background and what
cannot be sent is kept in the run's spool (tracking/run/delivery.py, tracking/run/spool.py).
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from preprocessing.toolbox.faults import ConfigError
from tracking.config import TrackingConfig
from tracking.run.delivery import MetricDelivery


class BufferedMlflowLogger(Logger):
    """Logs metrics of one existing run; `last_report` holds the delivery counts at the end."""

    def __init__(self, config: TrackingConfig, run_id: str) -> None:
        super().__init__()
        self._run_id = run_id
        self._delivery = MetricDelivery(config, run_id, writer="rank0")
        self.last_report: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return "mlflow"

    @property
    def version(self) -> str:
        return self._run_id

    @property
    def run_id(self) -> str:
        return self._run_id

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        """The launcher logged the job's config as params before the ranks started."""

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self._delivery.add(metrics, step or 0)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self.last_report = self._delivery.close()


def make_lightning_logger(config: TrackingConfig) -> BufferedMlflowLogger:
    """A buffered logger bound to `config.run_id` (made by the launcher before ranks start).

    Lightning calls loggers on rank 0 only, so the other ranks never touch the backend
    (docs/architecture.md M6). A rank never creates a run (tracking/run/runs.py is the one
    place runs are opened and closed): without a run id it refuses, naming the field.
    Checkpoints are not uploaded here: FSDP2 writes directories, which MLFlowLogger
    skips silently (docs/architecture.md M4); tracking.run.artifacts logs them after the job.
    """
    # The delivery retries on its own schedule; MLflow's own long retry loop would only
    # delay the end of a job while the server is down.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    if config.run_id is None:
        raise ConfigError(
            "tracking.run_id: a training rank logs into the run its launcher "
            "created; start the job with `python -m training.launch launch` "
            "(or a flow), or name an existing run"
        )
    return BufferedMlflowLogger(config, config.run_id)
