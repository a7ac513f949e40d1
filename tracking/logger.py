"""The Lightning logger that sends a training job's metrics to its MLflow run."""

from __future__ import annotations

from lightning.pytorch.loggers import MLFlowLogger

from tracking.config import TrackingConfig


def make_lightning_logger(config: TrackingConfig) -> MLFlowLogger:
    """An MLFlowLogger bound to `config.run_id` (created by the launcher before ranks start).

    Lightning calls loggers on rank 0 only, so the other ranks never touch the backend
    (FINDINGS.md 6). Checkpoints are not uploaded here: FSDP2 writes directories, which
    MLFlowLogger skips silently (FINDINGS.md 4).
    """
    return MLFlowLogger(
        experiment_name=config.experiment,
        tracking_uri=config.tracking_uri,
        run_id=config.run_id,
        run_name=config.run_name,
        artifact_location=config.artifact_location,
        log_model=False,
    )
