"""Golden loss: 20 steps of the built-in classifier reproduce a committed loss sequence.

`run_training` runs in one process (no process group) on a tiny dataset this module
writes from integer arithmetic alone, so neither numpy's random streams nor the shared
fixtures (tests/training/conftest.py) can move it. The model is the built-in
`FeatureClassifier`, named by import path as a user model would be, plus one thing:
it records every step's loss (`LossRecordingClassifier`). Weights come from torch's
seeded CPU generator (`seed_everything(cfg.seed)`), the order from the loader's keyed
permutation, so the 20 losses are a fingerprint of the training path: a refactor that
changes any of init, order, loss, optimizer or step count fails here, to 1e-6.

The reference is CPU float32 arithmetic; `run_training` picks CUDA whenever it is
there, so the test is skipped on a CUDA host.

To change training on purpose, regenerate the reference and commit it with the change:

    BALLAST_REGENERATE_GOLDEN=1 .venv/bin/pytest -q tests/training/test_golden_loss.py

(the run writes tests/training/golden_loss.json and fails, so that a regeneration is
never mistaken for a pass); review the new numbers in the diff before committing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch

from preprocessing.contract.manifest import Manifest, ShardEntry, SplitEntry, shard_name
from preprocessing.contract.shards import write_shard
from preprocessing.versions.attempt import VersionAttempt
from training.config import LoaderConfig, TrainConfig
from training.models.classifier import FeatureClassifier
from training.models.config import ModelConfig
from training.train import run_training

REFERENCE = Path(__file__).with_name("golden_loss.json")
REGENERATE = os.environ.get("BALLAST_REGENERATE_GOLDEN") == "1"
NUM_ROWS, NUM_FEATURES, NUM_CLASSES, BATCH_SIZE, NUM_EPOCHS = 160, 8, 4, 16, 2
NUM_STEPS = NUM_EPOCHS * NUM_ROWS // BATCH_SIZE
TOLERANCE = 1e-6


class LossRecordingClassifier(FeatureClassifier):
    """The built-in classifier; writes its per-step losses to `options.loss_file` at the end."""

    def __init__(self, num_features: int, classes: list[Any], model: dict[str, Any]) -> None:
        super().__init__(num_features, classes, model)
        self.loss_file = Path(model["options"]["loss_file"])
        self.step_losses: list[float] = []

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.step_losses.append(float(loss.detach()))
        return loss

    def on_train_end(self) -> None:
        self.loss_file.write_text(json.dumps(self.step_losses))


def golden_table() -> pa.Table:
    """Rows whose class is `id % 4` and whose features are the class's one-hot pattern
    plus a deterministic integer hash in [-0.5, 0.5): learnable, but not at once."""
    ids = np.arange(NUM_ROWS, dtype=np.int64)
    labels = ids % NUM_CLASSES
    columns = np.arange(NUM_FEATURES, dtype=np.int64)
    noise = ((ids[:, None] * 7919 + columns[None, :] * 104729) % 1009) / 1009.0 - 0.5
    centres = (columns[None, :] % NUM_CLASSES == labels[:, None]).astype(np.float64)
    features = (centres + noise).astype(np.float32)
    return pa.table(
        {
            "id": pa.array(ids),
            "label": pa.array(labels),
            "source": pa.array(["s0"] * NUM_ROWS),
            "features": pa.FixedSizeListArray.from_arrays(pa.array(features.ravel()), NUM_FEATURES),
        }
    )


def write_golden_dataset(root: Path) -> str:
    """The table as one committed train shard (no holdout: the losses are the point)."""
    table = golden_table()
    with VersionAttempt(str(root), "golden") as attempt:
        shard = write_shard(
            attempt.shard_uri(shard_name("train", 0)), table, BATCH_SIZE, "label", "source"
        )
        attempt.commit(golden_manifest(table.schema, shard))
    return str(root)


def golden_manifest(schema: pa.Schema, shard: ShardEntry) -> Manifest:
    return Manifest(
        version_id="golden",
        label_column="label",
        source_column="source",
        id_column="id",
        feature_columns=["features"],
        classes=list(range(NUM_CLASSES)),
        sources=["s0"],
        arrow_schema=[{"name": f.name, "type": str(f.type)} for f in schema],
        splits={"train": SplitEntry(num_rows=NUM_ROWS, shards=[shard])},
        seed=0,
        config={},
        input_fingerprint="golden",
        input_class_counts={},
        input_source_counts={},
    )


def golden_config(tmp_path: Path) -> TrainConfig:
    """Two epochs of ten batches of the default classifier (AdamW, lr 3e-3, [64, 64])."""
    model = ModelConfig(
        class_path=f"{__name__}:LossRecordingClassifier",
        options={"loss_file": str(tmp_path / "losses.json")},
    )
    return TrainConfig(
        dataset=write_golden_dataset(tmp_path / "data"),
        output_dir=str(tmp_path / "run"),
        seed=7,
        max_epochs=NUM_EPOCHS,
        loader=LoaderConfig(batch_size=BATCH_SIZE),
        model=model,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the reference is CPU float32 arithmetic")
def test_twenty_steps_reproduce_the_committed_loss_sequence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each of the 20 step losses equals the reference to 1e-6; the recorded losses are
    the ones trained on (their last-epoch mean is the summary's `train_loss`)."""
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)  # one process, whatever launched pytest
    cfg = golden_config(tmp_path)
    summary = run_training(cfg)
    losses = json.loads((tmp_path / "losses.json").read_text())
    assert summary["world_size"] == 1 and summary["global_step"] == NUM_STEPS == len(losses)
    assert summary["train_loss"] == pytest.approx(np.mean(losses[NUM_STEPS // 2 :]), abs=1e-6)
    if REGENERATE:
        REFERENCE.write_text(json.dumps({"train_loss_per_step": losses}, indent=1) + "\n")
        pytest.fail(f"regenerated {REFERENCE}: review the diff and commit it")
    reference = json.loads(REFERENCE.read_text())["train_loss_per_step"]
    assert len(reference) == NUM_STEPS
    np.testing.assert_allclose(losses, reference, rtol=0, atol=TOLERANCE)
