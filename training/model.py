"""The built-in feature classifier: an MLP over a sample's feature vector.

`FeatureClassifier` trains with a cross-entropy weighted by `batch["weight"]`
(padding samples carry weight 0 and count for nothing) and validates by
accumulating a confusion matrix that is summed over all ranks at the end of
the epoch; macro F1 and per-class recall are computed from it. The model holds
no parallelism: the Trainer's strategy (training/train.py) applies DDP.
"""

from __future__ import annotations

from typing import Any, cast

import lightning
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from training.config import ModelConfig
from training.metrics import macro_f1, per_class_recall


def build_mlp(num_features: int, num_classes: int, hidden_sizes: list[int]) -> nn.Sequential:
    """Linear + ReLU per hidden layer, then a linear layer to the class logits."""
    layers: list[nn.Module] = []
    width = num_features
    for hidden in hidden_sizes:
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def weighted_cross_entropy(
    logits: torch.Tensor, label: torch.Tensor, weight: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy over the samples of weight > 0 (weights scale each sample)."""
    losses = F.cross_entropy(logits, label, reduction="none")
    return (losses * weight).sum() / weight.sum().clamp_min(1.0)


class FeatureClassifier(lightning.LightningModule):
    """Classify a float feature vector into one of the dataset's classes."""

    def __init__(self, num_features: int, classes: list[Any], model: dict[str, Any]) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.config = ModelConfig.model_validate(model)
        self.classes = [str(value) for value in classes]
        self.net = build_mlp(num_features, len(classes), self.config.hidden_sizes)
        self.num_train_batches = 0
        self.last_confusion: np.ndarray | None = None
        # A few real inputs, kept as the logged model's input example.
        self.example_features = torch.zeros(1, num_features)
        # A plain attribute, not a buffer: DDP would broadcast a buffer from rank 0.
        self._confusion = torch.zeros(len(classes), len(classes), dtype=torch.long)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = weighted_cross_entropy(self(batch["features"]), batch["label"], batch["weight"])
        self.num_train_batches += 1
        size = len(batch["label"])
        # Per step: this rank's loss, no collective. Per epoch: the mean over all ranks.
        self.log("train_loss_step", loss, on_step=True, on_epoch=False, batch_size=size)
        self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True, batch_size=size)
        return loss

    def on_validation_epoch_start(self) -> None:
        num_classes = len(self.classes)
        self._confusion = torch.zeros(
            num_classes, num_classes, dtype=torch.long, device=self.device
        )

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        real = batch["weight"] > 0
        if batch_idx == 0:
            self.example_features = batch["features"][:5].detach().cpu()
        pred = self(batch["features"]).argmax(dim=1)[real]
        target = batch["label"][real]
        num_classes = len(self.classes)
        counts = torch.bincount(target * num_classes + pred, minlength=num_classes**2)
        self._confusion += counts.view(num_classes, num_classes)

    def on_validation_epoch_end(self) -> None:
        gathered = cast(torch.Tensor, self.all_gather(self._confusion))
        total = gathered.sum(dim=0) if gathered.dim() == 3 else gathered
        self.last_confusion = total.cpu().numpy()
        for name, value in validation_metrics(self.last_confusion, self.classes).items():
            self.log(name, value, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            self.parameters(), lr=self.config.learning_rate, weight_decay=self.config.weight_decay
        )


def validation_metrics(confusion: np.ndarray, classes: list[str]) -> dict[str, float]:
    """`val_macro_f1` and `val_recall/<class>` (classes without support are left out)."""
    metrics = {"val_macro_f1": macro_f1(confusion)}
    for name, recall in zip(classes, per_class_recall(confusion), strict=True):
        if not np.isnan(recall):
            metrics[f"val_recall/{name}"] = float(recall)
    return metrics
