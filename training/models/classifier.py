"""The built-in classification task, its MLP, and building a model from the config.

`Classifier` is the task shared by the built-in models: cross-entropy weighted
by `batch["weight"]` (padding samples carry weight 0 and count for nothing), times
`batch["loss_scale"]` when a balanced loader sends one (training/data/balance.py);
validation accumulates a confusion matrix and the summed cross-entropy of the real
samples over all ranks at the end of the epoch, from which macro F1, per-class recall
and `val_loss` (the mean over every real validation sample) are computed. Subclasses
only build `self.net`, the network that maps a float32 feature matrix to class
logits (it is what gets logged to MLflow). `num_features` is the width of the
dataset's feature codec (preprocessing/contract/codec.py: one value per scalar column, one
per vector element, a one-hot block per string column, values and mask per sequence).
`FeatureClassifier` is an MLP over the feature vector;
`training.models.transformer.TokenClassifier` a transformer.

The model holds no parallelism: the strategy wraps it (DDP), or
training/distributed/parallelize.py shards it (FSDP2, tensor parallel). `build_model`
resolves `model.class_path` (a built-in name or "pkg.module:Class").
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, cast

import lightning
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from preprocessing.contract.names import mlflow_key
from tracking.lifecycle.metrics import macro_f1, per_class_recall
from training.log_cadence import logs_this_step
from training.models.config import ModelConfig


def ends_epoch(trainer: lightning.Trainer | None, batch_idx: int) -> bool:
    """Whether the batch under way may be its epoch's last: the loader's last, the epoch's
    batch limit, the run's last step, or a stop; always outside a Trainer."""
    if trainer is None:
        return True
    return bool(
        trainer.is_last_batch
        or batch_idx + 1 >= trainer.num_training_batches
        or 0 < trainer.max_steps <= trainer.global_step + 1
        or trainer.should_stop
    )


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
    losses = F.cross_entropy(logits.float(), label, reduction="none")
    return (losses * weight).sum() / weight.sum().clamp_min(1.0)


