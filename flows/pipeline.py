"""The flows: `reshard`, `train`, `evaluate`, `batch_inference` and `pipeline`.

Flows only orchestrate: every step is a task in flows/tasks.py that calls one
function of preprocessing/, training/ or tracking/. Training runs as its own
process group started by a launcher of training/launch/ (never a multi-process
Trainer in this process: docs/architecture.md M1), which also retries it. Prefect never
retries a flow (no flow sets `retries`) and retries an I/O task only on a transient
failure (flows/tasks.py `TRANSIENT_RETRIES`): a config or data error fails once. What each
step produced is logged to the flow run's log (flows/runlog.py) as it comes back.
Each flow's `overrides` are applied to its parameters before it starts (flows/overrides.py).
"""

from __future__ import annotations

from contextlib import nullcontext

from prefect import get_run_logger
from prefect.runtime import flow_run
from prefect.utilities.annotations import quote

from flows import runlog, tasks
from flows.arms import NATURAL_MIX, arm_for
from flows.night import night_run, with_origin
from flows.overrides import NO_OVERRIDES
from flows.params import (
    EvaluateParams,
    InferenceParams,
    PipelineParams,
    ReshardParams,
    TrainParams,
    ballast_flow,
)
from flows.promotion import promote
from flows.report import (
    publish_dataset,
    publish_training,
    run_description,
    version_description,
)
from flows.results import (
    DatasetVersion,
    Evaluation,
    PipelineResult,
    Predictions,
    Registration,
    TrainingResult,
)
from preprocessing.config import ReshardConfig
from preprocessing.contract.manifest import Manifest, read_current_version, read_manifest
from preprocessing.driver.cluster import DaskConfig, Executor, dask_client, run_executor
from preprocessing.driver.reshard import (
    Listing,
    list_once,
    plan_version,
    version_is_committed,
)
from tracking.config import TrackingConfig
from tracking.lifecycle.promotion import PromotionConfig
from tracking.lifecycle.scoring import on_cluster
from training.config import TrainConfig
from training.launch import AnyJob, LaunchConfig, LocalJob

# The flows' defaults, the same as their parameter models' (flows/params.py checks).
DASK, LOCAL_JOB, PROMOTION = DaskConfig(), LocalJob(), PromotionConfig()
NO_INPUTS: list[str] = []  # never mutated: the flow copies it


def _reshard(
    config: ReshardConfig, dask: Executor, arm: str, listing: Listing | None = None
) -> tuple[DatasetVersion, Manifest]:
    """The version of `config` (made, reused or a cache hit), logged; and its manifest.
    `listing`: `config`'s inputs as listed for another arm (the same inputs); else listed
    here. The version is planned here, once: the reshard task gets the plan."""
    # The cache is keyed by version id; a version deleted since it was cached is made again.
    plan = plan_version(config, listing)
    runlog.log_reshard_start(
        arm, plan.version_id, config.dataset.inputs, config.mix.class_weighting
    )
    committed = version_is_committed(config.output_root, plan.version_id)
    task = tasks.reshard.with_options(refresh_cache=not committed)
    # quote(): Prefect would otherwise walk every input file looking for upstream results.
    state = task(config, dask, plan.version_id, arm, quote(plan), return_state=True)
    dataset = DatasetVersion.of(state.result()).from_cache(state.name == "Cached")
    manifest, _ = read_manifest(dataset.manifest_uri)
    runlog.log_dataset(arm, manifest, dataset.reused, dataset.cached)
    publish_dataset(manifest, arm)
    return dataset, manifest


def _tracked_job(config: TrainConfig, job: AnyJob, dataset: str, arm: str) -> TrainingResult:
    """Run the job on `dataset` (its launcher pins the version and opens the MLflow run),
    then close the run; the finished job."""
    training = tasks.train(
        config.model_copy(update={"dataset": dataset, "tracking": _run_named(config, arm)}),
        job,
        arm,
        flow_run.get_id(),  # the run's own folders: a retry of this flow run resumes them
    )
    runlog.log_training(arm, training)
    if config.tracking is not None and training.run_id is not None:
        checkpoints = training.checkpoint_uri or config.checkpoint_uri
        tasks.close_run(config.tracking, training.run_id, training, checkpoints, arm)
    return training


def _run_named(config: TrainConfig, arm: str) -> TrackingConfig | None:
    """The job's tracking, its new run named `<flow run name>-<arm>` (`<run_name>-<arm>`
    when the config names runs): one scheme for every arm, so a flow run's MLflow runs
    are found by its name; its source is the flow run's (flows/night.py `run_origin`)."""
    tracking = config.tracking
    if tracking is None or tracking.run_id is not None:
        return tracking
    base = tracking.run_name or flow_run.get_name() or "ballast"
    return with_origin(tracking).model_copy(update={"run_name": f"{base}-{arm}"})


