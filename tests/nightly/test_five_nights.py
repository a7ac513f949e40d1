"""Load held: five `ballast run pipeline` at once on one Prefect server, one MLflow server
and one output root (three with one config, two with others: `train.max_epochs` 2, and
`train.seed` 1). Each completes or exits 3 with one line naming the conflict; nothing is
lost (every committed version verifies); each run's params, pinned config, trained
epochs and registered weights belong together; the registry and every run's summary
agree: the champion at the end is one whose run said "champion" and nobody displaced,
no champion is displaced twice, `champion` and `challenger` never name one version
(tests/flows/concurrent_nights.py). The nightly tier: `make nightly` (BALLAST_NIGHTLY=1),
never in `make test`. Prints each night's wall time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.flows.concurrent_nights import nights_at_once

pytestmark = [pytest.mark.slow, pytest.mark.nightly]
SETTINGS = [[], [], [], ["train.max_epochs=2"], ["train.seed=1"]]


def test_five_nights_at_once_keep_the_registry_true(
    tiny_raw: Path, mlflow_uri: str, prefect_database: Path, tmp_path: Path
) -> None:
    """Invariant: see the module."""
    services = (prefect_database, tiny_raw, mlflow_uri)
    nights_at_once(tmp_path, services, "five-nights", SETTINGS, timeout_s=3000)
    root = tmp_path / "work" / "datasets"
    versions = [path.name.removeprefix("v-") for path in root.glob("v-*")]
    assert versions
    for version in versions:
        command = [sys.executable, "-m", "flows", "verify", str(root), "--version", version]
        verified = subprocess.run(command, capture_output=True, text=True)
        assert verified.returncode == 0, verified.stdout + verified.stderr
