"""The training config refuses bad input with an error naming the field; models are found
by import path; the token dataset generator writes a version the loader reads."""

from __future__ import annotations

from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch
from pydantic import ValidationError

from preprocessing.synthetic.tokens import TokenDatasetSpec, signatures, write_token_dataset
from training.config import TrainConfig, dump_train_config, load_train_config
from training.data.loader import ShardStream
from training.distributed.strategy import build_strategy
from training.models.classifier import FeatureClassifier, build_model
from training.models.config import ModelConfig
from training.models.transformer import TokenClassifier

BASE = {"dataset": "/data", "output_dir": "/out"}


@pytest.mark.parametrize(
    ("fields", "field_name"),
    [
        ({"model": {"class_path": "no module here"}}, "model.class_path"),
        ({"model": {"transformer": {"d_model": 30, "num_heads": 4}}}, "model.transformer"),
        ({"comm": {"hook": "zip"}}, "comm.hook"),
        ({"comm": {"powersgd_rank": 0}}, "comm.powersgd_rank"),
        ({"comm": {"warmup_steps": 1}}, "comm.warmup_steps"),
        ({"strategy": "fsdp", "comm": {"hook": "fp16"}}, "comm.hook"),
        ({"strategy": "tp", "precision": "16-mixed"}, "precision"),
        ({"strategy": "horovod"}, "strategy"),
        ({"checkpoint_every_n_steps": 0}, "checkpoint_every_n_steps"),
        ({"loader": {"batch_size": 8, "shuffle": True}}, "loader.shuffle"),
    ],
)
def test_bad_config_names_the_field(fields: dict, field_name: str) -> None:
    """Every bad value or unknown field is refused, and the message names it."""
    with pytest.raises(ValidationError) as raised:
        TrainConfig.model_validate(BASE | fields)
    assert field_name in str(raised.value).replace(".\n", "\n").replace("\n  ", " ")


def test_config_round_trips_through_any_fsspec_uri() -> None:
    """A config written to a URI (here memory://) loads back equal."""
    cfg = TrainConfig.model_validate(
        BASE | {"strategy": "tp", "comm": {"hook": "none"}, "model": {"class_path": "transformer"}}
    )
    dump_train_config(cfg, "memory://ballast-test/train.yaml")
    assert load_train_config("memory://ballast-test/train.yaml") == cfg
    fsspec.filesystem("memory").rm("/ballast-test", recursive=True)


def test_models_are_found_by_name_or_import_path() -> None:
    """Built-in names and "pkg.module:Class" resolve to LightningModules built for the data
    (with the configured optimizer); a path that does not import, or names something else,
    fails naming model.class_path."""
    assert isinstance(build_model(ModelConfig(), 8, [1, 2]), FeatureClassifier)
    transformer = ModelConfig(
        class_path="transformer", transformer={"vocab_size": 16, "d_model": 8, "num_heads": 2}
    )
    assert isinstance(build_model(transformer, 12, [0, 1, 2]), TokenClassifier)
    path = ModelConfig(class_path="training.models.classifier:FeatureClassifier", optimizer="sgd")
    model = build_model(path, 8, [1, 2])
    assert type(model) is FeatureClassifier
    assert isinstance(model.configure_optimizers(), torch.optim.SGD)
    for bad, message in [
        ("nowhere.mod:Thing", "cannot import"),
        ("training.config:TrainConfig", "not a LightningModule"),
    ]:
        with pytest.raises(ValueError, match=f"model.class_path.*{message}"):
            build_model(ModelConfig(class_path=bad), 8, [1, 2])


def test_tensor_parallel_size_must_divide_the_world() -> None:
    """tp over 2 ranks per group cannot split 3 ranks; the error names the field."""
    cfg = TrainConfig.model_validate(BASE | {"strategy": "tp", "tensor_parallel_size": 2})
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        build_strategy(cfg, world_size=3)


def test_token_dataset_reads_back_as_token_ids(tmp_path: Path) -> None:
    """The generated version streams as float32 [B, seq_len] holding exact token ids in
    [0, vocab_size); each sequence holds more signature tokens of its own class than of any
    other (what makes it learnable); writing the same spec again reuses the version."""
    spec = TokenDatasetSpec(
        num_rows=300,
        holdout_rows=40,
        seq_len=24,
        vocab_size=500,
        num_classes=3,
        signature_tokens=5,
        rows_per_shard=128,
        rows_per_row_group=32,
        signal=0.3,
    )
    root = write_token_dataset(str(tmp_path), spec)
    stream = ShardStream(root, "train", TrainConfig.model_validate(BASE).loader, seed=1)
    assert stream.num_features == 24 and stream.num_rows == 300
    batch = next(iter(stream))
    tokens = batch["features"].numpy()
    assert np.array_equal(tokens, np.round(tokens))
    assert tokens.min() >= 0 and tokens.max() < 500
    owned = signatures(spec)
    hits = np.stack([np.isin(tokens, owned[c]).sum(axis=1) for c in range(3)], axis=1)
    assert (hits.argmax(axis=1) == batch["label"].numpy()).mean() > 0.95
    before = sorted(p.name for p in tmp_path.iterdir())
    write_token_dataset(str(tmp_path), spec)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
