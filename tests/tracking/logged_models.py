"""Models logged to a local MLflow store, one run each, for registry tests: registration
reuses a run's own version, so each version a test wants comes from its own run."""

from __future__ import annotations

import mlflow


def log_models(tracking_uri: str, count: int) -> list[str]:
    """The model URIs of `count` trivial pyfunc models, each logged in a run of its own."""
    mlflow.set_tracking_uri(tracking_uri)
    # this store's own experiment: one set by an earlier test names another store's id
    mlflow.set_experiment("registry-tests")
    uris = []
    for _ in range(count):
        with mlflow.start_run():
            uris.append(mlflow.pyfunc.log_model(
                name="model", python_model=mlflow.pyfunc.PythonModel()).model_uri)
    return uris
