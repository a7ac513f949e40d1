"""What ballast checks before it loads a model from the registry (docs/reliability.md,
"Trust boundary").

Loading a pyfunc unpickles its Python model and imports its `code/`: whoever can write
the bytes it loads can run code in the loading process. Before ballast loads a model
version (`models:/<name>/<version>`, `models:/<name>@<alias>`) or a logged model
(`models:/m-...`), it checks, in the tracking database and before any unpickling:
- the version has a run and that run exists;
- the version's source is that run's: a logged model whose source run it is, or a path
  under the run's artifacts;
- the weights file the model's MLmodel names, downloaded, has the sha256 recorded when
  ballast logged it (tracking.run.model.WEIGHTS_TAG, copied onto the version at
  registration), and all the model's files (MLmodel, python_model.pkl, code/, the codec)
  have the digest recorded then (FILES_TAG).
The model is then loaded from that same verified download, so the bytes checked are the
bytes loaded. A disagreement is `UntrustedModel` (permanent) naming the version and what
disagreed. A version without the recorded checksums (registered by another tool, or by a
ballast before it recorded them) is refused too, unless `BALLAST_ALLOW_UNVERIFIED_MODELS=1`
is set in the environment of the loading processes: an unchecked load must be asked for.
Other URIs (`runs:/`, a local path such as a run's spool) are loaded as given.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException
from mlflow.models import Model
from mlflow.tracking import MlflowClient

from preprocessing.toolbox.faults import PermanentError
from tracking.run.model import FILES_TAG, WEIGHTS_TAG, file_digests, files_sha256
from tracking.run.pyfunc import NETWORK_ARTIFACT, WEIGHTS_ARTIFACT

ALLOW_UNVERIFIED_ENV = "BALLAST_ALLOW_UNVERIFIED_MODELS"
_log = logging.getLogger(__name__)


class UntrustedModel(PermanentError):
    """A registered model whose run, source or weights disagree with what ballast recorded
    when it logged and registered it, or one with no such record: not loaded."""


@dataclass(frozen=True)
class Provenance:
    """What the tracking database says a model is: its name for messages, its run, the
    URI of its artifacts and the checksum tags recorded when ballast logged it."""

    label: str
    run_id: str
    source: str
    checksums: dict[str, str]


def load_verified(client: MlflowClient, model_uri: str) -> Any:
    """The pyfunc of `model_uri` (mlflow.pyfunc.load_model), verified first as the module
    docstring says; `UntrustedModel` when it does not pass."""
    record = provenance(client, model_uri)
    if record is None:
        return mlflow.pyfunc.load_model(model_uri)
    missing = [tag for tag in (WEIGHTS_TAG, FILES_TAG) if tag not in record.checksums]
    if missing:
        if os.environ.get(ALLOW_UNVERIFIED_ENV) != "1":
            raise UntrustedModel(
                f"{record.label} has no {' or '.join(missing)} tag (not registered by "
                "ballast, or before ballast recorded one): its files cannot be checked; "
                f"register it again with ballast, or set {ALLOW_UNVERIFIED_ENV}=1 to load "
                "it unverified"
            )
        _log.warning("loading %s unverified (%s=1)", record.label, ALLOW_UNVERIFIED_ENV)
        return mlflow.pyfunc.load_model(record.source)
    with tempfile.TemporaryDirectory(prefix="ballast-model-") as work:
        local = mlflow.artifacts.download_artifacts(artifact_uri=record.source, dst_path=work)
        digests = file_digests(Path(local))  # each file read once, the weights included
        check_weights(Path(local), record, digests)
        check_files(record, digests)
        return mlflow.pyfunc.load_model(local)


def provenance(client: MlflowClient, model_uri: str) -> Provenance | None:
    """The checked provenance of a registry or logged-model URI; None for other URIs."""
    if not model_uri.startswith("models:/"):
        return None
    reference = model_uri.removeprefix("models:/")
    if reference.startswith("m-") and "/" not in reference:
        logged = client.get_logged_model(reference)
        label = f"logged model {reference}"
        _existing_run(client, logged.source_run_id, label)
        return Provenance(label, str(logged.source_run_id), model_uri, _checksums(logged.tags))
    version = model_version(client, reference)
    label = f"model version {version.name}/{version.version}"
    recorded = {**_check_source(client, version, label), **_checksums(version.tags)}
    return Provenance(label, str(version.run_id), str(version.source), recorded)


def _checksums(tags: dict[str, str]) -> dict[str, str]:
    return {tag: tags[tag] for tag in (WEIGHTS_TAG, FILES_TAG) if tag in tags}


def model_version(client: MlflowClient, reference: str) -> ModelVersion:
    """The version `<name>@<alias>`, `<name>/<version>` or `<name>/<stage or latest>` is."""
    if "@" in reference:
        name, alias = reference.rsplit("@", 1)
        return client.get_model_version_by_alias(name, alias)
    name, _, ref = reference.rpartition("/")
    if ref.isdigit():
        return client.get_model_version(name, ref)
    latest = client.get_latest_versions(name, None if ref.lower() == "latest" else [ref])
    if not latest:
        raise UntrustedModel(f"registered model {name} has no version at {ref!r}")
    return max(latest, key=lambda version: int(version.version))


def _check_source(client: MlflowClient, version: ModelVersion, label: str) -> dict[str, str]:
    """The version's run exists and its source is that run's logged model or artifacts;
    returns the checksums recorded on that logged model (for a version created by another
    tool from a model ballast logged)."""
    if not version.run_id:
        raise UntrustedModel(f"{label} has no run: where its model came from is unknown")
    run = _existing_run(client, version.run_id, label)
    source = str(version.source)
    reference = source.removeprefix("models:/")
    if source.startswith("models:/m-") and "/" not in reference:
        logged = client.get_logged_model(reference)
        if logged.source_run_id != version.run_id:
            raise UntrustedModel(
                f"{label}: its source {source} was logged by run {logged.source_run_id}, "
                f"not by the version's run {version.run_id}"
            )
        return _checksums(logged.tags)
    inside = (f"runs:/{version.run_id}/", run.info.artifact_uri.rstrip("/") + "/")
    if not source.startswith(inside):
        raise UntrustedModel(
            f"{label}: its source {source} is not among the artifacts of its run "
            f"{version.run_id} ({run.info.artifact_uri})"
        )
    return {}


def _existing_run(client: MlflowClient, run_id: str | None, label: str) -> Any:
    """The run `run_id`; `UntrustedModel` when the store has no such run."""
    try:
        return client.get_run(str(run_id))
    except MlflowException as error:
        if error.get_http_status_code() >= 500:
            raise  # the store cannot say: transient, not a verdict
        raise UntrustedModel(f"{label}: its run {run_id} does not exist") from error


def check_weights(local: Path, record: Provenance, digests: dict[str, str]) -> None:
    """The weights file that the downloaded model's MLmodel names has the recorded sha256
    (`digests`: the download's `file_digests`)."""
    flavor = Model.load(str(local)).flavors.get("python_function", {})
    artifacts = flavor.get("artifacts", {})
    entry = artifacts.get(WEIGHTS_ARTIFACT) or artifacts.get(NETWORK_ARTIFACT)
    path = (local / entry["path"]).resolve() if entry else None
    if path is None or not path.is_relative_to(local.resolve()) or not path.is_file():
        raise UntrustedModel(f"{record.label}: its MLmodel names no weights file in the model")
    found = digests.get(path.relative_to(local.resolve()).as_posix())
    if found is None:  # a link inside the model to another of its files
        raise UntrustedModel(f"{record.label}: its weights {entry['path']} are not a plain file")
    _compare(record, WEIGHTS_TAG, found, f"weights {entry['path']} have")


def check_files(record: Provenance, digests: dict[str, str]) -> None:
    """All the downloaded model's files have the digest recorded when it was logged."""
    _compare(
        record, FILES_TAG, files_sha256(digests), "files (MLmodel, python_model.pkl, code/) have"
    )


def _compare(record: Provenance, tag: str, found: str, what: str) -> None:
    expected = record.checksums[tag]
    if found != expected:
        raise UntrustedModel(
            f"{record.label}: its {what} sha256 {found[:16]}..., not the {expected[:16]}... "
            f"recorded when run {record.run_id} logged them: changed after logging; not loaded"
        )
