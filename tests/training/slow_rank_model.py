"""A user model for straggler tests, named by import path in a job's config
(`model.class_path: "tests.training.slow_rank_model:SlowRankClassifier"`).

The built-in feature classifier, but rank `options.slow_rank` sleeps `options.sleep_s`
in every training step (after its forward, before backward), so that one rank is
slower than the others by a known, deterministic amount of compute time.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from training.models.classifier import FeatureClassifier


class SlowRankClassifier(FeatureClassifier):
    """FeatureClassifier whose rank `options.slow_rank` is `options.sleep_s` slower a step."""

    def __init__(self, num_features: int, classes: list[Any], model: dict[str, Any]) -> None:
        super().__init__(num_features, classes, model)
        self.slow_rank = int(model["options"]["slow_rank"])
        self.sleep_s = float(model["options"]["sleep_s"])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if self.global_rank == self.slow_rank:
            time.sleep(self.sleep_s)
        return loss
