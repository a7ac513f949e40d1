"""An arm's held-out figures on its MLflow run: `holdout_*` metrics next to training's
`val_*`, with the class-prior baseline on the same rows, each class's recall
(`holdout_recall/<label>`, keyed as `val_recall/` is: preprocessing/contract/names.py),
and the run's description (which flow run and arm, which rows the figures are of). The
run is closed by then. The champion scored on a night's rows gets a run of its own with
the same metric names (`log_scoring_run`)."""

from __future__ import annotations

from typing import Any

from mlflow.tracking import MlflowClient

from preprocessing.contract.names import mlflow_key
from tracking.config import TrackingConfig
from tracking.run.origin import code_tags
from tracking.run.runs import create_run, finish_run
from tracking.run.spool import is_local_run

NOTE_TAG = "mlflow.note.content"  # the run page's Description
MAX_NOTE_CHARS = 6000


def holdout_metrics(evaluation: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """A model's held-out figures and the class-prior baseline's on the same rows, as the
    metrics of its run (`holdout_...`, next to training's `val_...`), each name after
    `prefix` (a night's run: `<arm>/`)."""
    baseline = evaluation["class_prior_baseline"]
    metrics = {
        "holdout_macro_f1": evaluation["macro_f1"],
        "holdout_balanced_accuracy": evaluation["balanced_accuracy"],
        "holdout_class_prior_macro_f1": baseline["macro_f1"],
        "holdout_class_prior_balanced_accuracy": baseline["balanced_accuracy"],
        "holdout_rows": evaluation["num_rows"],
    }
    recalls = {label: value for label, value in evaluation["recall"].items() if value is not None}
    if recalls:
        metrics["holdout_worst_class_recall"] = min(recalls.values())
    named = {f"{prefix}{name}": float(value) for name, value in metrics.items()}
    for label, value in recalls.items():
        named[mlflow_key(label, f"{prefix}holdout_recall/")] = float(value)
    return named


def log_holdout(config: TrackingConfig, run_id: str, evaluation: dict[str, Any]) -> None:
    """Log `holdout_metrics` to the (closed) run, through a delivery that keeps what a
    down server cannot take in the run's spool."""
    from tracking.run.delivery import MetricDelivery

    delivery = MetricDelivery(config, run_id, writer="holdout")
    delivery.add(holdout_metrics(evaluation), 0)
    delivery.close()


def describe_run(config: TrackingConfig, run_id: str, text: str) -> None:
    """`text` as the run's description (its page's Description); a run not on the server
    yet (in its spool) keeps none."""
    if not is_local_run(run_id):
        MlflowClient(config.tracking_uri).set_tag(run_id, NOTE_TAG, text[:MAX_NOTE_CHARS])


def log_scoring_run(
    config: TrackingConfig, run_name: str, evaluation: dict[str, Any], tags: dict[str, str]
) -> str:
    """A finished run of its own (a child of `config.parent_run_id`) holding a scoring's
    `holdout_metrics`, e.g. the champion on a night's held-out rows; its id."""
    run_config = config.model_copy(update={"run_name": run_name, "run_id": None})
    run_id = create_run(run_config, {**code_tags(), **tags})
    log_holdout(run_config, run_id, evaluation)
    return finish_run(run_config, run_id, {})
