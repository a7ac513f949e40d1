"""A Lightning logger that never lets a down or slow MLflow server stop training.

Metrics go into a bounded in-memory queue; a background thread sends them in
batches (`MlflowClient.log_batch`) and retries with backoff while the server is
unreachable. When the queue is full the oldest metrics are dropped and counted.
At the end, `finalize` keeps trying for `final_flush_s`, then writes whatever
could not be delivered to `undelivered_metrics.jsonl` next to the checkpoints
and warns with exact counts per metric: nothing is lost silently.
"""

from __future__ import annotations

import json
import threading
import time
import warnings
from collections import Counter, deque
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers.logger import Logger
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

_BATCH = 1000  # MLflow's log_batch limit on metrics per request


class BufferedMlflowLogger(Logger):
    """Logs metrics of one existing MLflow run; delivery is asynchronous and retried."""

    def __init__(self, tracking_uri: str, run_id: str, spill_dir: str,
                 max_buffered: int = 200_000, flush_interval_s: float = 1.0,
                 final_flush_s: float = 30.0) -> None:
        super().__init__()
        self._client = MlflowClient(tracking_uri)
        self._run_id, self._spill_dir = run_id, spill_dir
        self._pending: deque[Metric] = deque()
        self._max_buffered, self._interval = max_buffered, flush_interval_s
        self._final_flush_s = final_flush_s
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._thread: threading.Thread | None = None
        self.delivered, self.dropped = 0, Counter[str]()
        self.last_error: str | None = None
        self.failed_attempts = 0
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
        now = int(time.time() * 1000)
        with self._lock:
            for key, value in metrics.items():
                if len(self._pending) >= self._max_buffered:
                    self.dropped[self._pending.popleft().key] += 1
                self._pending.append(Metric(key, float(value), now, step or 0))
        self._ensure_thread()

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._deliver_loop, daemon=True,
                                            name="ballast-mlflow-delivery")
            self._thread.start()

    def _deliver_loop(self) -> None:
        backoff = self._interval
        while not self._stop.wait(backoff):
            backoff = self._interval if self.flush_once() else min(backoff * 2, 30.0)

    def flush_once(self) -> bool:
        """Send everything pending in batches; False (and keep it) if the server fails."""
        while True:
            with self._lock:
                batch = [self._pending[i] for i in range(min(_BATCH, len(self._pending)))]
            if not batch:
                return True
            try:
                self._client.log_batch(self._run_id, metrics=batch)
            except Exception as error:  # any transport or server error: keep and retry
                self.last_error = f"{type(error).__name__}: {error}"[:500]
                self.failed_attempts += 1
                return False
            with self._lock:
                for _ in batch:
                    self._pending.popleft()
                self.delivered += len(batch)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        deadline = time.monotonic() + self._final_flush_s
        while not self.flush_once() and time.monotonic() < deadline:
            time.sleep(1.0)
        self.last_report = self.report_undelivered()

    def report_undelivered(self) -> dict[str, Any]:
        """Spill what was not delivered to a JSON Lines file and warn with exact counts."""
        with self._lock:
            left = list(self._pending)
        report = {"delivered": self.delivered, "undelivered": len(left),
                  "dropped_by_metric": dict(self.dropped), "failed_attempts": self.failed_attempts,
                  "last_error": self.last_error}
        if left or self.dropped:
            spill = Path(self._spill_dir) / "undelivered_metrics.jsonl"
            spill.parent.mkdir(parents=True, exist_ok=True)
            with spill.open("w") as handle:
                for metric in left:
                    handle.write(json.dumps({"key": metric.key, "value": metric.value,
                                             "step": metric.step,
                                             "timestamp": metric.timestamp}) + "\n")
            warnings.warn(f"MLflow run {self._run_id}: {len(left)} metrics not delivered "
                          f"(kept in {spill}), {sum(self.dropped.values())} dropped when the "
                          f"buffer was full {dict(self.dropped)}; last error: "
                          f"{self.last_error}", RuntimeWarning, stacklevel=2)
        return report
