"""Per-node system metrics (CPU, memory, disk, network; GPU when present) for a job's run.

The first process of every node (LOCAL_RANK 0) samples its machine with MLflow's
system-metrics monitors and logs under `system/node_<n>/...`, so a multi-node job shows
each node separately. Other processes do nothing. Errors of the sampler never reach
training: it runs in its own thread.

Two things of MLflow's own monitor loop are replaced. It stops for good at the first
failed `get_run` (a server down for one request ended a node's metrics for the whole
job), and its batch logger drops what it could not send; here samples go through a
`MetricDelivery` (tracking/run/delivery.py), which retries and keeps in the run's spool what
the server cannot take. MLflow's monitor publishes only after a whole sampling interval,
so a block shorter than one interval would leave no trace: one last sample is published
at the end, so every job records its node's state at least once.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

from tracking.config import TrackingConfig
from tracking.run.delivery import MetricDelivery


class _DeliverySink:
    """What the monitor calls its `mlflow_logger`, feeding a `MetricDelivery` instead."""

    def __init__(self, delivery: MetricDelivery) -> None:
        self.delivery = delivery
        self.data: list[Any] = []  # read by the monitor's debug messages only

    def record_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.delivery.add(metrics, step or 0)

    def flush(self) -> None:
        """Sending is the delivery's; it is closed after the monitor."""


class NodeMonitor(SystemMetricsMonitor):
    """MLflow's monitor with a loop that outlives server outages and a sink that keeps."""

    def __init__(self, config: TrackingConfig, run_id: str, node: str) -> None:
        super().__init__(
            run_id,
            sampling_interval=config.system_metrics_interval_s,
            node_id=f"node_{node}",
            tracking_uri=config.tracking_uri,
        )
        self.delivery = MetricDelivery(config, run_id, writer=f"system-node{node}")
        self.mlflow_logger = _DeliverySink(self.delivery)  # type: ignore[assignment]

    def monitor(self) -> None:
        """Sample, wait an interval, publish; until `finish` sets the shutdown event."""
        while not self._shutdown_event.is_set():
            for _ in range(self.samples_before_logging):
                self.collect_metrics()
                if self._shutdown_event.wait(self.sampling_interval):
                    return
            self.publish_metrics(self.aggregate_metrics())


@contextmanager
def node_system_metrics(config: TrackingConfig | None, run_id: str | None) -> Iterator[None]:
    """Sample this node's system metrics into the run while the block runs."""
    if (
        config is None
        or run_id is None
        or config.system_metrics_interval_s is None
        or os.environ.get("LOCAL_RANK", "0") != "0"
    ):
        yield
        return
    node = os.environ.get("GROUP_RANK", os.environ.get("NODE_RANK", "0"))
    monitor = NodeMonitor(config, run_id, node)
    monitor.start()
    try:
        yield
    finally:
        monitor.finish()
        publish_last_sample(monitor)
        monitor.delivery.close()


def publish_last_sample(monitor: SystemMetricsMonitor) -> None:
    """Collect and log one more sample (plus any the loop collected but did not log)."""
    try:
        monitor.collect_metrics()
        monitor.publish_metrics(monitor.aggregate_metrics())
        monitor.mlflow_logger.flush()
    except Exception as error:  # metrics must never fail a finished job
        warnings.warn(f"last system-metrics sample not logged: {error}", stacklevel=2)
