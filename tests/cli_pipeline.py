"""One `ballast run pipeline` as a new user runs it, read by two tests: a command of its own
with a temporary Prefect server and a fresh Prefect home, both arms, a tracking URI that
holds a password (a real `mlflow server`) and Dask options that hold a token.

The console test (tests/flows/test_console.py) reads what it printed, its log file and its
result file; the secrets test (tests/test_secrets.py) searches every file it left and
everything it printed for the credentials. They ran the same pipeline command apart, each
paying a command's start-up (imports, a Prefect server, a Dask cluster, torchrun); the
session fixture `cli_pipeline_run` (tests/conftest.py) runs it once for both."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.services import mlflow_server, seed_prefect_database

PASSWORD = f"pw-{uuid.uuid4().hex}"
TOKEN = f"tok-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class CliRun:
    """What the run left: `root` holds all of it (the user's config under `given/`)."""

    root: Path
    config: Path
    run: subprocess.CompletedProcess[str]
    result: dict[str, Any]
    parameters: list[dict[str, Any]]


def pipeline_config(raw: Path, work: Path, tracking_uri: str) -> dict[str, object]:
    return {
        "reshard": {
            "dataset": {"inputs": [str(raw)]},
            "output_root": str(work / "data"),
            "target_shard_rows": 600,
        },
        "dask": {
            "kind": "local",
            "num_workers": 1,
            "options": {"env": {"BALLAST_API_TOKEN": TOKEN}},
        },
        "train": {
            "dataset": str(work / "data"),
            "output_dir": str(work / "job"),
            "max_epochs": 1,
            "loader": {"batch_size": 64},
            "tracking": {
                "tracking_uri": tracking_uri,
                "experiment": "cli-pipeline",
                "registered_model_name": "cli-pipeline",
                "spool_dir": str(work / "spool"),
            },
        },
        "job": {"kind": "local", "num_processes_per_node": 1, "timeout_s": 900},
        "compare_with_natural_mix": True,
    }


def recorded_parameters(prefect_home: Path) -> list[dict[str, Any]]:
    """The parameters of every flow run as the temporary server's database (in the Prefect
    home) holds them: what its API served while it ran."""
    database = f"file:{prefect_home / 'prefect.db'}?mode=ro"
    with contextlib.closing(sqlite3.connect(database, uri=True)) as db:
        return [json.loads(row[0]) for row in db.execute("SELECT parameters FROM flow_run")]


def command_env(root: Path, database: Path) -> dict[str, str]:
    """A new user's environment: no Prefect API URL (a temporary server is started), a
    Prefect home of its own (its database a copy of the suite's migrated one: the
    migrations of a first start are no part of what the readers check), the log files
    under `root`; a loaded machine starts it slowly."""
    home = root / "prefect-home"
    env = {
        **os.environ,
        **seed_prefect_database(database, home / "prefect.db"),
        "BALLAST_LOG_DIR": str(root / "logs"),
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    }
    env.pop("PREFECT_API_URL", None)
    return env


def run_cli_pipeline(raw: Path, root: Path, database: Path) -> CliRun:
    """Run the pipeline command once under a real `mlflow server` (stopped after), its
    temporary Prefect server on a copy of the migrated `database` (tests/services.py)."""
    given, mlflow_dir = root / "given", root / "mlflow"
    given.mkdir(parents=True)
    mlflow_dir.mkdir()
    config = given / "pipeline.yaml"
    with mlflow_server(mlflow_dir) as mlflow_uri:
        tracking_uri = mlflow_uri.replace("http://", f"http://ada:{PASSWORD}@")
        config.write_text(yaml.safe_dump(pipeline_config(raw, root / "work", tracking_uri)))
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "flows",
                "run",
                "pipeline",
                "--config",
                str(config),
                "--result-file",
                str(root / "result.json"),
            ],
            env=command_env(root, database),
            capture_output=True,
            text=True,
            timeout=1200,
        )
    assert run.returncode == 0, run.stderr[-4000:]
    return CliRun(
        root,
        config,
        run,
        json.loads((root / "result.json").read_text()),
        recorded_parameters(root / "prefect-home"),
    )
