"""Several `ballast run pipeline` commands started at once on one work dir, one Prefect
server and one MLflow server (a person reruns a failed night while the schedule fires,
or two ad-hoc runs with other settings), and the checks that each night's record is its
own: used by tests/flows/test_concurrent_nights.py (two nights, slow tier) and
tests/nightly/test_five_nights.py (five, the nightly tier)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from mlflow.tracking import MlflowClient

from tests.services import free_port, prefect_env, start_prefect_server, stop_server
from tracking.run.job_config import CONFIG_SHA256_TAG
from tracking.run.model import WEIGHTS_TAG
from training.launch.job import PINNED_CONFIG_NAME

CONFLICT = 3  # the exit status of a run that lost a race and says so in one line


def night_config(work: Path, mlflow_uri: str, model_name: str) -> Path:
    """A small pipeline config (the demo's shape: the tiny sample under `${WORK_DIR}/raw`,
    one training process, no natural-mix arm) tracking into `mlflow_uri`."""
    config = {
        "reshard": {
            "dataset": {
                "inputs": ["${WORK_DIR}/raw"],
                "label_column": "label",
                "source_column": "source",
                "id_column": "id",
                "feature_columns": ["features"],
            },
            "output_root": "${WORK_DIR}/datasets",
            "target_shard_rows": 600,
            "num_workers": 1,
        },
        "train": {
            "dataset": "${WORK_DIR}/datasets",
            "output_dir": "${WORK_DIR}/training",
            "max_epochs": 1,
            "loader": {"batch_size": 64},
            "model": {"hidden_sizes": [16]},
            "tracking": {
                "tracking_uri": mlflow_uri,
                "experiment": f"nights-{model_name}",
                "registered_model_name": model_name,
            },
        },
        "job": {"kind": "local", "num_processes_per_node": 1, "timeout_s": 900},
    }
    path = work / "night.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class Night:
    """One command's settings, exit status, console, result (None: it wrote none) and
    wall time from the start of all; `describe` says it in one line."""

    settings: list[str]
    returncode: int
    stderr: str
    result: dict[str, Any] | None
    wall_s: float

    def describe(self) -> str:
        registration = (self.result or {}).get("registration") or {}
        training = (self.result or {}).get("training") or {}
        return (
            f"{' '.join(self.settings) or 'as configured'}: exit {self.returncode} at "
            f"{self.wall_s:.0f} s, {training.get('epochs')} epochs, "
            f"{training.get('batches_per_rank')} batches, v{registration.get('version')} "
            f"{registration.get('alias')} "
            f"(champion before: v{registration.get('previous_champion')})"
        )


def run_nights(
    env: dict[str, str], config: Path, work: Path, settings: list[list[str]], timeout_s: float
) -> list[Night]:
    """Start one `ballast run pipeline` per entry of `settings` (its `--set` values) at
    once; wait for all; each one's outcome."""
    started, processes = time.monotonic(), []
    for index, sets in enumerate(settings):
        command = [sys.executable, "-m", "flows", "run", "pipeline", "--config", str(config)]
        command += ["--work-dir", str(work), "--result-file", str(work / f"result-{index}.json")]
        command += [arg for value in sets for arg in ("--set", value)]
        log = (work / f"night-{index}.err").open("wb")
        processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=log))
    ended: dict[int, float] = {}  # each command's own wall time, as it ends
    while len(ended) < len(processes) and time.monotonic() - started < timeout_s:
        for index, process in enumerate(processes):
            if index not in ended and process.poll() is not None:
                ended[index] = time.monotonic() - started
        time.sleep(0.5)
    nights = []
    for index, (sets, process) in enumerate(zip(settings, processes, strict=True)):
        returncode = process.wait(timeout=1.0)  # raises past the time limit: a hung night
        result_file = work / f"result-{index}.json"
        result = json.loads(result_file.read_text()) if result_file.exists() else None
        stderr = (work / f"night-{index}.err").read_text(errors="replace")
        nights.append(Night(sets, returncode, stderr, result, ended[index]))
    return nights


def check_nights(nights: list[Night], mlflow_uri: str, model_name: str) -> None:
    """Every night completed (or exited 3 naming the conflict in its last line); each
    completed night's MLflow params, pinned config, trained epochs and steps, and
    registered weights belong together; versions are distinct; the registry agrees with
    every summary (see `check_registry`)."""
    client = MlflowClient(mlflow_uri)
    done = []
    for night in nights:
        if night.returncode == CONFLICT:
            assert "conflict" in night.stderr.lower() or "lease" in night.stderr, night.stderr
            continue
        assert night.returncode == 0 and night.result is not None, night.stderr[-3000:]
        check_lineage(client, night)
        done.append(night.result)
    assert done, "no night completed"
    assert len({r["run_id"] for r in done}) == len(done), "two nights share an MLflow run"
    versions = [r["registration"]["version"] for r in done]
    assert len(set(versions)) == len(versions), f"two nights own one version: {versions}"
    check_registry(client, model_name, done)


