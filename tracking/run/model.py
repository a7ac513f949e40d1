"""Logging the trained model into its job's run, or keeping it in the run's spool.

The model is logged as a pyfunc `CodecClassifier` (tracking/run/pyfunc.py): the network
without Lightning plus its dataset's feature codec, with a signature naming the original
input columns and an input example of raw rows, so `mlflow.pyfunc.load_model(
"models:/<name>@champion").predict(df)` takes rows as the input files hold them. The
class labels travel as model metadata too.

The model stands on its own: its artifacts are the codec with the classes (`codec.json`)
and the network's weights (`weights.pt`, a state dict with the layer sizes, read with
`torch.load(weights_only=True)`); its code is the pyfunc module and the codec modules it
imports, shipped as MLflow `code_paths` under their package paths (`code/tracking/run/
pyfunc.py`, `code/preprocessing/contract/codec.py`), which import only the packages of
its requirements (torch, numpy, pandas, pyarrow, mlflow). A network other than the
built-in MLP is saved whole (`network.pt`) and loads only where its class imports.

Two checksums are tags of the logged model (in the tracking database, not the artifact
store): the sha256 of the weights file, hashed from the bytes this process wrote
(`WEIGHTS_TAG`), and one sha256 over every file of the model as read back right after
logging (`FILES_TAG`: MLmodel, python_model.pkl, code/, the codec). Registration copies
them onto the model version; tracking/lifecycle/trust.py checks a download against them
before ballast loads a registered model.

A model the server cannot take is saved in the run's spool as an MLflow model (it loads
from there as it is) and logged when the spool is delivered (tracking/run/runs.py
`deliver`): that is why the model's logging lives with the run, below registration
(tracking/lifecycle/registry.py).

The model is logged into the job's run without making it the active run, so logging it
never ends the run (tracking/run/runs.py opens and closes runs).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version as package_version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
import mlflow.tracking.fluent as mlflow_fluent
import pandas as pd
from mlflow.models import Model
from mlflow.tracking import MlflowClient

from preprocessing.contract.codec import FeatureCodec
from preprocessing.contract.integrity import ShardRef, read_shard_table, shard_version
from preprocessing.contract.manifest import Manifest, file_sha256, read_manifest, shard_uri
from tracking.config import TrackingConfig
from tracking.run.pyfunc import (
    CODEC_ARTIFACT,
    NETWORK_ARTIFACT,
    WEIGHTS_ARTIFACT,
    CodecClassifier,
    mlflow_type,
    network_weights,
    signature,
)
from tracking.run.sending import send_or_keep
from tracking.run.spool import Spool

if TYPE_CHECKING:  # torch is imported where a network is saved: scoring never needs it
    import torch

NUM_EXAMPLE_ROWS = 5
WEIGHTS_TAG = "ballast.weights_sha256"  # of the model's weights (or network) file
FILES_TAG = "ballast.model_files_sha256"  # over every file of the logged model
_REQUIREMENTS = ("torch", "numpy", "pandas", "pyarrow", "mlflow")
# The modules a model runs: shipped in it with their packages' __init__ files.
SHIPPED_MODULES = (
    "preprocessing.contract.codec",
    "preprocessing.contract.column_spec",
    "preprocessing.contract.numeric_block",
    "tracking.run.pyfunc",
)


def log_model(config: TrackingConfig, run_id: str, network: torch.nn.Module, dataset: str) -> str:
    """Log `network` with the codec and classes of `dataset` (the version it was trained
    on) under the run; returns the model URI to register: `models:/...`, or the local
    path of the model kept in the run's spool when the server cannot take it (waiting up
    to `config.delivery_wait_s` first)."""
    manifest, location = read_manifest(dataset)
    codec = FeatureCodec.from_manifest(manifest)
    model = CodecClassifier(
        network.eval().cpu(),
        codec,
        [str(label) for label in manifest.classes],
        list(manifest.classes),
    )
    example = example_rows(manifest, location, codec)
    extra = {"dataset_version": manifest.version_id}
    return send_or_keep(
        config,
        run_id,
        "the model",
        send=lambda _: _log_to_run(config, run_id, model, example, extra),
        keep=lambda spool: _keep_model(spool, model, example, extra),
        wait_s=config.delivery_wait_s,
    )


def example_rows(manifest: Manifest, location: str, codec: FeatureCodec) -> pd.DataFrame:
    """The first rows of the version's first train shard, feature columns only, as the
    input files held them (an integer column declared `double` as floats). The shard is
    read through the contract's integrity reader: a damaged one is ShardDamaged naming it
    (size against the manifest's, page checksums), not pyarrow's footer error."""
    first = manifest.split("train").shards[0]
    uri = shard_uri(location, first)
    table = read_shard_table(ShardRef(uri, first, shard_version(uri)), columns=codec.names)
    frame = table.slice(0, NUM_EXAMPLE_ROWS).to_pandas()
    for spec in codec.columns:
        if mlflow_type(spec) == "double":
            frame[spec.name] = frame[spec.name].astype("float64")
    return frame


@contextmanager
def own_import_path() -> Iterator[None]:
    """`sys.path` as it was, whatever MLflow adds inside: loading a model (and logging one,
    which loads it to check its input example) puts the model's `code/` first. In a ballast
    process that copy of two modules would shadow ballast's own packages for every later
    import, and for every Dask worker spawned later, which starts with this sys.path."""
    before = list(sys.path)
    try:
        yield
    finally:
        sys.path[:] = before


@contextmanager
def _model_arguments(
    model: CodecClassifier, example: pd.DataFrame, extra: dict[str, Any]
) -> Iterator[dict[str, Any]]:
    """What the model is logged (or saved) with: the network and codec as artifacts,
    signature, example, labels, requirements."""
    assert model.codec is not None
    with own_import_path(), tempfile.TemporaryDirectory() as work:
        artifacts = {CODEC_ARTIFACT: f"{work}/codec.json"}
        Path(artifacts[CODEC_ARTIFACT]).write_text(
            json.dumps(
                {
                    "columns": model.codec.to_json(),
                    "classes": model.classes,
                    "labels": model.labels,
                },
                indent=1,
            )
        )
        artifacts.update(_save_network(model.network, Path(work)))
        yield {
            "python_model": CodecClassifier(),
            "artifacts": artifacts,
            "code_paths": shipped_code(Path(work) / "code"),
            "signature": signature(model.codec, model.labels),
            "input_example": example,
            "metadata": {**extra, "classes": model.classes},
            "pip_requirements": [
                f"{name}=={package_version(name).split('+')[0]}" for name in _REQUIREMENTS
            ],
        }


def _save_network(network: torch.nn.Module, work: Path) -> dict[str, str]:
    """The network's artifact: its weights, or the whole network when it is no MLP."""
    import torch

    weights = network_weights(network)
    if weights is None:
        torch.save(network, work / "network.pt")
        return {NETWORK_ARTIFACT: str(work / "network.pt")}
    torch.save(weights, work / "weights.pt")
    return {WEIGHTS_ARTIFACT: str(work / "weights.pt")}


def weights_sha256(artifacts: dict[str, str]) -> str:
    """The sha256 of the network's artifact file (the weights, or the whole network)."""
    path = artifacts.get(WEIGHTS_ARTIFACT) or artifacts[NETWORK_ARTIFACT]
    return file_sha256(str(path))


def file_digests(root: Path) -> dict[str, str]:
    """The sha256 of every file under `root`, by its relative path."""
    return {
        path.relative_to(root).as_posix(): file_sha256(str(path))
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def files_sha256(digests: dict[str, str]) -> str:
    """One sha256 over a model's files (`file_digests`): each one's relative path and
    sha256, in path order (a file added, removed, renamed or changed changes it)."""
    digest = hashlib.sha256()
    for name in sorted(digests):
        digest.update(f"{name}\0{digests[name]}\n".encode())
    return digest.hexdigest()


def shipped_code(root: Path) -> list[str]:
    """Copies of SHIPPED_MODULES under `root` at their package paths; returns the
    top-level package folders (MLflow puts each into the model's `code/`)."""
    for name in SHIPPED_MODULES:
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            source = Path(str(importlib.import_module(".".join(parts[:depth])).__file__))
            folder = root.joinpath(*parts[: depth - 1 if source.name != "__init__.py" else depth])
            folder.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, folder / source.name)
    return sorted({str(root / name.split(".")[0]) for name in SHIPPED_MODULES})


def _log_to_run(
    config: TrackingConfig,
    run_id: str,
    model: CodecClassifier,
    example: pd.DataFrame,
    extra: dict[str, Any],
) -> str:
    # Not `with mlflow.start_run(run_id=...)`: leaving that block would end the job's run
    # (FINISHED, or FAILED on an error) before its close. The logged model goes into the
    # run's experiment, which MLflow takes from the active one.
    # The active experiment is a process global of MLflow's: restored afterwards, so a later
    # `start_run` in this process (another store, another job) does not look for this one.
    mlflow.set_tracking_uri(config.tracking_uri)
    experiment_id = MlflowClient(config.tracking_uri).get_run(run_id).info.experiment_id
    previous = mlflow_fluent._active_experiment_id
    mlflow.set_experiment(experiment_id=experiment_id)
    try:
        with _model_arguments(model, example, extra) as arguments:
            tags = {WEIGHTS_TAG: weights_sha256(arguments["artifacts"])}
            info = Model.log(
                None, name="model", flavor=mlflow.pyfunc, run_id=run_id, tags=tags, **arguments
            )
    finally:
        mlflow_fluent._active_experiment_id = previous
    _record_files(config.tracking_uri, str(info.model_uri), str(info.model_id))
    return str(info.model_uri)


def _record_files(tracking_uri: str, model_uri: str, model_id: str) -> None:
    """Tag the logged model with `FILES_TAG` of its files as the store now holds them (read
    back: MLflow writes them from a directory of its own)."""
    with tempfile.TemporaryDirectory() as work:
        local = mlflow.artifacts.download_artifacts(
            artifact_uri=model_uri, dst_path=work, tracking_uri=tracking_uri
        )
        digest = files_sha256(file_digests(Path(local)))
    MlflowClient(tracking_uri).set_logged_model_tags(model_id, {FILES_TAG: digest})


def _keep_model(
    spool: Spool, model: CodecClassifier, example: pd.DataFrame, extra: dict[str, Any]
) -> str:
    """Save the model into the spool (through a temporary directory and a rename)."""
    target = spool.model_dir
    partial = target.with_name(f".{target.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by a crash
    with _model_arguments(model, example, extra) as arguments:
        mlflow.pyfunc.save_model(str(partial), **arguments)
    shutil.rmtree(target, ignore_errors=True)  # a retried job's model replaces the first
    partial.rename(target)
    spool.mark("model_uri", None)
    return str(target)


def log_kept_model(config: TrackingConfig, run_id: str, spool: Spool) -> str:
    """Log the model kept in `spool` to the run exactly as `log_model` would have."""
    saved = Model.load(str(spool.model_dir))
    with own_import_path():
        model = mlflow.pyfunc.load_model(str(spool.model_dir)).unwrap_python_model()
    example = saved.load_input_example(str(spool.model_dir))
    extra = {k: v for k, v in (saved.metadata or {}).items() if k != "classes"}
    return _log_to_run(config, run_id, model, example, extra)
