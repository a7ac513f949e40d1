"""`ballast rollback`: the champion alias (tracking/lifecycle/rollback.py) or a dataset's `_CURRENT`
(preprocessing/versions/rollback.py) moved back; what was done, as one line."""

from __future__ import annotations


def rollback(
    model: str | None, dataset: str | None, to: str | None, tracking_uri: str | None, reason: str
) -> str:
    """Exactly one of `model` and `dataset`; `to` is required with `dataset`."""
    if dataset is not None:
        if not to:
            raise ValueError(
                "ballast rollback --dataset needs --to VERSION_ID (the version "
                "`_CURRENT` moves back to)"
            )
        from preprocessing.versions.rollback import rollback_dataset

        return rollback_dataset(dataset, to)
    if not tracking_uri:
        raise ValueError("ballast rollback --model needs --tracking-uri (or $MLFLOW_TRACKING_URI)")
    if to is not None and not to.isdigit():
        raise ValueError(f"--to {to!r}: a model version is a number")
    from tracking.lifecycle.rollback import rollback_model

    return rollback_model(tracking_uri, str(model), int(to) if to else None, reason)