def check_lineage(client: MlflowClient, night: Night) -> None:
    """The run's params are its own settings, read from the file its ranks ran (the file's
    sha256 is the run's tag and the summary's); it trained the epochs it was set to; its
    registered version is its run's model, byte for byte."""
    result = night.result
    assert result is not None
    training = result["training"]
    epochs = int(dict(s.split("=", 1) for s in night.settings).get("train.max_epochs", 1))
    run = client.get_run(result["run_id"])
    pinned = Path(training["output_dir"]) / PINNED_CONFIG_NAME
    assert pinned.exists(), f"no pinned config in the run's own folder {training['output_dir']}"
    sha256 = hashlib.sha256(pinned.read_bytes()).hexdigest()
    assert training["config_sha256"] == sha256 == run.data.tags[CONFIG_SHA256_TAG]
    assert run.data.params["train.max_epochs"] == str(epochs)
    assert yaml.safe_load(pinned.read_text())["max_epochs"] == epochs
    assert training["epochs"] == epochs
    steps = training["batches_per_rank"][0]
    assert steps % epochs == 0  # the same batches each epoch: steps = epochs x one epoch's
    per_epoch = steps // epochs
    assert all(b == steps for b in training["batches_per_rank"])
    night.result = result | {"batches_per_epoch": per_epoch}
    version = client.get_model_version(
        result["registration"]["name"], str(result["registration"]["version"])
    )
    assert version.run_id == result["run_id"], "the version is another run's model"
    logged = client.get_logged_model(training["model_uri"].removeprefix("models:/"))
    assert version.tags[WEIGHTS_TAG] == logged.tags[WEIGHTS_TAG]


def check_registry(client: MlflowClient, model_name: str, done: list[dict[str, Any]]) -> None:
    """The champion at the end is a version whose run said "champion"; `champion` and
    `challenger` name different versions; every run's alias was true when decided: a run
    that said "champion" was either the champion at the end or displaced by a later
    decision that named it as the previous champion (never twice)."""
    model = client.get_registered_model(model_name)
    aliases = dict(model.aliases)
    said = {r["registration"]["version"]: r["registration"] for r in done}
    champion = int(aliases["champion"]) if "champion" in aliases else None
    if champion is not None:
        assert said.get(champion, {}).get("alias") == "champion", (aliases, said)
    if "challenger" in aliases:
        assert aliases["challenger"] != aliases.get("champion"), aliases
    displaced = [r["previous_champion"] for r in said.values() if r["alias"] == "champion"]
    displaced = [v for v in displaced if v is not None]
    assert len(displaced) == len(set(displaced)), f"a champion displaced twice: {displaced}"
    for version, registration in said.items():
        if registration["alias"] == "champion" and version != champion:
            assert version in displaced, f"v{version} said champion, nobody displaced it"
    per_epoch = {r["manifest_uri"]: set() for r in done}
    for r in done:
        per_epoch[r["manifest_uri"]].add(r["batches_per_epoch"])
    assert all(len(lengths) == 1 for lengths in per_epoch.values()), per_epoch


@contextmanager
def night_env(root: Path, prefect_database: Path, tiny_raw: Path) -> Iterator[dict[str, str]]:
    """A real `prefect server` for the nights, a work dir holding the tiny sample as its
    raw files; the environment that points the commands at that server."""
    port = free_port()
    env = prefect_env(root / "prefect-home", port)
    shutil.copytree(tiny_raw, root / "work" / "raw")
    server = start_prefect_server(env, port, database=prefect_database)
    try:
        yield env
    finally:
        stop_server(server)


def nights_at_once(
    tmp_path: Path,
    services: tuple[Path, Path, str],
    model_name: str,
    settings: list[list[str]],
    timeout_s: float,
) -> list[Night]:
    """Start the nights of `settings` together (`services`: the migrated Prefect
    database, the tiny sample, the MLflow server's URI), print a line each, check them
    (`check_nights`); the nights. The work dir is `tmp_path / "work"`."""
    prefect_database, tiny_raw, mlflow_uri = services
    with night_env(tmp_path, prefect_database, tiny_raw) as env:
        work = tmp_path / "work"
        config = night_config(work, mlflow_uri, model_name)
        nights = run_nights(env, config, work, settings, timeout_s)
    for night in nights:
        print(night.describe())
    check_nights(nights, mlflow_uri, model_name)
    return nights