class Classifier(lightning.LightningModule):
    """Classify a sample's float feature vector into one of the dataset's classes."""

    def __init__(self, num_features: int, classes: list[Any], model: dict[str, Any]) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.config = ModelConfig.model_validate(model)
        self.classes = [str(value) for value in classes]
        self.net = self.build_network(num_features, len(self.classes))
        self.last_confusion: np.ndarray | None = None
        # A plain attribute, not a buffer: DDP would broadcast a buffer from rank 0.
        self._confusion = torch.zeros(len(classes), len(classes), dtype=torch.long)
        self._loss_sum = torch.zeros(())  # of the real samples; their count: the confusion's
        # The train losses since `train_loss` was last logged, times their batch sizes.
        self._train_sum: torch.Tensor | None = None
        self._train_size = 0

    def build_network(self, num_features: int, num_classes: int) -> nn.Module:
        raise NotImplementedError

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return cast(torch.Tensor, self.net(features))

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = self.training_loss(batch)
        size = len(batch["label"])
        if "loss_scale" in batch:  # a balanced slice (training/data/balance.py): this rank's
            # part of the global step's mean, DDP's average of the parts being that mean;
            # logged per step with equal weight, so the epoch's mean is the steps' mean.
            loss, size = loss * batch["loss_scale"].to(loss.dtype), 1
        # Per step: this rank's loss, no collective. Per epoch: the mean over all ranks.
        # `_trainer`: a step called outside a Trainer (a test's own loop) logs as before.
        logs = logs_this_step(self._trainer)
        if logs:
            self.log("train_loss_step", loss, on_step=True, on_epoch=False, batch_size=size)
        self.add_train_loss(
            loss.detach() * size, size, logs or ends_epoch(self._trainer, batch_idx)
        )
        return loss

    def training_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The batch's mean cross-entropy over its real samples (a subclass may add terms)."""
        return weighted_cross_entropy(self(batch["features"]), batch["label"], batch["weight"])

    def add_train_loss(self, weighted: torch.Tensor, size: int, log: bool) -> None:
        """Count a step's loss (times its batch size) towards the epoch's `train_loss`; `log`:
        log the mean of those counted since the last log, weighted by their sizes, so the
        epoch's mean is every step's, as if each had been logged. A `log` call costs a
        tenth of a millisecond whichever step it is (Lightning moves and checks its result
        collection): every step's was 5 % of a 2-rank MLP's step (benchmarks/RESULTS.md
        M53)."""
        self._train_sum = weighted if self._train_sum is None else self._train_sum + weighted
        self._train_size += size
        if log:
            mean, count = self._train_sum / self._train_size, self._train_size
            self.log(
                "train_loss", mean, on_step=False, on_epoch=True, sync_dist=True, batch_size=count
            )
            self._train_sum, self._train_size = None, 0

    def on_train_epoch_start(self) -> None:
        self._train_sum, self._train_size = None, 0  # a stop mid-epoch may have left some

    def on_validation_epoch_start(self) -> None:
        num_classes = len(self.classes)
        self._confusion = torch.zeros(
            num_classes, num_classes, dtype=torch.long, device=self.device
        )
        self._loss_sum = torch.zeros((), device=self.device)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        real = batch["weight"] > 0
        logits = self(batch["features"])[real]
        pred, target = logits.argmax(dim=1), batch["label"][real]
        loss = F.cross_entropy(logits.float(), target, reduction="sum").detach()
        self._loss_sum += loss
        num_classes = len(self.classes)
        counts = torch.bincount(target * num_classes + pred, minlength=num_classes**2)
        self._confusion += counts.view(num_classes, num_classes)

    def on_validation_epoch_end(self) -> None:
        gathered = cast(torch.Tensor, self.all_gather(self._confusion))
        total = gathered.sum(dim=0) if gathered.dim() == 3 else gathered
        self.last_confusion = total.cpu().numpy()
        for name, value in validation_metrics(self.last_confusion, self.classes).items():
            self.log(name, value, sync_dist=True)
        summed = cast(torch.Tensor, self.all_gather(self._loss_sum)).sum()
        # The same mean over every rank's samples on each rank (the sync averages equals).
        self.log("val_loss", float(summed) / max(1, int(total.sum())), sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        config = self.config
        if config.optimizer == "sgd":
            return torch.optim.SGD(
                self.parameters(),
                lr=config.learning_rate,
                momentum=0.9,
                nesterov=True,
                weight_decay=config.weight_decay,
            )
        parameters = list(self.parameters())
        return torch.optim.AdamW(
            parameters,
            lr=config.learning_rate,
            weight_decay=config.weight_decay,
            # None, not False, where it does not apply: False would also turn off the
            # foreach loop torch picks by default on some devices.
            fused=fused_adam_applies(parameters) or None,
        )


# torch's fused AdamW: one kernel a parameter instead of about ten tensor operations, each
# dispatched from Python (torch picks it by default on no device). On CPU a step of the
# [512, 512] MLP took 1.9-2.2 ms less (11.7 -> 9.8 ms at 64 rows, 22.4 -> 20.2 at 256;
# one thread, Lightning): the step's fixed cost, which a slowed rank pays whatever its
# rows. The same update to a few ulps (2.4e-7 in the loss over 200 steps).
FUSED_ADAM_DEVICES = frozenset({"cpu", "cuda"})


def fused_adam_applies(parameters: Sequence[torch.Tensor]) -> bool:
    """Whether every parameter is a floating-point tensor on a device with the fused
    kernel (DTensor shards of FSDP2 and tensor parallel included)."""
    return bool(parameters) and all(
        p.is_floating_point() and p.device.type in FUSED_ADAM_DEVICES for p in parameters
    )


class FeatureClassifier(Classifier):
    """The MLP over the feature columns (`model.hidden_sizes`)."""

    def build_network(self, num_features: int, num_classes: int) -> nn.Module:
        return build_mlp(num_features, num_classes, self.config.hidden_sizes)


def validation_metrics(confusion: np.ndarray, classes: list[str]) -> dict[str, float]:
    """`val_macro_f1` and `val_recall/<class>` (classes without support are left out), the
    class as `mlflow_key` maps it (the summary keeps each class's key and label)."""
    metrics = {"val_macro_f1": macro_f1(confusion)}
    for name, recall in zip(classes, per_class_recall(confusion), strict=True):
        if not np.isnan(recall):
            metrics[mlflow_key(name, "val_recall/")] = float(recall)
    return metrics


def model_class(config: ModelConfig) -> type[lightning.LightningModule]:
    """The LightningModule class `config.class_path` names; errors name the field."""
    module_name, _, class_name = config.import_path.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        message = f"model.class_path: cannot import {config.class_path!r}: {error}"
        raise ValueError(message) from error
    if not (isinstance(found, type) and issubclass(found, lightning.LightningModule)):
        raise ValueError(f"model.class_path: {config.class_path!r} is not a LightningModule class")
    return found


def build_model(
    config: ModelConfig, num_features: int, classes: list[Any]
) -> lightning.LightningModule:
    """An instance of the configured model for this dataset's features and classes."""
    return model_class(config)(num_features, classes, config.model_dump())
