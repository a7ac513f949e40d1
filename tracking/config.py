"""Typed configuration of the MLflow tracking adapter."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RunOrigin(BaseModel):
    """What started a run, as MLflow's UI shows it (Source, Created by)."""

    model_config = ConfigDict(extra="forbid")

    source_name: str = Field(
        description="The flow or command that ran (`ballast run pipeline`, a deployment's name)."
    )
    source_type: Literal["LOCAL", "JOB"] = Field(
        "LOCAL", description="`JOB` for a deployment's (scheduled) run, else `LOCAL`."
    )
    user: str | None = Field(
        None, description="Created by: None is the OS user; a deployment's run names it."
    )


class TrackingConfig(BaseModel):
    """Where and under which names a run is recorded in MLflow."""

    model_config = ConfigDict(extra="forbid")

    tracking_uri: str = Field(
        description="MLflow tracking URI: `sqlite:///path/mlflow.db` locally, `http://host:5000` "
        "for a server. The `./mlruns` file store is refused by MLflow 3.17."
    )
    experiment: str = Field("ballast", description="MLflow experiment name.")
    artifact_location: str | None = Field(
        None, description="Artifact root used when the experiment is created (any fsspec URI)."
    )
    run_id: str | None = Field(
        None, description="Resume logging into this run (set by the launcher, kept across retries)."
    )
    run_name: str | None = Field(None, description="Display name of a newly created run.")
    parent_run_id: str | None = Field(
        None,
        description="A new run is a child of this run (set by the pipeline: its night's run).",
    )
    origin: RunOrigin | None = Field(
        None,
        description="Source and user of a new run (set by the flows); None: this "
        "process's command line and the OS user.",
    )
    system_metrics_interval_s: float | None = Field(
        2.0,
        gt=0,
        description="Sample each node's CPU/memory/GPU this often (seconds; a "
        "job of a minute gets a curve of 30 points); None: off.",
    )
    registered_model_name: str | None = Field(
        "ballast-classifier",
        description="Register trained models under this name; None "
        "skips registration. A version becomes `champion` only if it beats the current one.",
    )
    spool_dir: str | None = Field(
        None,
        description="Local directory where what a down tracking server could not take "
        "is kept, one folder per run, until it is sent (at the run's close, or with "
        "`python -m tracking upload <folder>`). None: `~/.ballast/mlflow-spool`.",
    )
    delivery_wait_s: float = Field(
        60.0,
        ge=0,
        description="How long the end of a job (last metrics, the model, the "
        "run's close) keeps trying a tracking server that cannot be reached before keeping "
        "the rest in `spool_dir`. The start of a job never waits: training goes on.",
    )