@ballast_flow("reshard", ReshardParams)
def reshard_flow(
    *, reshard: ReshardConfig, dask: DaskConfig = DASK, overrides: list[str] = NO_OVERRIDES
) -> DatasetVersion:
    """Reshard raw files into a balanced, committed dataset version."""
    dataset, _ = _reshard(reshard, dask, arm_for(reshard.mix.class_weighting))
    return dataset


@ballast_flow("train", TrainParams)
def train_flow(
    *, train: TrainConfig, job: LaunchConfig = LOCAL_JOB, overrides: list[str] = NO_OVERRIDES
) -> TrainingResult:
    """One tracked training job on a dataset version."""
    manifest, _ = read_manifest(train.dataset)
    arm = arm_for(manifest.config["mix"]["class_weighting"])
    training = _tracked_job(train, job, train.dataset, arm)
    publish_training(training, train.tracking.tracking_uri if train.tracking else None, arm)
    return training


@ballast_flow("evaluate", EvaluateParams)
def evaluate_flow(
    *,
    model_uri: str,
    dataset: str,
    tracking: TrackingConfig,
    baseline_model_uri: str | None = None,
    split: str = "holdout",
    dask: DaskConfig = DASK,
    overrides: list[str] = NO_OVERRIDES,
) -> dict[str, Evaluation]:
    """Per-class recall and macro-F1 of a model (and a baseline model) on a held-out
    split, each with the class-prior baseline and whether it beats it."""
    models = {"model": model_uri}
    if baseline_model_uri:
        models["baseline"] = baseline_model_uri
    with dask_client(dask) if on_cluster(dataset, split) else nullcontext(dask) as executor:
        # One cluster for both models, and none for a split scored in process.
        evaluations = {
            name: tasks.evaluate(uri, tracking, dataset, split, executor, name)
            for name, uri in models.items()
        }
    for name, evaluation in evaluations.items():
        runlog.log_evaluation(name, evaluation)
    return evaluations


@ballast_flow("batch_inference", InferenceParams)
def batch_inference_flow(
    *,
    model_uri: str,
    tracking: TrackingConfig,
    dataset: str | None = None,
    inputs: list[str] = NO_INPUTS,
    split: str = "train",
    id_column: str | None = None,
    output_root: str,
    dask: DaskConfig = DASK,
    overrides: list[str] = NO_OVERRIDES,
) -> Predictions:
    """Predictions of a model over a dataset version (or Parquet files), as a new version."""
    params = InferenceParams(
        model_uri=model_uri,
        tracking=tracking,
        dataset=dataset,
        inputs=inputs,
        split=split,
        id_column=id_column,
        output_root=output_root,
        dask=dask,
    )
    inputs = list(params.inputs)
    if params.dataset:
        inputs += tasks.split_uris(params.dataset, params.split)
    if not inputs:
        raise ValueError("batch_inference needs `dataset` or `inputs`")
    output = tasks.predict(
        inputs,
        params.model_uri,
        params.tracking,
        _id_column(params),
        params.output_root,
        params.dask,
    )
    runlog.log_predictions(output)
    return output


def _id_column(params: InferenceParams) -> str:
    """The configured `id_column`, else the one `dataset`'s manifest names (a version made
    without an id column has the derived `__ballast_row_id`)."""
    if params.id_column is not None:
        return params.id_column
    if params.dataset is None:
        raise ValueError(
            "batch_inference: `id_column` is required with `inputs` alone (no "
            "`dataset` version to take it from): name the files' row id column"
        )
    return read_manifest(params.dataset)[0].id_column


@ballast_flow("pipeline", PipelineParams)
def pipeline(
    *,
    reshard: ReshardConfig,
    dask: DaskConfig = DASK,
    train: TrainConfig,
    job: LaunchConfig = LOCAL_JOB,
    compare_with_natural_mix: bool = False,
    promotion: PromotionConfig = PROMOTION,
    overrides: list[str] = NO_OVERRIDES,
) -> PipelineResult:
    """Reshard, train on the new version, evaluate on held-out rows, register the model.
    A local or running Dask cluster serves every step of the run that needs one (both arms'
    reshards and evaluations): starting one costs seconds, and its workers keep the models
    they loaded. A cluster of batch jobs (SLURM, PBS, Kubernetes) is started per Dask step
    instead and its jobs end with the step (`run_executor`): none waits idle through
    training, or reaches its walltime between steps."""
    params = PipelineParams(
        reshard=reshard,
        dask=dask,
        train=train,
        job=job,
        compare_with_natural_mix=compare_with_natural_mix,
        promotion=promotion,
    )
    # The night's MLflow run is the parent of every run this one makes (flows/night.py).
    with run_executor(params.dask) as executor, night_run(params) as night:
        return night.close(_pipeline(night.params, executor))


