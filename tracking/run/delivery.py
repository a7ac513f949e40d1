"""Sending one writer's metric values to a run in the background, never losing one.

Values go into a bounded in-memory queue; a thread sends them in batches
(`MlflowClient.log_batch`) and backs off while the server is unreachable. When the queue
is full, its older half is written to the run's spool (tracking/run/spool.py), not dropped.
`close` keeps trying for `delivery_wait_s`, then writes whatever is left to the spool and
warns with exact counts and the command that sends them. The values of a run that exists
only in the spool (`local-...`) are written there directly.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections import deque
from typing import Any

from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from preprocessing.toolbox.secrets import redact
from tracking.config import TrackingConfig
from tracking.run.spool import Spool, is_local_run
from tracking.server import is_reachable, wait_until_reachable

_BATCH = 1000  # MLflow's log_batch limit on metrics per request


class MetricDelivery:
    """The metric values of one writer (`writer` names its spool file) for one run."""

    def __init__(
        self,
        config: TrackingConfig,
        run_id: str,
        writer: str,
        max_buffered: int = 200_000,
        flush_interval_s: float = 1.0,
    ) -> None:
        self._config, self._run_id, self._writer = config, run_id, writer
        self._client = MlflowClient(config.tracking_uri)
        self._pending: deque[Metric] = deque()
        self._max_buffered, self._interval = max_buffered, flush_interval_s
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread: threading.Thread | None = None
        self.delivered = self.kept = self.failed_attempts = 0
        self.last_error: str | None = None

    @property
    def spool(self) -> Spool:
        return Spool.of_run(self._config, self._run_id)

    def add(self, metrics: dict[str, float], step: int) -> None:
        """Queue values (timestamped now); never blocks on the server."""
        now = int(time.time() * 1000)
        values = [Metric(key, float(value), now, step) for key, value in metrics.items()]
        if is_local_run(self._run_id):
            self._keep(values)
            return
        with self._lock:
            self._pending.extend(values)
            overflow = len(self._pending) - self._max_buffered
            spill = (
                [self._pending.popleft() for _ in range(overflow + self._max_buffered // 2)]
                if overflow > 0
                else []
            )
        if spill:
            self._keep(spill)
        self._ensure_thread()

    def _keep(self, values: list[Metric]) -> None:
        self.spool.open(self._config).append_metrics(self._writer, values)
        self.kept += len(values)

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._deliver_loop, daemon=True, name=f"ballast-mlflow-{self._writer}"
            )
            self._thread.start()

    def _deliver_loop(self) -> None:
        backoff = self._interval
        while not self._stop.wait(backoff):
            backoff = self._interval if self.flush_once() else min(backoff * 2, 30.0)

    def flush_once(self) -> bool:
        """Send everything queued in batches; False (and keep it queued) if sending fails."""
        while True:
            with self._lock:
                batch = [self._pending[i] for i in range(min(_BATCH, len(self._pending)))]
            if not batch:
                return True
            # Probe first: against a down server MLflow's own retry loop would hold this
            # thread (and `close`) for minutes.
            if not is_reachable(self._config.tracking_uri):
                self.last_error = "the server did not answer"
                self.failed_attempts += 1
                return False
            try:
                self._client.log_batch(self._run_id, metrics=batch)
            except Exception as error:  # any transport or server error: keep and retry
                self.last_error = redact(f"{type(error).__name__}: {error}")[:500]
                self.failed_attempts += 1
                return False
            with self._lock:
                for _ in batch:
                    self._pending.popleft()
                self.delivered += len(batch)

    def close(self) -> dict[str, Any]:
        """Stop the thread, try for `delivery_wait_s`, keep the rest; the delivery report."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        deadline = time.monotonic() + self._config.delivery_wait_s
        while not self.flush_once() and time.monotonic() < deadline:
            time.sleep(1.0)
            if not wait_until_reachable(
                self._config.tracking_uri, max(0.0, deadline - time.monotonic())
            ):
                break
        with self._lock:
            left = list(self._pending)
            self._pending.clear()
        if left:
            self._keep(left)
        return self.report()

    def report(self) -> dict[str, Any]:
        """Counts of values sent and kept (with where and how to send them); warns when any
        were kept."""
        spool = self.spool if self.kept else None
        if spool is not None:
            warnings.warn(
                f"MLflow run {self._run_id}: {self.kept} metric values of {self._writer} "
                f"could not be sent to {redact(self._config.tracking_uri)} (last error: "
                f"{self.last_error or 'the run is not on the server yet'}); they are kept in "
                f"{spool.path} and sent when the run is closed, or by "
                f"`{spool.upload_command()}`",
                RuntimeWarning,
                stacklevel=2,
            )
        return {
            "delivered": self.delivered,
            "kept_locally": self.kept,
            "spool": str(spool.path) if spool else None,
            "failed_attempts": self.failed_attempts,
            "last_error": self.last_error,
        }
