"""Prefect tasks: each calls one function of preprocessing/, training/ or tracking/ and
passes URIs and typed results (flows/results.py), never data. A task run is named by what it
does and for which arm of the pipeline (`reshard[natural-mix]`, `train[rebalanced]`), so the
two arms can be told apart in the Prefect UI; the results come back as typed values that the
flows pass on and log.

Retries are decided at one level per operation (docs/reliability.md, "Who retries
what"): a reshard's and a batch inference's reads are retried inside them, per file or
task (preprocessing/toolbox/faults.py), and a training job by its launcher, so those
tasks are never retried here; only the tasks with no retry inside (registration,
evaluation) are, and only for an error `classify` calls transient."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from functools import partial
from typing import Any, cast
from uuid import UUID

from prefect import task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State

from flows.results import DatasetVersion, Evaluation, Predictions, TrainingResult
from preprocessing.config import ReshardConfig
from preprocessing.contract.manifest import Manifest, read_manifest
from preprocessing.driver.cluster import Executor, dask_client
from preprocessing.driver.map_files import OutputSpec, map_to_version
from preprocessing.driver.reshard import VersionPlan, run_reshard
from preprocessing.toolbox.faults import classify
from preprocessing.toolbox.secrets import redact
from tracking.config import TrackingConfig
from tracking.lifecycle import scoring
from tracking.lifecycle.holdout import describe_run, log_holdout
from tracking.lifecycle.scoring import Mapper, predict_table
from tracking.lifecycle.scoring import split_uris as split_uris
from tracking.run.runs import finish_run
from training.config import TrainConfig
from training.launch import AnyJob, run_job


def is_transient(_: Any, __: Any, state: State[Any]) -> bool:
    """Retry a task only on a failure that may pass (the one taxonomy of
    preprocessing/toolbox/faults.py, which the reads and the launcher use as well)."""
    try:
        state.result()
    except BaseException as error:
        return classify(error) == "transient"
    return False


# Tasks with no retry inside (MLflow's registry, an evaluation's reads) retry a transient
# failure twice; a permanent or config error fails once.
TRANSIENT_RETRIES: dict[str, Any] = {
    "retries": 2,
    "retry_delay_seconds": 5,
    "retry_condition_fn": is_transient,
}


@contextmanager
def dask_map(dask: Executor, storage: list[str]) -> Iterator[Mapper]:
    """A map of one task per item over the Dask cluster `dask` (the flow's, or one started
    here that can read `storage`): what tracking/lifecycle/scoring.py scores a large split
    through."""
    with dask_client(dask, storage=storage) as client:

        def mapper(function: Any, uris: list[Any]) -> list[Any]:
            return list(client.gather(client.map(function, uris, pure=False)))

        yield mapper


def _version_key(_: Any, parameters: dict[str, Any]) -> str:
    """Cache key of a reshard: its dataset version id (inputs + config + code version)."""
    return f"reshard-{parameters['version_id']}"


@task(
    cache_key_fn=_version_key,
    persist_result=True,
    cache_expiration=timedelta(days=30),
    task_run_name="reshard[{arm}]",
)
def reshard(
    config: ReshardConfig,
    dask: Executor,
    version_id: str,
    arm: str,
    plan: VersionPlan | None = None,
) -> DatasetVersion:
    """Make the dataset version (a cache hit on its version id skips it entirely). Not
    retried as a task: every read inside is, under `config.retry`. A rerun of it (a
    retry of the flow, in this process or another) resumes what a failed or killed run
    of the version staged on a local root (docs/reliability.md).
    `plan` is the caller's `plan_version(config)` and `version_id` its id (the cache key):
    listing a large input is not free, and the version is planned once per run."""
    progress_id = create_progress_artifact(
        0.0, description=f"reshard[{arm}] of version {version_id}: scan, exchange, write"
    )
    stages = {"scan": 0, "exchange": 1, "write": 2}

    reporting = [True]

    def report(stage: str, done: int, total: int) -> None:
        # Progress is for people: an API server gone mid-run must not stop the reshard
        # (its commit is what a rerun reuses), so the first failed update ends reporting.
        try:
            if reporting[0]:
                update_progress_artifact(
                    cast(UUID, progress_id), 100 * (stages[stage] + done / total) / 3
                )
        except Exception as error:
            reporting[0] = False
            print(redact(f"reshard progress no longer reported (the Prefect API failed: {error})"))

    with dask_client(dask) as client:
        result = run_reshard(config, client, progress=report, plan=plan)
    if result.resumed:
        print(result.resumed)
    route = str(result.manifest.route.get("route", ""))
    return DatasetVersion(
        result.manifest_uri,
        result.manifest.version_id,
        result.reused,
        route=route,
        duplicates_dropped=dropped_copies(result.manifest),
    )


def dropped_copies(manifest: Manifest) -> int:
    """The input rows the version's own night left out as copies (`duplicates: drop`)."""
    own = manifest.deltas[-1].split_values if manifest.deltas else {}
    return sum(int(entry.get("dropped_duplicates", 0)) for entry in own.values())


