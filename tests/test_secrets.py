"""Secrets never written: a whole pipeline run whose tracking URI holds a password and whose
Dask options hold a token, under a temporary Prefect server and a real `mlflow server`
(the run tests/cli_pipeline.py makes once for this test and the console's); then every
file the run left (work dir, datasets, training output, the log file, the result file,
Prefect's home with its database and results, MLflow's database and artifacts) and
everything it printed is searched for both. Also the Kubernetes manifests a launcher
renders for such a job, the refusal of a credential in a job's plain environment where
it would be written, and one rule of what a credential is on the roads into MLflow's params
and Prefect's parameters (the manifest and the version id read the second)."""

from __future__ import annotations

import json
from itertools import count
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import run_reshard
from preprocessing.toolbox.secrets import DATA_KEYED, names_a_credential, redact_value
from tests.cli_pipeline import PASSWORD, TOKEN, CliRun
from tests.preprocessing.test_secrets import CREDENTIAL_NAMES, PLAIN_NAMES
from tracking.config import TrackingConfig
from tracking.run.runs import flatten
from training.config import TrainConfig
from training.launch import KubernetesJob, LocalJob, make_launcher, parse_launch
from training.launch.job import pin_job

# Config keys: credential names, names that only look like one, data-keyed maps, plain.
keys = st.one_of(
    st.sampled_from([*CREDENTIAL_NAMES, *PLAIN_NAMES, *DATA_KEYED]),
    st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
)
configs = st.recursive(
    st.dictionaries(keys, st.sampled_from(["text", 1, True, None]), max_size=4),
    lambda children: st.dictionaries(keys, children, max_size=4),
    max_leaves=12,
)


def files_holding(root: Path, secrets: list[str], skip: Path) -> list[str]:
    """Every file under `root` but `skip` whose bytes hold one of `secrets`."""
    needles = [secret.encode() for secret in secrets]
    return [
        str(path)
        for path in root.rglob("*")
        if path.is_file()
        and skip not in path.parents
        and any(n in path.read_bytes() for n in needles)
    ]


@pytest.mark.slow
def test_no_file_or_output_of_a_pipeline_run_holds_a_credential(cli_pipeline_run: CliRun) -> None:
    """Invariants: the run succeeds with the credentials in use (MLflow got its run); the
    flow run's parameters are recorded with `ada:***@` and the token as ***; no file under
    the run's directory but the user's own config, and no line printed, holds the password
    or the token (the search finds them in that config, so it can fail)."""
    done, given = cli_pipeline_run, cli_pipeline_run.config.parent
    assert done.result["run_id"] and done.result["training"]["model_uri"]
    recorded = yaml.safe_dump(done.parameters)
    assert "ada:***@127.0.0.1" in recorded and "BALLAST_API_TOKEN: '***'" in recorded
    assert files_holding(given, [PASSWORD, TOKEN], skip=done.root / "none") == [str(done.config)]
    assert files_holding(done.root, [PASSWORD, TOKEN], skip=given) == []
    printed = done.run.stdout + done.run.stderr
    assert PASSWORD not in printed and TOKEN not in printed


def test_a_credential_in_a_written_job_environment_is_refused() -> None:
    """Invariant: SLURM scripts and Kubernetes manifests are written, so a credential-named
    variable in `env` is refused naming it and where it belongs; a local job, whose
    environment is never written, may carry it."""
    for kind, fix in (("kubernetes", "secret_env"), ("slurm", "environment of sbatch")):
        with pytest.raises(ValidationError, match=rf"HF_TOKEN.*{fix}"):
            parse_launch({"kind": kind, "image": "ballast:test", "env": {"HF_TOKEN": TOKEN}})
    assert LocalJob(kind="local", env={"HF_TOKEN": TOKEN}).env == {"HF_TOKEN": TOKEN}


@pytest.mark.slow
def test_kubernetes_manifests_of_a_job_hold_no_tracking_password(
    tiny_raw, tmp_path, dask_client
) -> None:
    """Invariants: pinning a Kubernetes job whose tracking URI holds a password moves the
    password into the environment its pods get from the Secret; the ConfigMap and the
    PyTorchJob rendered from the pinned config, and every file written, hold no password
    but still the server's address."""
    result = run_reshard(
        ReshardConfig(
            dataset=DatasetSpec(inputs=[str(tiny_raw)]),
            output_root=str(tmp_path / "data"),
            target_shard_rows=600,
        ),
        dask_client,
    )
    tracking = TrackingConfig(
        tracking_uri=f"http://ada:{PASSWORD}@mlflow.internal:5000", run_id="0123456789abcdef"
    )  # a run made before: no server
    job = KubernetesJob(kind="kubernetes", image="ballast:test", secret_env="mlflow-login")
    pinned = pin_job(
        TrainConfig(
            dataset=result.manifest_uri, output_dir=str(tmp_path / "job"), tracking=tracking
        ),
        job,
    )
    assert pinned.secret_env == {
        "MLFLOW_TRACKING_USERNAME": "ada",
        "MLFLOW_TRACKING_PASSWORD": PASSWORD,
    }
    rendered = make_launcher(job).render(pinned.config_uri)
    assert PASSWORD not in rendered and "http://mlflow.internal:5000" in rendered
    assert "mlflow-login" in rendered
    assert files_holding(tmp_path, [PASSWORD], skip=tmp_path / "none") == []


def marked(
    config: dict[str, Any], marks: count, hidden: bool = False, keys_are_data: bool = False
) -> tuple[dict[str, Any], dict[str, bool]]:
    """`config` with each text and number leaf made unique (`val-0007`, 7000007), and for
    each such leaf whether the one rule must hide it: a credential-named key above it, the
    keys of a data-keyed map (`nulls`: column -> policy) never counting as one."""
    out: dict[str, Any] = {}
    secret_of: dict[str, bool] = {}
    for key, value in config.items():
        hide = hidden or (not keys_are_data and names_a_credential(key))
        if isinstance(value, dict):
            out[key], below = marked(value, marks, hide, key in DATA_KEYED)
            secret_of.update(below)
        elif value in ("text", 1) and not isinstance(value, bool):
            n = next(marks)
            out[key] = f"val-{n:04d}" if value == "text" else 7_000_000 + n
            secret_of[str(out[key])] = hide
        else:
            out[key] = value
    return out, secret_of


@settings(max_examples=200, deadline=None)
@given(config=configs)
def test_mlflow_params_and_prefect_parameters_hide_the_same_settings(config: dict) -> None:
    """Invariant: whatever a config's keys are called, a text or number under a credential-
    named key (at any depth) reaches neither MLflow's params (`flatten`) nor Prefect's
    parameters and the manifest (`redact_value`), and every other one reaches both as it
    was: one rule on every road, so MLflow never hides what Prefect shows (a setting
    `max_tokens` was *** in MLflow and shown by Prefect; a `credentials: {user: ...}` the
    reverse)."""
    values, secret_of = marked(config, count())
    roads = {
        "MLflow": json.dumps(flatten(values), ensure_ascii=False),
        "Prefect": json.dumps(redact_value(values), ensure_ascii=False),
    }
    for mark, secret in secret_of.items():
        for road, text in roads.items():
            assert (mark in text) is not secret, f"{road}: {mark} hidden={secret}: {text}"
