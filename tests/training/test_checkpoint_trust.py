"""ballast's own checkpoints load with `weights_only=True` (training/train.py,
training/distributed/strategy.py): tensors and plain metadata load, a checkpoint that
would run code when unpickled is refused before that code runs."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from training.config import LoaderConfig, TrainConfig
from training.train import run_training

pytestmark = pytest.mark.slow  # whole training runs (Lightning, checkpoints)


class Touch:
    """Unpickled, creates `marker`: what a hostile checkpoint can make a loader do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Callable[..., object], tuple[Path]]:
        return Path.touch, (self.marker,)


def test_a_resume_refuses_a_checkpoint_that_runs_code(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """Invariant: a ballast checkpoint resumes (the resume tests check it exactly); the
    same checkpoint with a pickled callable in it fails the resume with pickle's refusal
    of weights_only, and the callable never ran (its marker file does not exist)."""
    root = make_dataset(128, holdout_rows=16, row_group_size=32)
    out = str(tmp_path / "run")
    base = TrainConfig(dataset=root, output_dir=out, loader=LoaderConfig(batch_size=32))
    run_training(base.model_copy(update={"max_epochs": 1}))
    last = Path(out) / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)  # ballast's own: plain data only
    checkpoint["hostile"] = Touch(tmp_path / "ran")
    torch.save(checkpoint, last)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        run_training(base.model_copy(update={"max_epochs": 2}), ckpt_path="last")
    assert not (tmp_path / "ran").exists()
