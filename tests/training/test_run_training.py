"""run_training in one process: it trains, validates over every holdout sample exactly
once, and writes a summary that agrees with the stream."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from training.config import LoaderConfig, TrainConfig
from training.train import run_training


def test_single_process_run_writes_a_consistent_summary(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """batches_per_rank = epochs x batches per epoch; the confusion matrix counts every
    holdout row once (padding excluded); the classifier learns the separable classes."""
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
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").exists()
