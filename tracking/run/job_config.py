"""A job's config on its run: the `train.*` params as read back from the pinned file the
ranks run, and that file's sha256 as the tag `ballast.config_sha256`.

The launcher (training/launch/job.py) opens the run before it writes the pinned config,
since the file names the run; the config's params follow the file here, so a run's params
and the config its ranks ran are one file by construction. A server that is away keeps
both in the run's spool (the hash as the param `ballast.config_sha256` there: a spool
keeps params, and its tags only for a run not yet created).

`tag_job_run`: tags a finished job adds to its run (the epoch `train.select_best` chose),
kept in the spool's tags when the server is away (they are sent with the rest).
"""

from __future__ import annotations

from typing import Any

from mlflow.tracking import MlflowClient

from tracking.config import TrackingConfig
from tracking.run.runs import flatten, log_params
from tracking.run.sending import send_or_keep
from tracking.run.spool import Spool

CONFIG_SHA256_TAG = "ballast.config_sha256"


def log_job_config(
    config: TrackingConfig, run_id: str, params: dict[str, Any], sha256: str
) -> None:
    """Log `params` (nested, flattened as `start_run` does) and the tag of `sha256`."""
    flat = flatten(params)

    def send(client: MlflowClient) -> None:
        log_params(client, run_id, flat)
        client.set_tag(run_id, CONFIG_SHA256_TAG, sha256)

    def keep(spool: Spool) -> None:
        spool.add_params(flat | {CONFIG_SHA256_TAG: sha256})

    send_or_keep(config, run_id, "its config", send, keep)


def tag_job_run(config: TrackingConfig, run_id: str, tags: dict[str, str]) -> None:
    """Set `tags` on the job's run, or keep them in its spool."""

    def send(client: MlflowClient) -> None:
        for key, value in tags.items():
            client.set_tag(run_id, key, value)

    send_or_keep(config, run_id, "its tags", send, lambda spool: spool.add_tags(tags))
