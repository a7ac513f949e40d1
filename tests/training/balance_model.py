"""A user model for balancing tests, named by import path in a job's config
(`model.class_path: "tests.training.balance_model:PerSampleSlowClassifier"`).

`RecordingClassifier` (ids of every step per rank, tests/training/recording_model.py),
whose rank `options.slow_rank` also sleeps `options.sample_sleep_s` per row of its
batch in every step: a rank slower per sample, as a loaded host or an older GPU is, so
that `loader.balance: speed` has a speed to follow.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from tests.training.recording_model import RecordingClassifier


class PerSampleSlowClassifier(RecordingClassifier):
    """RecordingClassifier whose rank `options.slow_rank` is slower per sample."""

    def __init__(self, num_features: int, classes: list[Any], model: dict[str, Any]) -> None:
        super().__init__(num_features, classes, model)
        self.slow_rank = int(model["options"]["slow_rank"])
        self.sample_sleep_s = float(model["options"]["sample_sleep_s"])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if self.global_rank == self.slow_rank:
            time.sleep(self.sample_sleep_s * len(batch["id"]))
        return loss
