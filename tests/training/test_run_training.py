"""run_training in one process: it trains, validates over every holdout sample exactly
once, and writes a summary that agrees with the stream."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from tracking.config import TrackingConfig
from training.config import LoaderConfig, TrainConfig
from training.train import run_training

pytestmark = pytest.mark.slow  # whole training runs end to end (Lightning, checkpoints, MLflow)


def test_single_process_run_writes_a_consistent_summary(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """batches_per_rank = epochs x batches per epoch; the confusion matrix counts every
    holdout row once (padding excluded); the classifier learns the separable classes (its
    validation loss below the log(10) of guessing among the 10 classes)."""
    root = make_dataset(640, holdout_rows=203, row_group_size=64)
    cfg = TrainConfig(
        dataset=root,
        output_dir=str(tmp_path / "run"),
        max_epochs=2,
        loader=LoaderConfig(batch_size=32),
    )
    summary = run_training(cfg)
    assert summary == json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["batches_per_rank"] == [2 * (640 // 32)]
    assert sum(map(sum, summary["confusion_matrix"])) == 203
    assert summary["classes"] == [str(10 * k + 3) for k in range(10)]
    assert 0.5 < summary["val_macro_f1"] <= 1.0
    assert summary["epochs"] == 2 and summary["train_loss"] > 0
    assert 0 < summary["val_loss"] < math.log(10)
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()


def test_tracked_run_logs_metrics_to_its_mlflow_run(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """With tracking set, the summary names the MLflow run (the one the launcher created
    before the rank started), and that run holds the train loss, the macro F1 and a recall
    per class."""
    from mlflow.tracking import MlflowClient

    from tracking.run.runs import create_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracking = TrackingConfig(tracking_uri=uri, experiment="training-test")
    cfg = TrainConfig(
        dataset=make_dataset(320, holdout_rows=90, row_group_size=64),
        output_dir=str(tmp_path / "run"),
        max_epochs=1,
        loader=LoaderConfig(batch_size=32),
        tracking=tracking.model_copy(update={"run_id": create_run(tracking)}),
    )
    summary = run_training(cfg)
    assert summary["run_id"] == cfg.tracking.run_id  # type: ignore[union-attr]
    metrics = MlflowClient(uri).get_run(summary["run_id"]).data.metrics
    assert metrics["val_macro_f1"] == pytest.approx(summary["val_macro_f1"])
    assert metrics["val_loss"] == pytest.approx(summary["val_loss"]) and metrics["val_loss"] > 0
    assert {"train_loss", "train_loss_step"} <= set(metrics)
    assert {name for name in metrics if name.startswith("val_recall/")} == {
        f"val_recall/{name}" for name, value in summary["val_recall"].items() if value is not None
    }


def test_resume_from_last_checkpoint_matches_an_uninterrupted_run(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """One epoch, then `ckpt_path="last"` up to two, ends with the same loss and confusion
    matrix as two epochs in one go; the checkpoint holds the stream at the next epoch."""
    root = make_dataset(640, holdout_rows=101, row_group_size=64)
    base = TrainConfig(dataset=root, output_dir="", loader=LoaderConfig(batch_size=32))
    straight = run_training(
        base.model_copy(update={"output_dir": str(tmp_path / "straight"), "max_epochs": 2})
    )
    split_dir = str(tmp_path / "split")
    run_training(base.model_copy(update={"output_dir": split_dir, "max_epochs": 1}))
    checkpoint = torch.load(Path(split_dir) / "checkpoints" / "last.ckpt", weights_only=False)
    positions = checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    order = {"batch_size": 32, "num_partitions": 16, "shuffle_window_row_groups": 4}
    assert positions == [{"epoch": 1, "samples_consumed": 0, "rank_batches": 0} | order]
    resumed = run_training(
        base.model_copy(update={"output_dir": split_dir, "max_epochs": 2}), ckpt_path="last"
    )
    assert resumed["batches_per_rank"] == [640 // 32] and resumed["epochs"] == 2
    assert resumed["train_loss"] == pytest.approx(straight["train_loss"], rel=1e-6)
    assert resumed["confusion_matrix"] == straight["confusion_matrix"]