def _pipeline(params: PipelineParams, dask: Executor) -> PipelineResult:
    arm = arm_for(params.reshard.mix.class_weighting)
    listing = list_once(params.reshard)  # both arms read the same inputs
    current_before = read_current_version(params.reshard.output_root)  # the drift's parent
    dataset, _ = _reshard(params.reshard, dask, arm, listing)
    training = _tracked_job(params.train, params.job, dataset.manifest_uri, arm)
    result = PipelineResult.of(dataset, training)
    tracking = params.train.tracking
    if tracking is not None and training.model_uri:
        arms = {arm: training, **_other_arms(params, tracking, arm, dask, listing)}
        result = result.model_copy(
            update={
                "runs": {name: job.run_id for name, job in arms.items()},
                "evaluations": _evaluations(tracking, dataset.manifest_uri, arms, dask),
            }
        )
        if tracking.registered_model_name:
            registration = _register(params, tracking, result, current_before, arm, dask)
            result = result.model_copy(update={"registration": registration})
    publish_training(training, tracking.tracking_uri if tracking else None, arm, result)
    return result


def _other_arms(
    params: PipelineParams, tracking: TrackingConfig, arm: str, dask: Executor, listing: Listing
) -> dict[str, TrainingResult]:
    """The natural-mix arm's finished job, when asked for and not this run's own arm."""
    if params.compare_with_natural_mix and arm == NATURAL_MIX:
        get_run_logger().warning(
            "compare_with_natural_mix: this run already trains on the "
            "natural class mix; there is no other arm to compare with"
        )
    if not params.compare_with_natural_mix or arm == NATURAL_MIX:
        return {}
    return {NATURAL_MIX: _natural_mix_job(params, tracking, dask, listing)}


def _evaluations(
    tracking: TrackingConfig, manifest_uri: str, arms: dict[str, TrainingResult], dask: Executor
) -> dict[str, Evaluation]:
    """Each arm's model on the same held-out rows (this run's version's), the figures
    logged to the arm's MLflow run too."""
    evaluations = {
        name: tasks.evaluate(
            str(job.model_uri),
            tracking,
            manifest_uri,
            "holdout",
            dask,
            name,
            job.run_id,
            run_description(name, job, manifest_uri, flow_run.get_name()),
        )
        for name, job in arms.items()
    }
    for name, evaluation in evaluations.items():
        runlog.log_evaluation(name, evaluation)
    return evaluations


def _register(
    params: PipelineParams,
    tracking: TrackingConfig,
    result: PipelineResult,
    current_before: str | None,
    arm: str,
    dask: Executor,
) -> Registration:
    """Register the model, described; flows/promotion.py decides its alias on the same
    rows as the champion's (and holds it back on drift against the parent version)."""
    registration = promote(
        tracking,
        params.promotion,
        dask,
        result.challenger(arm),
        current_before,
        arm,
        version_description(result, arm, flow_run.get_name()),
    )
    runlog.log_registration(arm, registration)
    return registration


def _natural_mix_job(
    params: PipelineParams, tracking: TrackingConfig, dask: Executor, listing: Listing
) -> TrainingResult:
    """Train the same model on the data as it came (same held-out rows: same seed/files);
    the finished job."""
    natural = params.reshard.model_copy(
        update={
            "output_root": f"{params.reshard.output_root.rstrip('/')}-natural",
            "mix": params.reshard.mix.model_copy(update={"class_weighting": "natural"}),
            "num_output_rows": None,
        }
    )
    dataset, _ = _reshard(natural, dask, NATURAL_MIX, listing)
    # Its own outputs, checkpoints and run: sharing them, a retry would resume the other job.
    checkpoint_dir = params.train.checkpoint_dir
    train = params.train.model_copy(
        update={
            "output_dir": f"{params.train.output_dir.rstrip('/')}-natural",
            "checkpoint_dir": f"{checkpoint_dir.rstrip('/')}-natural" if checkpoint_dir else None,
            "tracking": tracking.model_copy(update={"run_id": None}),
        }
    )
    return _tracked_job(train, params.job, dataset.manifest_uri, NATURAL_MIX)
