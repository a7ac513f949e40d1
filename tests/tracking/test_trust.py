"""Before ballast loads a registered model it checks the version's run, its source and the
sha256 of its weights recorded when ballast logged it (tracking/lifecycle/trust.py), on a
local sqlite store: no server."""

from __future__ import annotations

import uuid
from pathlib import Path
from urllib.parse import urlparse

import mlflow
import pytest
import torch
from mlflow.tracking import MlflowClient

from preprocessing.contract.codec import FeatureCodec
from preprocessing.contract.manifest import read_manifest
from tests.training.conftest import write_dataset
from tracking.config import TrackingConfig
from tracking.lifecycle.registry import register_and_promote
from tracking.lifecycle.scoring import ModelError, load_classifier
from tracking.lifecycle.trust import ALLOW_UNVERIFIED_ENV, UntrustedModel
from tracking.run.model import FILES_TAG, WEIGHTS_TAG, log_model
from tracking.run.pyfunc import CodecClassifier
from tracking.run.runs import create_run

pytestmark = pytest.mark.slow  # opening a run asks git for the code's commit


@pytest.fixture(scope="module")
def registered(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrackingConfig, str, str]:
    """(config, registered model name, its run's logged model URI): an untrained MLP
    logged and registered through ballast's own path on a fresh sqlite store."""
    root = tmp_path_factory.mktemp("trust")
    dataset = write_dataset(root / "data", 60, num_shards=2)
    config = TrackingConfig(
        tracking_uri=f"sqlite:///{root}/mlflow.db",
        artifact_location=str(root / "artifacts"),
        experiment="trust",
        registered_model_name=f"clf-{uuid.uuid4().hex[:6]}",
        system_metrics_interval_s=None,
    )
    manifest, _ = read_manifest(dataset)
    width = FeatureCodec.from_manifest(manifest).width
    network = torch.nn.Sequential(torch.nn.Linear(width, len(manifest.classes)))
    model_uri = log_model(config, create_run(config), network, dataset)
    name = str(config.registered_model_name)
    register_and_promote(config, model_uri, name, 0.7)
    return config, name, model_uri


def _weights_file(config: TrackingConfig, model_uri: str) -> Path:
    logged = MlflowClient(config.tracking_uri).get_logged_model(model_uri.split("/")[-1])
    return Path(urlparse(logged.artifact_location).path) / "artifacts" / "weights.pt"


def test_a_version_ballast_registered_loads_and_carries_its_weights_sha256(registered) -> None:
    """Invariant: registration records the weights' sha256 and the digest of all the
    model's files on the version, and the version loads through the check (run, source,
    checksums) as ballast's CodecClassifier."""
    config, name, _ = registered
    version = MlflowClient(config.tracking_uri).get_model_version(name, "1")
    assert len(version.tags[WEIGHTS_TAG]) == len(version.tags[FILES_TAG]) == 64
    load_classifier.cache_clear()
    model = load_classifier(f"models:/{name}@champion", config.tracking_uri)
    assert isinstance(model, CodecClassifier) and model.classes


def test_a_version_whose_source_is_another_runs_model_is_refused(registered) -> None:
    """Invariant: a version whose run is not the run that logged its source model is
    refused before loading, naming the version, the source and both runs."""
    config, name, model_uri = registered
    client = MlflowClient(config.tracking_uri)
    ours = client.get_model_version(name, "1")
    other_run = create_run(config)
    forged = client.create_model_version(
        name, model_uri, run_id=other_run, tags={WEIGHTS_TAG: ours.tags[WEIGHTS_TAG]}
    )
    load_classifier.cache_clear()
    with pytest.raises(UntrustedModel) as raised:
        load_classifier(f"models:/{name}/{forged.version}", config.tracking_uri)
    message = str(raised.value)
    assert f"model version {name}/{forged.version}" in message
    assert model_uri in message and ours.run_id in message and other_run in message


def test_weights_changed_in_the_artifact_store_are_refused(registered) -> None:
    """Invariant: once the weights file in the artifact store is overwritten, loading the
    version is UntrustedModel naming the version and the weights file, and nothing of
    the model is loaded; the original bytes load again."""
    config, name, model_uri = registered
    path = _weights_file(config, model_uri)
    original = path.read_bytes()
    network = torch.nn.Sequential(torch.nn.Linear(1, 1))
    tampered = {"layer_sizes": [1, 1], "state_dict": network.state_dict()}
    try:
        torch.save(tampered, path)
        load_classifier.cache_clear()
        with pytest.raises(UntrustedModel) as raised:
            load_classifier(f"models:/{name}/1", config.tracking_uri)
        message = str(raised.value)
        assert f"model version {name}/1" in message and "artifacts/weights.pt" in message
        assert "sha256" in message and "changed after logging" in message
    finally:
        path.write_bytes(original)
    load_classifier.cache_clear()
    assert load_classifier(f"models:/{name}/1", config.tracking_uri).classes


def test_code_changed_in_the_artifact_store_is_refused_before_it_runs(registered) -> None:
    """Invariant: a line added to the model's shipped code (code/tracking/run/pyfunc.py,
    which loading would import) makes loading UntrustedModel naming the version and its
    files, before the code runs (the added line would raise SystemExit)."""
    config, name, model_uri = registered
    path = _weights_file(config, model_uri).parents[1] / "code" / "tracking" / "run" / "pyfunc.py"
    original = path.read_bytes()
    try:
        path.write_bytes(original + b"\nraise SystemExit('ran the changed code')\n")
        load_classifier.cache_clear()
        with pytest.raises(UntrustedModel) as raised:
            load_classifier(f"models:/{name}/1", config.tracking_uri)
        message = str(raised.value)
        assert f"model version {name}/1" in message and "python_model.pkl" in message
    finally:
        path.write_bytes(original)


def test_a_version_without_ballasts_checksums_is_refused_unless_allowed(registered) -> None:
    """Invariant: a version of a model ballast did not log (no checksum tags) is refused,
    naming the version and the missing tag; only `BALLAST_ALLOW_UNVERIFIED_MODELS=1`
    lets ballast load it (here: a plain pyfunc, then refused as no CodecClassifier)."""
    config, name, _ = registered
    client = MlflowClient(config.tracking_uri)
    mlflow.set_tracking_uri(config.tracking_uri)
    with mlflow.start_run(experiment_id=client.get_experiment_by_name("trust").experiment_id):
        plain = mlflow.pyfunc.log_model(name="model", python_model=mlflow.pyfunc.PythonModel())
    version = client.create_model_version(
        name, plain.model_uri, run_id=plain.run_id, model_id=plain.model_id
    ).version
    load_classifier.cache_clear()
    with pytest.raises(
        UntrustedModel, match=f"model version {name}/{version} has no {WEIGHTS_TAG}"
    ):
        load_classifier(f"models:/{name}/{version}", config.tracking_uri)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(ALLOW_UNVERIFIED_ENV, "1")
        load_classifier.cache_clear()
        with pytest.raises(ModelError, match="not logged by ballast"):
            load_classifier(f"models:/{name}/{version}", config.tracking_uri)
