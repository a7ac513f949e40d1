"""`rollback_model` on a local MLflow store: refusals, an explicit target, idempotence."""

from __future__ import annotations

import pytest
from mlflow.tracking import MlflowClient

from tests.tracking.logged_models import log_models
from tracking.config import TrackingConfig
from tracking.lifecycle.registry import register_and_promote
from tracking.lifecycle.rollback import ROLLED_BACK_TAG, RollbackRefused, rollback_model

# MLflow's log_model starts subprocesses (its module capture, git).
pytestmark = pytest.mark.slow


def test_rollback_refuses_what_does_not_exist_and_moves_once(tmp_path) -> None:
    """Invariants: an unknown model, an unknown version, and a champion that replaced no
    recorded one (no --to) are refused with the reason; `--to 1` moves the alias and tags
    why on the version rolled back from; the same call again changes nothing."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    models = log_models(uri, 2)
    config = TrackingConfig(tracking_uri=uri)
    register_and_promote(config, models[0], "m", 0.5)
    assert register_and_promote(config, models[1], "m", 0.7)["alias"] == "champion"
    with pytest.raises(RollbackRefused, match="does not exist"):
        rollback_model(uri, "nope")
    with pytest.raises(RollbackRefused, match="no version 9"):
        rollback_model(uri, "m", to=9)
    with pytest.raises(RollbackRefused, match="give --to"):
        rollback_model(uri, "m")
    assert "from v2 back to v1" in rollback_model(uri, "m", to=1, reason="bad night")
    client = MlflowClient(uri)
    assert int(client.get_model_version_by_alias("m", "champion").version) == 1
    assert "bad night" in client.get_model_version("m", "2").tags[ROLLED_BACK_TAG]
    assert "nothing to do" in rollback_model(uri, "m", to=1)
    assert "nothing to do" in rollback_model(uri, "m")
    assert int(client.get_model_version_by_alias("m", "champion").version) == 1
