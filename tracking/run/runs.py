"""The MLflow run of a training job, from creation to close.

The one home of the run lifecycle; every caller goes through it:
- create: `create_run` (any caller), `start_run` (with params, tags, dataset lineage and
  the manifest). The launcher creates the run before any rank starts (a fresh sqlite
  store raced by several ranks fails: docs/architecture.md M6) and passes its id on.
- reuse: ranks and retried attempts log into `config.run_id`.
- finish: `finish_run` with the job's summary, plots and checkpoints, then FINISHED;
  `fail_run` closes it FAILED with the reason (tag `ballast.failure_reason`) when the
  job failed after its launcher's retries. Nothing else ends a run: no
  `with mlflow.start_run(...)` anywhere, and a rank never creates one.
- show: `run_page_url` and `how_to_open` (the configured server's UI, or the command that
  starts one on a local store).

A tracking server that cannot be reached costs time, never data: what it cannot take is
kept in the run's spool (tracking/run/spool.py); a run created while it was down has a
`local-...` id. `deliver` sends a spool, each part once: `finish_run` does it when the
server is back, `python -m tracking upload <dir>` when a person does.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import warnings
from typing import Any

from mlflow.data.dataset_source_registry import resolve_dataset_source
from mlflow.entities import Dataset, DatasetInput, InputTag, Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from preprocessing.contract.manifest import Manifest
from preprocessing.contract.names import mlflow_params
from preprocessing.toolbox.secrets import redact, redact_value
from tracking.config import TrackingConfig
from tracking.run.origin import (
    PARENT_TAG,
    code_tags,
    create_experiment,
    mark_training_kind,
    origin_tags,
    parent_of,
    training_view_url,
)
from tracking.run.schema import mlflow_schema_json
from tracking.run.sending import send_or_keep, warn_kept
from tracking.run.spool import MANIFEST_ARTIFACT, Spool, is_local_run
from tracking.server import (
    TrackingUnavailable,
    is_server,
    is_transient,
    wait_until_reachable,
    without_credentials,
)

FAILURE_TAG = "ballast.failure_reason"
_MAX_PARAM_CHARS = 6000
_MAX_PARAMS_PER_BATCH = 100  # MLflow's log_batch limit
_BATCH = 1000  # MLflow's log_batch limit on metrics per request


def prepare_backend(config: TrackingConfig) -> str:
    """Create the store's schema and the experiment once, in training mode (an existing
    experiment is marked so, unless it names another kind); returns the experiment id."""
    client = MlflowClient(config.tracking_uri)
    experiment = client.get_experiment_by_name(config.experiment)
    if experiment is None:
        return create_experiment(client, config)
    mark_training_kind(client, experiment)
    return str(experiment.experiment_id)


def _create_on_server(config: TrackingConfig, tags: dict[str, str] | None) -> str:
    experiment_id = prepare_backend(config)
    tags = dict(tags or {})
    parent = parent_of(tags)
    if parent is not None and is_local_run(parent):  # a parent kept in its spool: sent first
        tags[PARENT_TAG] = _parent_on_server(config, parent)
    run = MlflowClient(config.tracking_uri).create_run(
        experiment_id, run_name=config.run_name, tags=tags
    )
    return str(run.info.run_id)


def _parent_on_server(config: TrackingConfig, parent: str) -> str:
    """The server's id of a parent run kept in its spool, delivered now if it was not."""
    spool = Spool.of_run(config, parent)
    sent = spool.run.get("run_id") if spool.exists() else None
    sent = sent or (deliver(spool, config) if spool.exists() else None)
    if sent is None:
        raise TrackingUnavailable(f"parent run {parent} is not on the server yet")
    return str(sent)


def create_run(config: TrackingConfig, tags: dict[str, str] | None = None) -> str:
    """Create a run in the config's experiment (and the store's schema first); its id.
    A server that cannot be reached gets a `local-...` run in the spool instead. MLflow's
    source, user and parent tags (tracking/run/origin.py) come first."""
    tags = {**origin_tags(config), **(tags or {})}
    return send_or_keep(
        config,
        None,
        "the run",
        send=lambda _: _create_on_server(config, tags),
        keep=lambda spool: spool.path.name,
        tags=tags,
    )


