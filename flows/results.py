"""The typed results the flows pass between their steps (Prefect's own examples return
dataclasses): a step names what it produced, and the flow only passes it on.

Each is frozen. The pydantic ones are built by the task that calls preprocessing/,
training/ or tracking/ (whose functions return plain dicts, below the flows) with
`model_validate`, which names the field a changed producer no longer gives; Prefect pickles
them like any value, and `ballast run --output json` writes `to_jsonable_python` of them.
`DatasetVersion` stays a dataclass: the reshard task's results are cached (pickled) across
runs, and a cached one must load as the class it was stored as.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from pydantic import BaseModel, ConfigDict

from tracking.lifecycle.promotion import SameRows


@dataclass(frozen=True)
class DatasetVersion:
    """A reshard's outcome: the version's manifest URI and id, whether it was there already
    (`reused`), whether Prefect's cache answered (`cached`), and the route that made it
    (`single_pass` or `staged`, preprocessing/plan/route.py; "" for a version made before
    routes); under `duplicates: drop`, the input rows its night left out as copies."""

    manifest_uri: str
    version_id: str
    reused: bool
    cached: bool = False
    route: str = ""
    duplicates_dropped: int = 0

    @classmethod
    def of(cls, value: DatasetVersion | dict[str, Any]) -> DatasetVersion:
        """`value`, or a reshard result cached as a dict by an earlier release."""
        return value if isinstance(value, DatasetVersion) else cls(**value)

    def from_cache(self, cached: bool) -> DatasetVersion:
        """This version as the flow saw it: a cache hit is reused too."""
        return replace(self, reused=self.reused or cached, cached=cached)


class StepResult(BaseModel):
    """A step's result: frozen, and no field its producer does not name."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Evaluation(StepResult):
    """One model's scores on a split (tracking/lifecycle/scoring.py `evaluate`), with the
    class-prior baseline's figures on the same rows and whether the model beats both."""

    model_uri: str | None = None  # None: an in-process model, not a logged one
    dataset_version: str
    num_rows: int
    macro_f1: float
    balanced_accuracy: float
    recall: dict[str, float | None]  # per class; None for a class without support
    class_prior_baseline: dict[str, float]  # macro_f1 and balanced_accuracy
    beats_class_prior: bool


class JobAttempt(StepResult):
    """One attempt of a training job (training/launch/job.py `attempt_record`)."""

    returncode: int
    resume: bool
    resumed_from: str | None
    elapsed_s: float
    ended_at: float
    cause: str | None = None  # a failed attempt's: e.g. which rank hung
    job_id: str | None = None  # the batch job it ran as (job.kind slurm)
    error: str | None = None


class TrainingResult(StepResult):
    """A finished training job: the fields the flows read, typed; the job's other figures
    (`summary.json`: losses, memory, step times per rank, the straggler) ride along as
    extra fields, unread by the flows, for MLflow, the run log and `--output json`."""

    model_config = ConfigDict(frozen=True, extra="allow")

    run_id: str | None  # None: tracking off
    manifest_uri: str  # the dataset version it trained on
    model_uri: str | None = None  # None: tracking off, or no model logged
    world_size: int
    epochs: int | None = None
    batches_per_rank: list[int]
    val_macro_f1: float | None = None
    val_loss: float | None = None
    # The split the `val_*` figures (so any early stopping or checkpoint choice) were on:
    # `validation`, or `holdout` when the version has no validation split.
    checkpoint_chosen_on: str | None = None
    attempts: list[JobAttempt]
    tracking_delivery: dict[str, Any] | None = None  # the MLflow logger's delivery report
    run_key: str | None = None  # the run's folder name under output_dir/runs/
    checkpoint_uri: str | None = None  # the run's own checkpoints
    config_sha256: str | None = None  # of the pinned config the ranks ran

    def figures(self) -> dict[str, Any]:
        """The whole summary as the job wrote it (with `attempts`, `run_id`, ...)."""
        return self.model_dump(mode="json")


class DriftSummary(StepResult):
    """The new version against its parent: the mix PSIs, rows and thresholds passed."""

    parent: str
    class_psi: float
    source_psi: float
    rows: dict[str, int]
    breaches: list[str]


class Registration(StepResult):
    """A registered model version and its alias (tracking/lifecycle/registry.py). A
    registration of the pipeline's promotion step has `reasons`, `same_rows` and `drift`;
    one outside it (None reasons) was decided on the scores the versions were registered
    with."""

    name: str
    version: int
    alias: str | None  # None: it beats neither the champion nor the class prior
    score: float
    beats_class_prior: bool
    previous_champion: int | None = None
    previous_champion_score: float | None = None
    same_rows: SameRows | None = None
    reasons: list[str] | None = None
    held_back: bool = False
    drift: DriftSummary | None = None


class Challenger(StepResult):
    """A trained model up for registration: the version it trained on, its MLflow run, the
    logged model and its held-out evaluation."""

    manifest_uri: str
    run_id: str
    model_uri: str
    evaluation: Evaluation


class Predictions(StepResult):
    """A batch inference's output, committed as a dataset version."""

    manifest_uri: str
    version_id: str
    num_rows: int


class PipelineResult(StepResult):
    """What a pipeline run made: its dataset version (the fields of `DatasetVersion`), the
    training job and its run, and, with tracking and a logged model, every arm's run and
    held-out evaluation (this run's own arm first), the registration and the night's run
    (flows/night.py)."""

    manifest_uri: str
    version_id: str
    reused: bool
    cached: bool
    route: str = ""  # DatasetVersion's: the route that made the version
    duplicates_dropped: int = 0  # DatasetVersion's: its night's copies left out (`drop`)
    run_id: str | None
    training: TrainingResult
    runs: dict[str, str | None] = {}
    evaluations: dict[str, Evaluation] = {}
    registration: Registration | None = None
    night_run_id: str | None = None  # the flow run's own MLflow run, the arms' runs' parent

    @classmethod
    def of(cls, dataset: DatasetVersion, training: TrainingResult) -> PipelineResult:
        """The run so far: its version and the job trained on it."""
        return cls(**asdict(dataset), run_id=training.run_id, training=training)

    def challenger(self, arm: str) -> Challenger:
        """This run's model, up for registration with `arm`'s held-out evaluation."""
        if self.run_id is None or self.training.model_uri is None:
            raise ValueError("a pipeline run without an MLflow run or model registers nothing")
        return Challenger(
            manifest_uri=self.manifest_uri,
            run_id=self.run_id,
            model_uri=self.training.model_uri,
            evaluation=self.evaluations[arm],
        )
