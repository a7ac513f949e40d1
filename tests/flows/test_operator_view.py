"""What an operator sees of a pipeline run through the Prefect API: its log, its task run
names and its artifacts; and the same flow code on a Dask scheduler started by hand."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.client.schemas.objects import State
from prefect.logging.handlers import APILogWorker

from flows.arms import FIGURE_NAMES, NATURAL_MIX, REBALANCED, figures
from flows.params import PipelineParams
from flows.pipeline import reshard_flow
from flows.report import run_link_line
from flows.results import PipelineResult
from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import read_manifest, shard_uri
from preprocessing.driver.cluster import DaskConfig
from tests.preprocessing.test_executor import dask_processes, worker_env
from training.summary import CHOSEN_ON_TAG


def flow_run_id(state: State) -> UUID:
    run_id = state.state_details.flow_run_id
    assert run_id is not None
    return run_id


async def _read_logs(run_id: UUID) -> list[str]:
    async with get_client() as client:
        logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    return [log.message for log in logs]


def run_log(run_id: UUID, expected: str, timeout_s: float = 30) -> str:
    """The flow run's log as the API holds it (logs are shipped in the background: wait
    until `expected` arrived or the time is up)."""
    APILogWorker.drain_all(timeout=5)
    deadline = time.monotonic() + timeout_s
    while True:
        text = "\n".join(asyncio.run(_read_logs(run_id)))
        if expected in text or time.monotonic() > deadline:
            return text
        time.sleep(1)


async def _task_run_names(run_id: UUID) -> list[str]:
    async with get_client() as client:
        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))
        )
    return [run.name for run in runs]


async def _artifacts(run_id: UUID) -> list[Any]:
    async with get_client() as client:
        return await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
        )


@pytest.mark.slow
def test_run_log_holds_version_rows_shards_epochs_scores_and_registration(
    first_state: State, first_run: PipelineResult
) -> None:
    """Invariant: the flow run's log, read back from the Prefect API, names the dataset
    version with its rows in and out and shards, each training job's epochs, both arms'
    held-out figures and the registration of the rebalanced model, in one line with why."""
    manifest, _ = read_manifest(first_run.manifest_uri)
    rows_in = sum(manifest.input_class_counts.values())
    rows_out = sum(split.num_rows for split in manifest.splits.values())
    train = manifest.split("train")
    registration = first_run.registration
    last = f"register[{REBALANCED}]: {registration.name} v{registration.version}"
    log = run_log(flow_run_id(first_state), last)
    assert f"dataset version {manifest.version_id}: {rows_in} rows in -> {rows_out} rows out" in log
    assert f"train {train.num_rows} rows in {len(train.shards)} shards" in log
    assert f"{len(manifest.rejected)} rejected input files" in log
    for arm in (REBALANCED, NATURAL_MIX):
        assert f"train[{arm}]: 2 epochs on 2 ranks" in log
        evaluation = first_run.evaluations[arm]
        assert (
            f"evaluate[{arm}]: {evaluation.num_rows} held-out rows of version "
            f"{evaluation.dataset_version}: macro-F1 {evaluation.macro_f1:.4f}, "
            f"balanced accuracy {evaluation.balanced_accuracy:.4f}"
        ) in log
    assert f"{last} is `{registration.alias}`" in log
    # One line per arm says the registration, its alias and why (no second `promote` line).
    lines = [line for line in log.splitlines() if line.startswith(("register[", "promote["))]
    assert len(lines) == 1 and lines[0].startswith(last), lines
    assert "because: " in lines[0]


@pytest.mark.slow
def test_task_runs_are_named_by_step_and_arm(first_state: State) -> None:
    """Invariant: every task run of the pipeline says its step and arm, so the rebalanced
    and natural-mix runs of one step can be told apart."""
    names = set(asyncio.run(_task_run_names(flow_run_id(first_state))))
    expected = {
        f"{step}[{arm}]"
        for step in ("reshard", "train", "close-run", "evaluate")
        for arm in (REBALANCED, NATURAL_MIX)
    } | {f"{step}[{REBALANCED}]" for step in ("score-champion", "register", "record-promotion")}
    assert names == expected


@pytest.mark.slow
def test_training_summary_artifact_compares_both_arms_on_three_figures(
    first_state: State, first_run: PipelineResult
) -> None:
    """Invariants: every artifact of the run has a description; the training summary holds a
    row per figure (macro-F1, balanced accuracy, worst-class recall) with both arms' values
    side by side, as the evaluations computed them, and names the MLflow run; the job's
    line names its arm."""
    artifacts = asyncio.run(_artifacts(flow_run_id(first_state)))
    assert artifacts and all(artifact.description for artifact in artifacts)
    summary = next(a for a in artifacts if a.key == "training-summary")
    assert "balanced accuracy" in summary.description
    assert summary.description.endswith("the MLflow runs")  # both arms' runs are linked
    lines = summary.data.splitlines()
    assert any(
        line.startswith(f"- training job ({REBALANCED}): 2 ranks, 2 epochs") for line in lines
    ), lines
    assert (
        f"| held-out ({first_run.evaluations[REBALANCED].num_rows} rows) | "
        f"{REBALANCED} | {NATURAL_MIX} |" in lines
    )
    by_arm = {arm: figures(first_run.evaluations[arm]) for arm in (REBALANCED, NATURAL_MIX)}
    for name in FIGURE_NAMES:
        values = " | ".join(f"{by_arm[arm][name]:.4f}" for arm in (REBALANCED, NATURAL_MIX))
        assert f"| {name} | {values} |" in lines
    run_line = next(line for line in lines if line.startswith("- MLflow run"))
    assert first_run.run_id in run_line
    # A sqlite store has no server to link to: the line says how to open a UI on it.
    assert "](" not in run_line and "mlflow ui --backend-store-uri sqlite:///" in run_line


async def _flow_run_name(run_id: UUID) -> str:
    async with get_client() as client:
        return str((await client.read_flow_run(run_id)).name)


@pytest.mark.slow
def test_mlflow_shows_both_arms_named_scored_and_the_version_described(
    first_state: State, first_run: PipelineResult, params: PipelineParams
) -> None:
    """Invariants (what the MLflow UI shows, read through its client): each arm's run is
    named `<flow run name>-<arm>`; each holds its held-out figures and the class-prior
    baseline's as `holdout_...` metrics equal to the evaluations; the code version is a
    commit or package version, never `unknown`; the registered version's description
    names its arm, dataset version and held-out macro-F1; the dataset input's schema is
    in MLflow's own format, one entry per column of the version; each run's description
    names its arm, flow run, the split its `val_*` figures are of (the validation split,
    as its tag says) and the held-out rows its `holdout_*` figures are of."""
    client = MlflowClient(params.train.tracking.tracking_uri)
    name = asyncio.run(_flow_run_name(flow_run_id(first_state)))
    assert set(first_run.runs) == {REBALANCED, NATURAL_MIX}
    for arm, run_id in first_run.runs.items():
        run = client.get_run(run_id)
        evaluation = first_run.evaluations[arm]
        assert run.info.run_name == f"{name}-{arm}"
        assert run.data.metrics["holdout_macro_f1"] == pytest.approx(evaluation.macro_f1)
        assert run.data.metrics["holdout_balanced_accuracy"] == pytest.approx(
            evaluation.balanced_accuracy
        )
        assert run.data.metrics["holdout_worst_class_recall"] == pytest.approx(
            min(v for v in evaluation.recall.values() if v is not None)
        )
        assert run.data.metrics["holdout_class_prior_macro_f1"] == pytest.approx(
            evaluation.class_prior_baseline["macro_f1"]
        )
        assert run.data.tags["git_sha"] not in ("", "unknown")
        # Its page's Description: which arm of which flow run, and which rows its holdout_*
        # figures are of (the natural-mix arm is scored on the other version's rows).
        note = run.data.tags["mlflow.note.content"]
        assert note.startswith(f"Arm `{arm}` of flow run `{name}`: trained on dataset version")
        assert "Its `val_*` metrics are on its validation split." in note
        assert run.data.tags[CHOSEN_ON_TAG] == "validation"
        assert (
            f"on the {evaluation.num_rows} held-out rows of version "
            f"{first_run.version_id}, the same rows for every arm"
        ) in note
    registration = first_run.registration
    version = client.get_model_version(registration.name, str(registration.version))
    assert f"`{REBALANCED}`" in version.description
    assert first_run.version_id in version.description
    assert f"macro-F1 {first_run.evaluations[REBALANCED].macro_f1:.4f}" in version.description
    manifest, _ = read_manifest(first_run.manifest_uri)
    dataset = client.get_run(first_run.run_id).inputs.dataset_inputs[0].dataset
    columns = json.loads(dataset.schema)["mlflow_colspec"]
    assert [column["name"] for column in columns] == [f["name"] for f in manifest.arrow_schema]


@pytest.mark.slow
def test_prefect_shows_tables_of_both_versions_and_links_both_runs(
    first_state: State, first_run: PipelineResult
) -> None:
    """Invariants: the flow run holds the class, source and shard tables of both arms'
    dataset versions (keyed by arm); the training summary links both arms' MLflow runs
    and says in one line that both are scored on the same held-out rows."""
    artifacts = asyncio.run(_artifacts(flow_run_id(first_state)))
    keys = {artifact.key for artifact in artifacts}
    for arm in (REBALANCED, NATURAL_MIX):
        assert {f"{arm}-class-mix", f"{arm}-source-mix", f"{arm}-shard-balance"} <= keys
    summary = next(a for a in artifacts if a.key == "training-summary").data
    for arm, run_id in first_run.runs.items():
        assert any(
            line.startswith(f"- MLflow run ({arm}) {run_id}") for line in summary.splitlines()
        )
    rows = first_run.evaluations[REBALANCED].num_rows
    assert f"All arms are scored on the same {rows} held-out rows" in summary


def test_run_link_is_built_from_the_configured_tracking_server() -> None:
    """Invariant: with a tracking server, the summary's run line links to that server's
    page of the run (credentials left out), never to a fixed local address."""
    run_id = "0123456789abcdef0123456789abcdef"
    line = run_link_line(run_id, "https://ops:secret@mlflow.internal:5443/")
    assert line == f"- MLflow run: [{run_id}](https://mlflow.internal:5443/#/runs/{run_id})"


def shard_digests(manifest_uri: str) -> dict[str, list[str]]:
    """SHA-256 of every shard file of a version, per split, in manifest order."""
    manifest, location = read_manifest(manifest_uri)
    return {
        name: [
            hashlib.sha256(Path(shard_uri(location, shard)).read_bytes()).hexdigest()
            for shard in split.shards
        ]
        for name, split in manifest.splits.items()
    }


@pytest.mark.slow
def test_reshard_flow_on_a_scheduler_address_makes_the_local_clusters_version(
    prefect_harness: None, tiny_raw: Path, tmp_path: Path
) -> None:
    """Invariant: the same flow code, pointed at a `dask scheduler` and `dask worker`
    started as separate processes on loopback (`dask.kind: address`), commits the same
    version id with byte-identical shards as on the default local cluster."""

    def config(root: str) -> ReshardConfig:
        return ReshardConfig(
            dataset=DatasetSpec(inputs=[str(tiny_raw)]),
            output_root=str(tmp_path / root),
            target_shard_rows=600,
        )

    local = reshard_flow(reshard=config("local"))
    env = worker_env(True)
    (tmp_path / "dask").mkdir()
    with dask_processes(tmp_path / "dask", [("127.0.0.1", [], env)] * 2) as address:
        remote = reshard_flow(
            reshard=config("remote"), dask=DaskConfig(kind="address", address=address)
        )
    assert remote.version_id == local.version_id and not remote.cached
    assert shard_digests(remote.manifest_uri) == shard_digests(local.manifest_uri)