def flatten(values: dict[str, Any]) -> dict[str, str]:
    """Nested config as dotted MLflow params (`loader.batch_size`), values as strings,
    hidden by the one rule of what a credential is (`redact_value`: a credential-named
    setting is ***, a URI's password too; Prefect's parameters and the manifest show the
    same). Keys MLflow refuses (a column name `Body Mass (g)` in `dataset.nulls`) get a
    valid form, their value the original key (preprocessing/contract/names.py)."""
    return mlflow_params(_dotted(redact_value(values)), _MAX_PARAM_CHARS)


def _dotted(values: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dicts as dotted keys; a value that is not a string as JSON."""
    flat: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_dotted(value, f"{name}."))
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            flat[name] = text[:_MAX_PARAM_CHARS]
    return flat


def dataset_input(manifest: Manifest, manifest_uri: str) -> DatasetInput:
    """The version as an MLflow dataset input: source = manifest URI, digest = version id,
    its parent (a chain's child) as a tag and in the profile."""
    profile = {name: split.num_rows for name, split in manifest.splits.items()}
    lineage = [InputTag("ballast.parent_version", manifest.parent_version or "none")]
    source_type, source = manifest_source(redact(manifest_uri))
    dataset = Dataset(
        name=f"ballast-{manifest.version_id}",
        digest=manifest.version_id,
        source_type=source_type,
        source=source,
        schema=mlflow_schema_json(manifest.arrow_schema),  # the UI's own format
        profile=json.dumps(
            {
                "num_rows": profile,
                "num_classes": len(manifest.classes),
                "parent_version": manifest.parent_version,
                "chain_length": len(manifest.deltas),
            }
        ),
    )
    return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", "training"), *lineage])


def manifest_source(uri: str) -> tuple[str, str]:
    """The type and JSON of the MLflow dataset source of a manifest at `uri`: one MLflow
    ships (`local`, `s3`, `gs`, ... of its artifact repositories), so that
    `mlflow.data.get_source(dataset_input).load()` fetches the manifest in any Python with
    mlflow, no ballast needed; `ballast-manifest` for a scheme MLflow cannot read."""
    try:
        with warnings.catch_warnings():  # a local path fits two of MLflow's sources alike
            warnings.simplefilter("ignore", UserWarning)
            source = resolve_dataset_source(uri)
    except MlflowException:
        return "ballast-manifest", json.dumps({"uri": uri})
    return source._get_source_type(), source.to_json()


def log_params(client: MlflowClient, run_id: str, params: dict[str, str]) -> None:
    items = [Param(name, value) for name, value in params.items()]
    for start in range(0, len(items), _MAX_PARAMS_PER_BATCH):
        client.log_batch(run_id, params=items[start : start + _MAX_PARAMS_PER_BATCH])


def _log_lineage(client: MlflowClient, run_id: str, manifest: Manifest, manifest_uri: str) -> None:
    client.log_inputs(run_id, datasets=[dataset_input(manifest, manifest_uri)])
    # Input URIs may carry credentials (http://user:password@host/...): never sent as is.
    client.log_text(run_id, redact(manifest.to_json()), MANIFEST_ARTIFACT)


def start_run(
    config: TrackingConfig,
    manifest: Manifest,
    manifest_uri: str,
    params: dict[str, Any],
    tags: dict[str, str],
) -> str:
    """Create the job's run with params, tags, dataset lineage and the manifest artifact;
    returns the run id."""
    all_tags = {
        **code_tags(),
        "ballast.dataset_version": manifest.version_id,
        "ballast.dataset_parent_version": manifest.parent_version or "none",
        **tags,
    }
    run_id = create_run(config, all_tags)
    flat = flatten(params)

    def send(client: MlflowClient) -> None:
        log_params(client, run_id, flat)
        _log_lineage(client, run_id, manifest, manifest_uri)

    def keep(spool: Spool) -> None:
        spool.add_params(flat)
        spool.set_lineage(manifest_uri, redact(manifest.to_json()))

    send_or_keep(config, run_id, "its params and lineage", send, keep)
    return run_id


def _close(
    client: MlflowClient,
    run_id: str,
    summary: dict[str, Any],
    manifest: Manifest | None,
    checkpoint_dir: str | None,
) -> None:
    from tracking.run.artifacts import log_checkpoints, log_plots  # matplotlib: only here

    if summary:  # a night's run closes with none (its summary is its own artifact)
        client.log_dict(run_id, summary, "training/summary.json")
    if manifest is not None:
        log_plots(client, run_id, manifest, summary)
    if checkpoint_dir is not None:
        log_checkpoints(client, run_id, checkpoint_dir)
    # MLflow would print the run's URL with the tracking URI's password in it; the job's
    # summary links the run without it (run_page_url).
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    client.set_terminated(run_id, status="FINISHED")


def finish_run(
    config: TrackingConfig,
    run_id: str,
    summary: dict[str, Any],
    manifest: Manifest | None = None,
    checkpoint_dir: str | None = None,
) -> str:
    """Record the job's summary, plots and checkpoints, and close the run FINISHED; what
    the run's spool holds is sent first, in order. Waits up to `delivery_wait_s` for a
    server that cannot be reached, then keeps the close in the spool too. Returns the
    run's id on the server (a `local-...` id while it is not there yet)."""
    spool = Spool.of_run(config, run_id)
    if not spool.exists():
        send_or_keep(
            config,
            run_id,
            "its close",
            send=lambda client: _close(client, run_id, summary, manifest, checkpoint_dir),
            keep=lambda kept: kept.record_finish(summary, _json(manifest), checkpoint_dir),
            wait_s=config.delivery_wait_s,
        )
        return run_id
    spool.record_finish(summary, _json(manifest), checkpoint_dir)
    return deliver(spool, config) or run_id


def fail_run(config: TrackingConfig, run_id: str, reason: str) -> None:
    """Close the run FAILED, with `reason` (redacted) as its FAILURE_TAG. A run only in
    its spool, or a server that cannot take it, stays open, with a warning naming why."""
    if is_local_run(run_id):
        warnings.warn(
            f"run {run_id} failed ({reason[:200]}) but is not on the server yet; it stays open",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    try:
        client = MlflowClient(config.tracking_uri)
        client.set_tag(run_id, FAILURE_TAG, redact(reason)[:_MAX_PARAM_CHARS])
        client.set_terminated(run_id, status="FAILED")
    except Exception as error:
        if not (is_server(config.tracking_uri) and is_transient(error)):
            raise
        warnings.warn(
            f"MLflow at {redact(config.tracking_uri)} could not mark run {run_id} "
            f"failed: {redact(str(error))[:300]}",
            RuntimeWarning,
            stacklevel=2,
        )


def _json(manifest: Manifest | None) -> str | None:
    return manifest.to_json() if manifest is not None else None


def deliver(spool: Spool, config: TrackingConfig | None = None) -> str | None:
    """Send what `spool` holds, each part once, in the order a live run would have: the
    run, params, lineage, artifacts, metrics, the model, the close. `config` (default:
    the spool's own settings) gives the server. Returns the server's run id, or None with
    a warning naming the upload command if the server cannot be reached or fails again."""
    config = config or spool.tracking_config()
    if not wait_until_reachable(config.tracking_uri, config.delivery_wait_s):
        warn_kept(config, spool, "what was kept", "the server did not answer")
        return None
    try:
        return _deliver_parts(spool, config, MlflowClient(config.tracking_uri))
    except Exception as error:
        if not (is_server(config.tracking_uri) and is_transient(error)):
            raise
        warn_kept(config, spool, "the rest of what was kept", redact(str(error))[:500])
        return None


def _deliver_parts(spool: Spool, config: TrackingConfig, client: MlflowClient) -> str:
    run_id = spool.run["run_id"]
    if run_id is None:
        run_id = _create_on_server(config, spool.run["tags"])
        spool.set_server_run_id(run_id)
    log_params(client, run_id, spool.params())  # the same values again are accepted
    for key, value in spool.tags().items():
        client.set_tag(run_id, key, value)
    _deliver_lineage(spool, client, run_id)
    if spool.artifacts_dir.exists():
        client.log_artifacts(run_id, str(spool.artifacts_dir))  # overwrites: idempotent
    _deliver_metrics(spool, client, run_id)
    _deliver_model(spool, config, run_id)
    _deliver_close(spool, client, run_id)
    return str(run_id)


def _deliver_lineage(spool: Spool, client: MlflowClient, run_id: str) -> None:
    lineage = spool.lineage()
    if lineage is None or spool.progress().get("lineage"):
        return
    manifest_json = (spool.artifacts_dir / MANIFEST_ARTIFACT).read_text()
    manifest = Manifest.from_json(manifest_json, str(spool.path))
    client.log_inputs(run_id, datasets=[dataset_input(manifest, lineage["manifest_uri"])])
    spool.mark("lineage")


def _deliver_metrics(spool: Spool, client: MlflowClient, run_id: str) -> None:
    """Each metrics file from its first unsent line; progress is saved per batch."""
    for file_name, num_sent, values in spool.unsent_metrics():
        for start in range(0, len(values), _BATCH):
            batch: list[Metric] = values[start : start + _BATCH]
            client.log_batch(run_id, metrics=batch)
            spool.mark_metric_lines(file_name, num_sent + start + len(batch))


def _deliver_model(spool: Spool, config: TrackingConfig, run_id: str) -> None:
    if spool.model_dir.exists() and spool.progress().get("model_uri") is None:
        from tracking.run.model import log_kept_model  # torch: only when a model is kept

        spool.mark("model_uri", log_kept_model(config, run_id, spool))


def _deliver_close(spool: Spool, client: MlflowClient, run_id: str) -> None:
    finish = spool.finish()
    if finish is None or spool.progress().get("closed"):
        return
    manifest = (
        Manifest.from_json(finish["manifest"], str(spool.path)) if finish["manifest"] else None
    )
    _close(client, run_id, finish["summary"], manifest, finish["checkpoint_dir"])
    spool.mark("closed")


def run_page_url(tracking_uri: str, run_id: str) -> str | None:
    """The run's page on the configured server's UI; None for a local store (there is no
    server to link to: `how_to_open` gives the command) or a run not on the server yet."""
    if not is_server(tracking_uri) or is_local_run(run_id):
        return None
    return f"{without_credentials(tracking_uri).rstrip('/')}/#/runs/{run_id}"


def how_to_open(tracking_uri: str, run_id: str, spool_dir: str | None = None) -> str:
    """For a person: the run's page, or the command that opens a UI on a local store; for
    a run still in its spool, where it is kept and the command that sends it."""
    spool = Spool.of_run(TrackingConfig(tracking_uri=tracking_uri, spool_dir=spool_dir), run_id)
    sent_id = spool.run.get("run_id") if spool.exists() else None
    if is_local_run(run_id) and sent_id is None:
        return (
            f"run {run_id} is not on {redact(tracking_uri)} yet (it could not be reached); "
            f"it is kept in {spool.path}: `{spool.upload_command()}` sends it"
        )
    run_id = sent_id or run_id
    url = training_view_url(tracking_uri, run_id)
    if url is not None:
        return f"open {url}"
    return (
        f"{ui_command(tracking_uri)}  (then the run is at #/runs/{run_id} of the address it prints)"
    )


def ui_command(tracking_uri: str) -> str:
    """The exact command that starts an MLflow UI on a local store, with this Python."""
    return (
        f"{shlex.quote(sys.executable)} -m mlflow ui --backend-store-uri "
        f"{shlex.quote(tracking_uri)}"
    )
