"""Typed configuration of a reshard run, loaded from YAML by `python -m preprocessing`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator


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
    id_column: str = Field("id", description="A unique row id, carried to every output row.")
    feature_columns: list[str] = Field(
        default_factory=lambda: ["features"], description="Columns the model reads."
    )


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


class ReshardConfig(BaseModel):
    """One reshard: raw files in, one committed dataset version out."""

    model_config = ConfigDict(extra="forbid")

    dataset: DatasetSpec
    output_root: str = Field(description="Versions are written under this root (local or s3://).")
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
        None, gt=0, description="If set, rows per shard = this / the inputs' bytes per row "
        "(compressed, as stored), instead of `target_shard_rows`.")
    rows_per_row_group: int = Field(8_192, gt=0, description="Rows per Parquet row group.")
    max_piece_rows: int = Field(
        1_000_000, gt=0, description="Most input rows one task holds: larger row groups and "
        "CSV / JSON Lines files are cut into ranges of this many rows.")
    holdout_fraction: float = Field(
        0.1, ge=0, lt=1, description="Input rows held out, unresampled, for validation."
    )
    max_rejected_fraction: float = Field(
        0.0, ge=0, le=1, description="Fail when more than this fraction of input files is bad."
    )
    num_workers: int = Field(2, gt=0, description="Dask worker processes of a local cluster.")
    # The exchange's shape (docs/architecture.md 3, M23): how fast and in how many requests a
    # version is made, never what is in it, so none of these changes the version id.
    exchange_task_bytes: int = Field(
        64 << 20, gt=0, description="Input bytes (as stored) one map task reads: consecutive "
        "pieces are grouped up to this size; merge and write tasks hold about as much.")
    exchange_fan_in: int | None = Field(
        None, ge=2, description="Most staged objects a merge or write task reads from; None: "
        "exchange_task_bytes / 1 MiB, between 2 and 64 (a merge read is task bytes / fan-in).")
    exchange_rounds: int | None = Field(
        None, ge=1, description="Rounds of reads of staged objects: 1 = the shard writes read "
        "the map outputs; None: the fewest whose reads stay within the fan-in.")
    max_tasks_in_flight: int | None = Field(
        None, gt=0, description="Tasks submitted to Dask and not yet done, at most; None: "
        "4 per worker thread, at least 8.")


def load_reshard_config(path: str | Path) -> ReshardConfig:
    """Read a YAML reshard config; validation errors name the bad field."""
    with open(path) as handle:
        return ReshardConfig.model_validate(yaml.safe_load(handle) or {})
