"""Secrets never written: a whole pipeline run whose tracking URI holds a password and whose
Dask options hold a token, under a temporary Prefect server and a real `mlflow server`
(the run tests/cli_pipeline.py makes once for this test and the console's); then every
file the run left (work dir, datasets, training output, the log file, the result file,
Prefect's home with its database and results, MLflow's database and artifacts) and
everything it printed is searched for both. Also the Kubernetes manifests a launcher
renders for such a job, and the refusal of a credential in a job's plain environment where
it would be written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import run_reshard
from tests.cli_pipeline import PASSWORD, TOKEN, CliRun
from tracking.config import TrackingConfig
from training.config import TrainConfig
from training.launch import KubernetesJob, LocalJob, make_launcher, parse_launch
from training.launch.job import pin_job


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
