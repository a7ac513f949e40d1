"""Per-node system metrics (CPU, memory, disk, network; GPU when present) for a job's run.

The first process of every node (LOCAL_RANK 0) samples its machine with MLflow's
system-metrics monitor and logs under `system/node_<n>/...`, so a multi-node job shows
each node separately. Other processes do nothing. Errors of the monitor never reach
training: it runs in its own thread and MLflow logs its failures as warnings.
MLflow's monitor publishes only after a whole sampling interval, so a block shorter
than one interval would leave no trace; one last sample is published at the end so
every job records its node's state at least once.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from tracking.config import TrackingConfig

if TYPE_CHECKING:
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor


@contextmanager
def node_system_metrics(config: TrackingConfig | None, run_id: str | None) -> Iterator[None]:
    """Sample this node's system metrics into the run while the block runs."""
    if (config is None or run_id is None or config.system_metrics_interval_s is None
            or os.environ.get("LOCAL_RANK", "0") != "0"):
        yield
        return
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    node = os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0"))
    monitor = SystemMetricsMonitor(run_id, sampling_interval=config.system_metrics_interval_s,
                                   node_id=f"node_{node}", tracking_uri=config.tracking_uri)
    monitor.start()
    try:
        yield
    finally:
        monitor.finish()
        publish_last_sample(monitor)


def publish_last_sample(monitor: SystemMetricsMonitor) -> None:
    """Collect and log one more sample (plus any the loop collected but did not log)."""
    try:
        monitor.collect_metrics()
        monitor.publish_metrics(monitor.aggregate_metrics())
        monitor.mlflow_logger.flush()
    except Exception as error:  # metrics must never fail a finished job
        warnings.warn(f"last system-metrics sample not logged: {error}", stacklevel=2)
