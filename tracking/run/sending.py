"""Send a part of a run to MLflow, or keep it in the run's spool: the one place that
chooses, for the run's creation, params, lineage, the model and the close alike.

A server that cannot be reached (or fails transiently) costs time, never data: the part
is kept in the run's spool (tracking/run/spool.py) with a warning naming the command that
sends it, and `tracking.run.runs.deliver` sends it later.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

from mlflow.tracking import MlflowClient

from preprocessing.toolbox.secrets import redact
from tracking.config import TrackingConfig
from tracking.run.spool import Spool, is_local_run, new_local_run_id
from tracking.server import is_server, is_transient, wait_until_reachable

Result = TypeVar("Result")


def send_or_keep(
    config: TrackingConfig,
    run_id: str | None,
    what: str,
    send: Callable[[MlflowClient], Result],
    keep: Callable[[Spool], Result],
    wait_s: float = 0.0,
    tags: dict[str, str] | None = None,
) -> Result:
    """`send` `what` to the run on the server; if the run is only in a spool, or the server
    cannot be reached (waiting up to `wait_s`) or fails transiently, `keep` it in the
    run's spool instead (`run_id` None: a new local run's, with `tags`) and warn."""
    reason = "the run is not on the server yet"
    if run_id is None or not is_local_run(run_id):
        try:
            if wait_until_reachable(config.tracking_uri, wait_s):
                return send(MlflowClient(config.tracking_uri))
            reason = "the server did not answer"
        except Exception as error:
            if not (is_server(config.tracking_uri) and is_transient(error)):
                raise
            reason = redact(f"{type(error).__name__}: {error}")[:500]
    spool = Spool.of_run(config, run_id or new_local_run_id()).open(config, tags)
    kept = keep(spool)
    warn_kept(config, spool, what, reason)
    return kept


def warn_kept(config: TrackingConfig, spool: Spool, what: str, reason: str) -> None:
    warnings.warn(
        f"MLflow at {redact(config.tracking_uri)} could not take {what} (run "
        f"{spool.path.name}: {reason}); it is kept in {spool.path} and sent when the run is "
        f"closed with the server back, or by `{spool.upload_command()}`",
        RuntimeWarning,
        stacklevel=3,
    )
