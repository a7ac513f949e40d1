"""The champion lookup: which version of a registered model holds the `champion` alias,
and the held-out score it was registered with (`SCORE_TAG`).

Promotion, rollback, the pipeline's same-rows scoring and `ballast status` all ask here.
"""

from __future__ import annotations

from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from preprocessing.toolbox.secrets import redact
from tracking.server import TrackingUnavailable

SCORE_TAG = "ballast.heldout_macro_f1"  # a registered version's macro-F1 on held-out rows
LEGACY_SCORE_TAG = "ballast.val_macro_f1"  # its former name: older champions still compare


def champion(tracking_uri: str, name: str) -> dict[str, Any] | None:
    """The `champion` version of registered model `name` (version, score, run id), or None
    when there is none; `TrackingUnavailable` when the store cannot say."""
    try:
        version = MlflowClient(tracking_uri).get_model_version_by_alias(name, "champion")
    except MlflowException as error:
        if error.get_http_status_code() < 500:  # no such model or alias
            return None
        raise TrackingUnavailable(
            f"MLflow at {redact(tracking_uri)}: {redact(str(error))[:300]}"
        ) from error
    score = version.tags.get(SCORE_TAG, version.tags.get(LEGACY_SCORE_TAG))
    return {
        "version": int(version.version),
        "run_id": version.run_id,
        "score": float(score) if score is not None else None,
    }
