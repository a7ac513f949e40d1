"""Typed configuration of a reshard run. Read from YAML (a path or any fsspec URI) by
`preprocessing.toolbox.config_files.load_config(ReshardConfig, uri)`, which names the new
place of every field in `ReshardConfig.RENAMED`."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from preprocessing.storage.csv_reading import CSV_EMPTY_TEXT_HELP, CsvEmptyText
from preprocessing.storage.limits import DEFAULT_PART_BYTES, MIN_PART_BYTES
from preprocessing.storage.roots import overlap_problem
from preprocessing.toolbox.faults import RetryPolicy
from preprocessing.toolbox.setting_marks import (
    OUTPUT_NEUTRAL,
    comparable_settings,
    output_neutral_fields,
)
from preprocessing.toolbox.split_rules import column_settings_problem, time_holdout_problem

NullPolicy = Literal["error", "drop_row", "fill_zero", "fill_mean", "indicator"]


class DatasetSpec(BaseModel):
    """Where the raw files are and which columns mean what."""

    model_config = ConfigDict(extra="forbid")

    inputs: list[str] = Field(
        min_length=1,
        description="Input roots: directories, files or globs, local or any fsspec URI "
        "(`s3://bucket/prefix/*.parquet`). Directories are searched for `*.parquet`.",
    )
    label_column: str = Field("label", description="The class label of each row.")
    source_column: str | None = Field(
        "source", description="The source of each row; None takes the input root as the source."
    )
    id_column: str | None = Field(
        None,
        description="A unique integer row id, carried to every output row; None (the "
        "default): ballast derives one from each file's path relative to its input root and "
        "the row's index in the file (preprocessing/plan/row_ids.py), written as the column "
        "`__ballast_row_id`.",
    )
    feature_columns: list[str] = Field(
        default_factory=lambda: ["features"],
        description="Columns the model reads: numbers, "
        "booleans, timestamps and dates, fixed-size or variable-length lists of numbers, "
        "strings (categories); preprocessing/contract/codec.py says how each is encoded.",
    )
    nulls: dict[str, NullPolicy] = Field(
        default_factory=dict,
        description="Null policy per feature column: `error` (the "
        "default: the scan fails naming the column), `drop_row`, `fill_zero`, `fill_mean` "
        "(the scan's mean) or `indicator` (fill_mean plus a 0/1 is-null feature).",
    )
    standardize: bool = Field(
        True,
        description="Standardize numeric and temporal features by the scan's mean and "
        "standard deviation (stored in the manifest).",
    )
    max_categories: int = Field(
        1_000,
        gt=0,
        description="Most distinct values a string feature may hold; more fail "
        "the scan unless `category_buckets` is set.",
    )
    category_buckets: int | None = Field(
        None,
        gt=0,
        description="If set, a string feature with more than `max_categories` "
        "distinct values is hashed into this many buckets instead of failing the scan.",
    )
    sequence_length: int | None = Field(
        None,
        gt=0,
        description="Length that variable-length list features are padded or "
        "truncated to (with a mask); None: the longest list the scan finds.",
    )
    unlabelled: Literal["drop", "refuse"] = Field(
        "drop",
        description="Rows whose label is null (or NaN): `drop` (the default: "
        "unlabelled rows are normal in real data, and a file is not bad for holding some) "
        "leaves them out of the version and counts them per file (the manifest's "
        "`features.unlabelled_rows`, the run log, the summary); `refuse` rejects every file "
        "that holds one, naming its first such row.",
    )
    date_columns: list[str] = Field(
        default_factory=list,
        description="String feature columns that hold ISO 8601 dates "
        "or timestamps (`2024-03-01`, `2024-03-01T12:30:00Z`): encoded as temporal features "
        "(seconds since the epoch, standardized), not as categories.",
    )
    on_identifying_feature: Literal["warn", "refuse"] = Field(
        "warn",
        description="A string or integer feature column whose distinct values "
        "approach its row count identifies rows (a key, not a feature: a model memorises "
        "it): `warn` names it in the run log and the summary, `refuse` fails the scan.",
    )
    group_column: str | None = Field(
        None,
        description="Rows sharing this column's value (any type; a null is refused) share "
        "a split, decided by a seeded hash of the value (docs/data-path.md, splits); None "
        "(the default): each row's split is drawn alone.",
    )
    duplicates: Literal["keep", "same_split", "drop"] = Field(
        "keep",
        description="`keep` (the default): each copy of a row is drawn alone; `same_split`: "
        "rows equal in label, features (and group) share a split, by a hash of that content; "
        "`drop`: as `same_split`, and only the first copy of a night's inputs is kept (by "
        "file as listed, then row; rows committed by an earlier night are not dropped).",
    )
    validation_fraction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Input rows in the `validation` split (drawn after the holdout, by its "
        "rules: under `holdout_by: newest` the newest rows it leaves; unresampled) that "
        "training selects on; 0 (the default): it selects on the holdout, as before.",
    )
    holdout_by: Literal["random", "newest"] = Field(
        "random",
        description="`random` (the default): rows (or groups, or contents) drawn for the "
        "holdout by a seeded hash; `newest`: the newest rows by `holdout_column` held out "
        "(ties broken by a seeded hash of the row; docs/data-path.md, splits).",
    )
    holdout_column: str | None = Field(
        None,
        description="The date or timestamp column (or ISO 8601 strings; need not be a "
        "feature; a null is refused) whose newest rows `holdout_by: newest` holds out.",
    )
    csv_empty_text: CsvEmptyText = Field("empty_string", description=CSV_EMPTY_TEXT_HELP)
    max_classes: int = Field(
        1_000,
        gt=1,
        description="Most distinct label values; more fail the scan (a float "
        "label with many values is a regression target, not classes).",
    )

    @model_validator(mode="after")
    def _settings_that_go_together(self) -> DatasetSpec:
        if problem := column_settings_problem(self) or time_holdout_problem(self):
            raise ValueError(problem)
        return self


class MixConfig(BaseModel):
    """The target mix over classes, and over sources within each class."""

    model_config = ConfigDict(extra="forbid")

    class_weighting: Literal["uniform", "natural", "temperature", "explicit"] = Field(
        "uniform",
        description="`uniform`: every class equal; `natural`: as in the input; `temperature`: "
        "proportional to count**(1/temperature); `explicit`: `class_weights`.",
    )
    temperature: float = Field(2.0, gt=0, description="Used by `temperature` weighting.")
    class_weights: dict[str, float] | None = Field(
        None, description="Relative weight per class label (as a string), for `explicit`."
    )
    source_weighting: Literal["natural", "uniform", "explicit"] = Field(
        "natural", description="The mix of sources within each class."
    )
    source_weights: dict[str, float] | None = Field(
        None, description="Relative weight per source, for `explicit` source weighting."
    )
    max_oversample: float | None = Field(
        None, gt=0, description="Cap on output/input rows per stratum; the excess goes elsewhere."
    )

    @model_validator(mode="after")
    def _explicit_weights_given(self) -> MixConfig:
        if self.class_weighting == "explicit" and not self.class_weights:
            raise ValueError("mix.class_weights is required when class_weighting is 'explicit'")
        if self.source_weighting == "explicit" and not self.source_weights:
            raise ValueError("mix.source_weights is required when source_weighting is 'explicit'")
        return self


class IncrementalConfig(BaseModel):
    """How a `mode: incremental` run treats the chain of versions it appends to
    (preprocessing/versions/incremental.py); a `mode: full` run reads none of it."""

    model_config = ConfigDict(extra="forbid")

    on_changed_inputs: Literal["refuse", "rebuild"] = Field(
        "refuse",
        description="When an input of the current version was "
        "rewritten or removed (or the settings or ballast's version differ), `refuse` fails "
        "naming them, `rebuild` makes a full version instead.",
    )
    max_chain_length: int = Field(
        16,
        ge=1,
        description="Most versions in a chain, its flat base "
        "included; a run that would make a longer one compacts (a full reshard) instead.",
    )
    max_small_shard_fraction: float = Field(
        0.25,
        ge=0,
        le=1,
        description="When more than this fraction of "
        "the current chain's training shards hold under half the rows of its largest, the "
        "run compacts (a full reshard) instead of appending.",
    )


class ReshardConfig(BaseModel):
    """One reshard: raw files in, one committed dataset version out."""

    model_config = ConfigDict(extra="forbid")
    # Fields that moved: a config with an old name is refused naming the new place
    # (preprocessing/toolbox/config_files.py).
    RENAMED: ClassVar[dict[str, str]] = {
        name: f"incremental.{name}"
        for name in ("on_changed_inputs", "max_chain_length", "max_small_shard_fraction")
    }

    dataset: DatasetSpec
    output_root: str = Field(
        json_schema_extra=OUTPUT_NEUTRAL,
        description="Versions are written under this root (local or s3://).",
    )
    mix: MixConfig = Field(default_factory=MixConfig)
    shuffle: Literal["stratified", "global", "block", "none"] = Field(
        "stratified",
        description="`stratified`: global, and every shard's class mix equals the overall mix "
        "to within one row per class; `global`: a uniform permutation of all output rows; "
        "`block`: row groups in random order, rows shuffled within each shard; `none`: input "
        "order kept (contiguous rebalance). The last two resample systematically.",
    )
    seed: int = Field(0, description="Seeds every random decision; same seed, same dataset.")
    num_output_rows: int | None = Field(
        None, gt=0, description="Training rows to write; None keeps the input's training rows."
    )
    target_shard_rows: int = Field(50_000, gt=0, description="Rows per shard, at most.")
    target_shard_bytes: int | None = Field(
        None,
        gt=0,
        description="If set, rows per shard = this / the inputs' bytes per row "
        "(compressed, as stored), instead of `target_shard_rows`.",
    )
    rows_per_row_group: int = Field(8_192, gt=0, description="Rows per Parquet row group.")
    max_piece_rows: int = Field(
        1_000_000,
        gt=0,
        description="Most input rows one task holds: larger row groups and "
        "CSV / JSON Lines files are cut into ranges of this many rows.",
    )
    holdout_fraction: float = Field(
        0.1, ge=0, lt=1, description="Input rows held out, unresampled, to evaluate, promote."
    )
    max_rejected_fraction: float = Field(
        0.0, ge=0, le=1, description="Fail when more than this fraction of input files is bad."
    )
    num_workers: int = Field(
        2,
        gt=0,
        json_schema_extra=OUTPUT_NEUTRAL,
        description="Dask worker processes of a local cluster.",
    )
    retry: RetryPolicy = Field(
        default_factory=RetryPolicy,
        json_schema_extra=OUTPUT_NEUTRAL,
        description="Retries "
        "of reads that failed for a reason that may pass (S3 503 / 500, resets, timeouts, "
        "bodies cut short): preprocessing/toolbox/faults.py.",
    )
    progress_deadline_s: float = Field(
        60.0,
        gt=0,
        json_schema_extra=OUTPUT_NEUTRAL,
        description="The least time a worker of a data stage (scan, exchange, write; the one "
        "pass of a single-pass route) may go without a scheduler heartbeat while the stage "
        "runs; past its deadline (this, or progress_deadline_factor x the stage's median "
        "task time so far when longer) it is named in the log (address, tasks, seconds "
        "silent) and removed from the cluster, its tasks run on the other workers "
        "(preprocessing/driver/waves.py StallWatch). A worker that is slow but heartbeats is "
        "never removed; Dask's own timeout took 592 s.",
    )
    progress_deadline_factor: float = Field(
        3.0,
        ge=0,
        json_schema_extra=OUTPUT_NEUTRAL,
        description="The stall deadline grows to this many times the median time of the "
        "stage's tasks so far (from submission to result), for tasks that may keep their "
        "worker from heartbeating about as long as they run; 0: progress_deadline_s alone.",
    )
    # The exchange's shape (docs/data-path.md, step 4): how fast and in how many requests a
    # version is made, never what is in it, so none of these changes the version id.
    exchange_task_bytes: int = Field(
        64 << 20,
        gt=0,
        json_schema_extra=OUTPUT_NEUTRAL,
        description="Input bytes (as "
        "stored) one map task reads: consecutive pieces are grouped up to this size; merge "
        "and write tasks hold about as much.",
    )
    single_pass_bytes: int | None = Field(
        None,
        ge=0,
        json_schema_extra=OUTPUT_NEUTRAL,
        description="A reshard whose rows to hold (estimated in decoded bytes: every input "
        "row, the largest shard and the routing's index arrays) fit this is made in one "
        "pass in memory, with nothing staged; a larger one is staged (docs/data-path.md, "
        "step 4). Same shards either way. None: one eighth of the host's memory; 0: always staged.",
    )
    exchange_fan_in: int | None = Field(
        None,
        ge=2,
        json_schema_extra=OUTPUT_NEUTRAL,
        description="Most staged objects a "
        "merge or write task reads from; None: on an object store exchange_task_bytes / 1 "
        "MiB, between 2 and 64 (a merge read is task bytes / fan-in), on local staging "
        "1024 (a read is a memory map, a merge round one more copy of every row).",
    )
    exchange_rounds: int | None = Field(
        None,
        ge=1,
        json_schema_extra=OUTPUT_NEUTRAL,
        description="Rounds of reads of staged "
        "objects: 1 = the shard writes read the map outputs; None: the fewest whose reads "
        "stay within the fan-in.",
    )
    max_tasks_in_flight: int | None = Field(
        None,
        gt=0,
        json_schema_extra=OUTPUT_NEUTRAL,
        description="Tasks submitted to Dask "
        "and not yet done, at most; None: 4 per worker thread, at least 8.",
    )
    upload_part_bytes: int = Field(
        DEFAULT_PART_BYTES,
        ge=MIN_PART_BYTES,
        json_schema_extra=OUTPUT_NEUTRAL,
        description="Part size of multipart uploads to S3: a staged object or shard of at "
        "least twice this goes up in parts of this size, sent concurrently, a smaller one in "
        "one PUT; at least 5 MiB (S3's smallest part).",
    )
    resume_max_age_s: float = Field(
        7 * 24 * 3600.0,
        gt=0,
        json_schema_extra=OUTPUT_NEUTRAL,
        description="A run of a version takes over the staging of a dead attempt of the "
        "same version whose last heartbeat is at most this old, and keeps what verifies "
        "(preprocessing/driver/resume.py); an older one is removed, never reused.",
    )
    # How a run relates to the version `_CURRENT` names (preprocessing/versions/incremental.py).
    mode: Literal["full", "incremental"] = Field(
        "full",
        json_schema_extra=OUTPUT_NEUTRAL,
        description="`full`: reshard every input "
        "into one flat version (run it to compact a chain); `incremental`: when the inputs "
        "are the current version's plus new files, reshard only the new files into a child "
        "version that lists the parent's shards without copying them (`incremental:` says "
        "when it refuses or compacts instead).",
    )
    incremental: IncrementalConfig = Field(
        default_factory=IncrementalConfig,
        json_schema_extra=OUTPUT_NEUTRAL,
        description="How a `mode: incremental` run appends, refuses or compacts.",
    )

    @model_validator(mode="after")
    def _incremental_total_not_fixed(self) -> ReshardConfig:
        if self.mode == "incremental" and self.num_output_rows is not None:
            raise ValueError(
                "num_output_rows fixes the total rows, which appending new files "
                "cannot keep: leave it unset with mode 'incremental'"
            )
        return self

    @model_validator(mode="after")
    def _some_rows_left_to_train(self) -> ReshardConfig:
        if (held := self.holdout_fraction + self.dataset.validation_fraction) >= 1:
            raise ValueError(
                f"holdout_fraction and dataset.validation_fraction add up to {held:g}: "
                "no rows left to train on; together they must be under 1"
            )
        return self

    @model_validator(mode="after")
    def _output_apart_from_inputs(self) -> ReshardConfig:
        if problem := overlap_problem(self.output_root, self.dataset.inputs):
            raise ValueError(problem)
        return self

    def output_settings(self) -> dict[str, Any]:
        """The settings that decide a flat version's content (every field not marked
        OUTPUT_NEUTRAL): part of its version id."""
        return comparable_settings(
            self.model_dump(mode="json", exclude=set(output_neutral_fields(ReshardConfig)))
        )

    @property
    def stall_deadline(self) -> tuple[float, float]:
        """A data stage's stall deadline: its floor (s) and its factor of the median task."""
        return self.progress_deadline_s, self.progress_deadline_factor
