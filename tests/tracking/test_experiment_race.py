"""Two runs started together may both find no experiment of their name: the one whose
create comes second uses the one the other made, instead of failing the night."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tracking.config import TrackingConfig
from tracking.run import runs


def test_a_run_that_loses_the_race_to_create_its_experiment_uses_the_winners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: when the experiment appears between a run's lookup and its create (the
    lookup replayed as stale, on a real sqlite store), `prepare_backend` returns the
    existing experiment's id and no error."""
    config = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", experiment="race")
    winner = runs.prepare_backend(config)
    lookup, seen = MlflowClient.get_experiment_by_name, []

    def stale_once(client: MlflowClient, name: str):  # type: ignore[no-untyped-def]
        seen.append(name)
        return None if len(seen) == 1 else lookup(client, name)

    monkeypatch.setattr(MlflowClient, "get_experiment_by_name", stale_once)
    assert runs.prepare_backend(config) == winner
    assert seen == ["race", "race"]
