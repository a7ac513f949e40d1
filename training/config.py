"""Typed configuration of a training job, loaded from YAML by `python -m training`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from tracking.config import TrackingConfig


class LoaderConfig(BaseModel):
    """How a split of a dataset version is streamed to every rank."""

    model_config = ConfigDict(extra="forbid")

    batch_size: int = Field(64, gt=0, description="Samples per batch on each rank.")
    num_workers: int = Field(0, ge=0, description="DataLoader worker processes per rank.")
    remainder: Literal["drop", "pad"] = Field(
        "drop",
        description="Samples left over after the last full global batch: `drop` them, or `pad` "
        "the last global batch with repeats that carry weight 0 (used for validation).",
    )


class ModelConfig(BaseModel):
    """The built-in feature classifier (an MLP over the feature columns)."""

    model_config = ConfigDict(extra="forbid")

    hidden_sizes: list[int] = Field([64, 64], description="Width of each hidden layer.")
    learning_rate: float = Field(3e-3, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(1e-4, ge=0, description="AdamW weight decay.")


class TrainConfig(BaseModel):
    """One training job on one dataset version."""

    model_config = ConfigDict(extra="forbid")

    dataset: str = Field(
        description="Manifest URI, version directory or output root (read through `_CURRENT`)."
    )
    output_dir: str = Field(description="Checkpoints and `summary.json` go here.")
    seed: int = Field(0, description="Seeds weights and the sample order of every epoch.")
    max_epochs: int = Field(3, gt=0, description="Passes over the training split.")
    strategy: Literal["ddp", "auto"] = Field("ddp", description="Lightning strategy.")
    process_group_timeout_s: int = Field(
        120, gt=0, description="A peer silent this long fails the job instead of hanging it."
    )
    loader: LoaderConfig = Field(default_factory=LoaderConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    tracking: TrackingConfig | None = Field(None, description="MLflow target; None logs nothing.")


def load_train_config(path: str | Path) -> TrainConfig:
    """Read a YAML training config; validation errors name the bad field."""
    with open(path) as handle:
        return TrainConfig.model_validate(yaml.safe_load(handle) or {})
