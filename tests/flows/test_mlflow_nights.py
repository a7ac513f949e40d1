"""Two nights of the pipeline as MLflow's UI shows them, read through MLflow's REST API
(what the UI itself calls) on a real `mlflow server`, in an experiment an earlier release
made. Two pipeline runs: the nightly tier (`make nightly`), not `make test`."""

from __future__ import annotations

import asyncio
import getpass
import json
import re
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

from flows.params import PipelineParams
from flows.pipeline import pipeline
from flows.results import PipelineResult
from preprocessing.config import DatasetSpec, ReshardConfig
from tracking.config import TrackingConfig
from training.config import LoaderConfig, TrainConfig
from training.launch import LocalJob, RetryPolicy

pytestmark = [pytest.mark.slow, pytest.mark.nightly]
EXPERIMENT = "two-nights"
NIGHT_METRICS = {"holdout_macro_f1", "holdout_balanced_accuracy", "holdout_worst_class_recall"}


def rest(base: str, path: str, body: dict[str, Any] | None = None, **query: str) -> dict:
    """One call of MLflow's REST API (a GET with `query`, else a POST of `body`)."""
    url = f"{base}/api/2.0/mlflow/{path}"
    if body is None:
        request = urllib.request.Request(f"{url}?{urllib.parse.urlencode(query)}")
    else:
        data = json.dumps(body).encode()
        request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return dict(json.loads(answer.read()))


def search(base: str, experiment_id: str, query: str = "") -> list[dict]:
    body = {"experiment_ids": [experiment_id], "filter": query, "max_results": 1000}
    return list(rest(base, "runs/search", body).get("runs", []))


def tags(run: dict) -> dict[str, str]:
    return {tag["key"]: tag["value"] for tag in run["data"].get("tags", [])}


def night_params(raw: Path, work: Path, mlflow_uri: str) -> PipelineParams:
    return PipelineParams(
        reshard=ReshardConfig(
            dataset=DatasetSpec(inputs=[str(raw)], id_column="id"),
            output_root=str(work / "datasets"),
            target_shard_rows=600,
        ),
        train=TrainConfig(
            dataset=str(work / "datasets"),
            output_dir=str(work / "job"),
            max_epochs=2,
            loader=LoaderConfig(batch_size=32),
            tracking=TrackingConfig(
                tracking_uri=mlflow_uri,
                experiment=EXPERIMENT,
                registered_model_name="two-nights-classifier",
                system_metrics_interval_s=None,
            ),
        ),
        job=LocalJob(num_processes_per_node=1, retry=RetryPolicy(attempts=1)),
    )


async def link_artifacts(flow_run_id: Any) -> list[Any]:
    async with get_client() as client:
        found = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return [artifact for artifact in found if artifact.key == "mlflow-night-run"]


def test_two_nights_are_two_parents_in_training_mode_with_their_children(
    tiny_raw, tmp_path, mlflow_uri, prefect_harness
) -> None:
    """Invariants, as the REST API gives them: the experiment (made by an earlier release,
    its run kept) is in training mode; each night is one parent run holding the night's
    summary under the same metric names, linked to its Prefect flow run and back; its
    children are its arm's training run and, the second night, the champion's scoring;
    every run names its Source (`ballast run pipeline`), Created by (the OS user) and
    commit."""
    client = MlflowClient(mlflow_uri)
    earlier = client.create_run(client.create_experiment(EXPERIMENT), tags={"git_sha": "0" * 40})
    params = night_params(tiny_raw, tmp_path, mlflow_uri)
    states = [pipeline(**params.arguments(), return_state=True) for _ in range(2)]
    results: list[PipelineResult] = [state.result() for state in states]
    experiment = rest(mlflow_uri, "experiments/get-by-name", experiment_name=EXPERIMENT)
    experiment = experiment["experiment"]
    kinds = {tag["key"]: tag["value"] for tag in experiment["tags"]}
    assert kinds["mlflow.experimentKind"] == "custom_model_development"
    exp_id = experiment["experiment_id"]
    all_runs = {run["info"]["run_id"]: run for run in search(mlflow_uri, exp_id)}
    assert earlier.info.run_id in all_runs
    nights = search(mlflow_uri, exp_id, "tags.`ballast.night` = 'true'")
    assert {run["info"]["run_id"] for run in nights} == {r.night_run_id for r in results}
    for number, (state, result) in enumerate(zip(states, results, strict=True), 1):
        night_id = str(result.night_run_id)
        night = all_runs[night_id]
        check_night(night, result, str(state.state_details.flow_run_id))
        children = search(
            mlflow_uri, exp_id, f"tags.`mlflow.parentRunId` = '{result.night_run_id}'"
        )
        roles = sorted(tags(child).get("ballast.role", "training") for child in children)
        assert roles == (["training"] if number == 1 else ["champion-scoring", "training"])
        assert result.run_id in {child["info"]["run_id"] for child in children}
        for run in [night, *children]:
            check_origin(tags(run))
        artifacts = asyncio.run(link_artifacts(state.state_details.flow_run_id))
        view = f"#/experiments/{exp_id}/runs/{night_id}?workflowType=machine_learning"
        link = f"{mlflow_uri}/{view}"
        assert [a.data for a in artifacts] == [f"[MLflow run of this night ({night_id})]({link})"]


def check_night(night: dict, result: PipelineResult, flow_run_id: str) -> None:
    """The night's summary: its version, decision and reason, the figures, the link."""
    found, metrics = tags(night), {m["key"]: m["value"] for m in night["data"]["metrics"]}
    assert night["info"]["status"] == "FINISHED"
    assert found["ballast.dataset_version"] == result.version_id
    assert found["ballast.prefect_flow_run_id"] == flow_run_id
    registration = result.registration
    assert registration is not None and registration.reasons
    assert found["ballast.promotion"].endswith(str(registration.alias))
    assert found["ballast.promotion_reason"] == "; ".join(registration.reasons)
    assert set(metrics) >= NIGHT_METRICS
    (evaluation,) = result.evaluations.values()
    assert metrics["holdout_macro_f1"] == pytest.approx(evaluation.macro_f1)
    supported = {label for label, value in evaluation.recall.items() if value is not None}
    assert {f"holdout_recall/{label}" for label in supported} <= set(metrics)


def check_origin(found: dict[str, str]) -> None:
    assert found["mlflow.source.name"] == "ballast run pipeline"
    assert found["mlflow.source.type"] == "LOCAL"
    assert found["mlflow.user"] == getpass.getuser()
    assert re.fullmatch(r"[0-9a-f]{40}", found.get("mlflow.source.git.commit", found["git_sha"]))