@task(cache_policy=NO_CACHE, task_run_name="train[{arm}]")
def train(
    config: TrainConfig, job: AnyJob, arm: str = "adhoc", run_key: str | None = None
) -> TrainingResult:
    """Run the training job through its launcher, which pins the dataset version and the
    MLflow run, gives the job its run's folders (`run_key`: the flow run's id) and retries
    under `job.retry`, each retry resuming. The task itself is never retried, so retries
    do not multiply."""
    return TrainingResult.model_validate(run_job(config, job, run_key))


@task(cache_policy=NO_CACHE, task_run_name="close-run[{arm}]")
def close_run(
    tracking: TrackingConfig,
    run_id: str,
    training: TrainingResult,
    checkpoint_uri: str,
    arm: str,
) -> None:
    """Attach the job's summary, plots and checkpoints to the run and mark it finished."""
    manifest, _ = read_manifest(training.manifest_uri)
    finish_run(tracking, run_id, training.figures(), manifest, checkpoint_uri)


@task(cache_policy=NO_CACHE, task_run_name="evaluate[{arm}]", **TRANSIENT_RETRIES)
def evaluate(
    model_uri: str,
    tracking: TrackingConfig,
    dataset: str,
    split: str,
    dask: Executor,
    arm: str,
    run_id: str | None = None,
    description: str = "",
) -> Evaluation:
    """Macro-F1, balanced accuracy and per-class recall of one model on a held-out
    split, with the class-prior baseline; logged as metrics of `run_id` (the model's run)
    if given, with `description` as that run's description. Scored here or one task per
    shard on Dask (the flow's cluster, or one started for it), as
    tracking/lifecycle/scoring.py `on_cluster` chooses."""
    evaluation = scoring.evaluate(
        model_uri, tracking.tracking_uri, dataset, split, partial(dask_map, dask, [dataset])
    )
    if run_id is not None:
        log_holdout(tracking, run_id, evaluation)
        if description:
            describe_run(tracking, run_id, description)
    return Evaluation.model_validate(evaluation)


@task(cache_policy=NO_CACHE)
def predict(
    inputs: list[str],
    model_uri: str,
    tracking: TrackingConfig,
    id_column: str,
    output_root: str,
    dask: Executor,
) -> Predictions:
    """Map the model over the inputs on Dask; commit the predictions as a version. Not
    retried as a task: each file's map is, inside `map_to_version`."""
    transform = partial(
        predict_table, model_uri=model_uri, tracking_uri=tracking.tracking_uri, id_column=id_column
    )
    spec = OutputSpec(
        id_column=id_column,
        label_column="predicted",
        feature_columns=["probabilities"],
        classes=[],
        config={"model_uri": model_uri, "inputs": inputs},
    )
    with dask_client(dask) as client:
        manifest, location = map_to_version(inputs, transform, output_root, spec, client)
    return Predictions(
        manifest_uri=location,
        version_id=manifest.version_id,
        num_rows=manifest.split("predictions").num_rows,
    )
