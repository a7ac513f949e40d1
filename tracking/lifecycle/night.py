"""A night's run: the parent MLflow run of one pipeline flow run, its arms' training runs
and the champion's scoring as its children (`mlflow.parentRunId`, tracking/run/origin.py).

It holds the night's summary: the dataset version, the promotion's decision and reason,
the drift, and the held-out figures of every arm. The arm up for promotion logs under the
names the arms' runs use (`holdout_macro_f1`, `holdout_recall/<label>`...), every arm under
`<arm>/<name>`, so MLflow's chart view compares nights with no setup. A server down at
the start or the close costs time, not the run: it is kept in its spool, and a child
created meanwhile keeps its link (tracking/run/runs.py sends the parent first).
"""

from __future__ import annotations

import json
import time
from typing import Any

from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

from preprocessing.contract.names import mlflow_key
from preprocessing.toolbox.secrets import redact
from tracking.config import TrackingConfig
from tracking.lifecycle.holdout import MAX_NOTE_CHARS, NOTE_TAG, holdout_metrics
from tracking.run.origin import code_tags
from tracking.run.runs import create_run, deliver
from tracking.run.sending import send_or_keep
from tracking.run.spool import Spool

NIGHT_TAG = "ballast.night"  # "true" on a night's run (the runs table can filter on it)
PREFECT_URL_TAG = "ballast.prefect_flow_run_url"
PREFECT_ID_TAG = "ballast.prefect_flow_run_id"
DECISION_TAG, REASON_TAG = "ballast.promotion", "ballast.promotion_reason"
SUMMARY_ARTIFACT = "night/summary.json"


def now_ms() -> int:
    return int(time.time() * 1000)


def open_night(config: TrackingConfig, run_name: str, tags: dict[str, str]) -> str:
    """Create the night's run (before its children); its id (`local-...` if kept)."""
    night = config.model_copy(update={"run_name": run_name, "run_id": None, "parent_run_id": None})
    return create_run(night, {**code_tags(), NIGHT_TAG: "true", **tags})


def night_metrics(
    evaluations: dict[str, dict[str, Any]], arm: str, registration: dict[str, Any] | None
) -> dict[str, float]:
    """`arm`'s held-out figures under the arms' own names, each arm's under `<arm>/`, the
    drift and the promotion's scores."""
    metrics = dict(holdout_metrics(evaluations[arm])) if arm in evaluations else {}
    for name, evaluation in evaluations.items():
        metrics |= holdout_metrics(evaluation, f"{mlflow_key(name)}/")
    if registration is not None:
        metrics |= _promotion_metrics(registration)
    return metrics


def _promotion_metrics(registration: dict[str, Any]) -> dict[str, float]:
    metrics = {
        "promotion.challenger_macro_f1": float(registration["score"]),
        "promotion.promoted": float(registration["alias"] == "champion"),
    }
    same = registration.get("same_rows") or {}
    if same.get("champion_score") is not None:
        metrics["promotion.champion_macro_f1"] = float(same["champion_score"])
    drift = registration.get("drift") or {}
    for key in ("class_psi", "source_psi"):
        if drift.get(key) is not None:
            metrics[f"drift.{key}"] = float(drift[key])
    return metrics


def night_tags(version_id: str, registration: dict[str, Any] | None) -> dict[str, str]:
    """The dataset version, and the promotion's decision and reasons."""
    tags = {"ballast.dataset_version": version_id}
    if registration is not None:
        version = f"{registration['name']} v{registration['version']}"
        tags[DECISION_TAG] = f"{version}: {registration['alias'] or 'not promoted'}"
        tags[REASON_TAG] = "; ".join(registration.get("reasons") or [])[:5000]
    return tags


def close_night(
    config: TrackingConfig,
    run_id: str,
    metrics: dict[str, float],
    tags: dict[str, str],
    summary: dict[str, Any],
) -> str:
    """Log the night's summary and close its run FINISHED (`description` as its note);
    what the server cannot take is kept in the run's spool. The run's id on the server
    (a `local-...` id while it is not there)."""
    summary_text = redact(json.dumps(summary, indent=1, default=str))  # URIs may hold passwords
    spool = Spool.of_run(config, run_id)

    def keep(kept: Spool) -> None:
        kept.append_metrics("night", [Metric(k, v, now_ms(), 0) for k, v in metrics.items()])
        kept.add_tags(tags)
        kept.add_artifact_text(SUMMARY_ARTIFACT, summary_text)
        kept.record_finish({}, None, None)

    if spool.exists():  # created or kept while the server was down: sent in order
        keep(spool)
        return deliver(spool, config) or run_id
    send = _sender(run_id, metrics, tags, summary_text)
    send_or_keep(config, run_id, "the night's summary", send, keep, config.delivery_wait_s)
    return run_id


def _sender(run_id: str, metrics: dict[str, float], tags: dict[str, str], text: str) -> Any:
    def send(client: MlflowClient) -> None:
        stamp = now_ms()
        client.log_batch(
            run_id,
            metrics=[Metric(key, value, stamp, 0) for key, value in metrics.items()],
            tags=[RunTag(key, value) for key, value in tags.items()],
        )
        client.log_text(run_id, text, SUMMARY_ARTIFACT)
        client.set_terminated(run_id, status="FINISHED")

    return send


def describe_night(tags: dict[str, str], lines: list[str]) -> dict[str, str]:
    """`tags` with `lines` as the run page's Description."""
    return tags | {NOTE_TAG: "\n".join(lines)[:MAX_NOTE_CHARS]}
