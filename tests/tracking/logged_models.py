"""Models logged to a local MLflow store, one run each, for registry tests: registration
reuses a run's own version, so each version a test wants comes from its own run."""

from __future__ import annotations

import mlflow
from mlflow.tracking import MlflowClient


def log_models(tracking_uri: str, count: int) -> list[str]:
    """The model URIs of `count` trivial pyfunc models, each logged in a run of its own."""
    mlflow.set_tracking_uri(tracking_uri)
    # this store's own experiment, named explicitly: the active one may be another store's
    experiment_id = MlflowClient(tracking_uri).create_experiment("registry-tests")
    uris = []
    for _ in range(count):
        with mlflow.start_run(experiment_id=experiment_id):
            uris.append(
                mlflow.pyfunc.log_model(
                    name="model", python_model=mlflow.pyfunc.PythonModel()
                ).model_uri
            )
    return uris
