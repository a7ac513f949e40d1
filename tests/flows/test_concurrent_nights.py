"""Two nights at once share nothing mutable: two `ballast run pipeline` commands started
together on one work dir, one Prefect server and one MLflow server, with different
settings (`train.max_epochs` 1 and 2). Before, both read one
`<work>/training/train-config.pinned.yaml` and one checkpoint folder: the last writer's
config ran for both while their MLflow runs recorded their own settings, and the registry
and the runs' summaries disagreed. Now, for each run: its params are read from the file its
ranks ran (one sha256 in the file, the run's tag and the summary), it trained the epochs
it was set to, and its registered version holds its own weights; the versions are
distinct and the registry agrees with every summary (tests/flows/concurrent_nights.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.flows.concurrent_nights import nights_at_once


@pytest.mark.slow
def test_two_nights_at_once_each_record_their_own_lineage(
    tiny_raw: Path, mlflow_uri: str, prefect_database: Path, tmp_path: Path
) -> None:
    """Invariant: see the module; both complete (or one exits 3 naming the conflict)."""
    settings = [["train.max_epochs=1"], ["train.max_epochs=2"]]
    services = (prefect_database, tiny_raw, mlflow_uri)
    nights_at_once(tmp_path, services, "two-nights", settings, timeout_s=900)
