"""The settings of a job's model: which LightningModule trains (`model.class_path`), and
the sizes of the built-in ones. Part of the job's config (training/config.py), kept apart
so that file stays one concern a model; validation errors name the field."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

BUILTIN_MODELS = {
    "classifier": "training.models.classifier:FeatureClassifier",
    "transformer": "training.models.transformer:TokenClassifier",
    "tabular": "training.models.tabular:TabularClassifier",
}
CLASS_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


class TransformerConfig(BaseModel):
    """Sizes of the built-in token transformer (training/models/transformer.py)."""

    model_config = ConfigDict(extra="forbid")

    vocab_size: int = Field(4096, gt=1, description="Token ids are in [0, vocab_size).")
    d_model: int = Field(256, gt=0, description="Width of the residual stream.")
    num_layers: int = Field(4, gt=0, description="Transformer blocks (the unit FSDP shards).")
    num_heads: int = Field(
        8, gt=0, description="Attention heads; a multiple of the tensor-parallel size."
    )
    ffn_mult: int = Field(4, gt=0, description="Feed-forward width as a multiple of d_model.")

    @model_validator(mode="after")
    def heads_divide_width(self) -> TransformerConfig:
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must divide d_model ({self.d_model})")
        return self


class TabularConfig(BaseModel):
    """The settings of the `tabular` model (training/models/tabular.py)."""

    model_config = ConfigDict(extra="forbid")

    ensemble_size: int = Field(8, gt=0, description="Members sharing the MLP (TabM-mini).")
    frequencies: int = Field(16, gt=0, description="Periodic embedding: frequencies a column.")
    embedding_size: int = Field(8, gt=0, description="Periodic embedding: its width a column.")
    frequency_scale: float = Field(
        0.1, gt=0, description="Periodic embedding: the deviation of its initial frequencies."
    )
    max_embedded_width: int = Field(
        256, ge=0, description="Above this many input columns, no embeddings (wide tables)."
    )
    dropout: float = Field(0.1, ge=0, lt=1, description="Dropout after each hidden layer.")
    label_smoothing: float = Field(0.1, ge=0, lt=1, description="Of the training loss.")


class ModelConfig(BaseModel):
    """Which LightningModule trains, and the settings of the built-in ones."""

    model_config = ConfigDict(extra="forbid")

    class_path: str = Field(
        "classifier",
        description="`classifier` (MLP over features), `tabular` (embeddings and an ensemble "
        "of MLPs over features), `transformer` (over token ids), or a "
        'LightningModule by import path "pkg.module:Class", built as '
        "Class(num_features, classes, model) with `model` this config as a dict.",
    )
    hidden_sizes: list[int] = Field([64, 64], description="Classifier: width of each layer.")
    transformer: TransformerConfig = Field(
        default_factory=TransformerConfig, description="Transformer: its sizes."
    )
    tabular: TabularConfig = Field(
        default_factory=TabularConfig, description="Tabular: its embeddings and ensemble."
    )
    optimizer: Literal["adamw", "sgd"] = Field(
        "adamw",
        description="`adamw` (torch's fused kernel where every parameter allows it), or `sgd` "
        "with Nesterov momentum 0.9.",
    )
    learning_rate: float = Field(3e-3, gt=0, description="Learning rate.")
    weight_decay: float = Field(1e-4, ge=0, description="Weight decay (decoupled for AdamW).")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Free-form settings read by a user model class."
    )

    @field_validator("class_path")
    @classmethod
    def known_or_importable(cls, value: str) -> str:
        if value not in BUILTIN_MODELS and not CLASS_PATH.fullmatch(value):
            raise ValueError(
                f"{value!r} is neither a built-in model {sorted(BUILTIN_MODELS)} nor an "
                'import path "pkg.module:Class"'
            )
        return value

    @property
    def import_path(self) -> str:
        return BUILTIN_MODELS.get(self.class_path, self.class_path)
