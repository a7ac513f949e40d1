"""`train.select_best`: early stopping on the validation split, and the best epoch's weights
as the model the run logs.

- `BestEpoch`: the rule, pure. Each epoch's monitored figure either beats the best so far
  (strictly: a tie keeps the earlier epoch; NaN never wins) and becomes it, or adds one to
  the epochs waited; `patience` of them in a row stop the run.
- `SelectBest`: the Lightning callback. At each validation's end (the sanity check aside)
  it reads the figure the model logged (`val_*` are summed over every rank, so alike on
  each), takes rank 0's value and decision on every rank (a broadcast: no rank can stop
  alone), keeps a CPU copy of the weights when the epoch is the best, and sets
  `trainer.should_stop` after `patience` epochs without one. At the train's end every
  rank loads the copy back (DDP keeps ranks' weights equal, so all hold the same), and
  the model's last confusion matrix becomes the chosen epoch's and `val_loss` is kept,
  so the summary's `val_*` describe the weights logged. Its state (the copy included)
  rides in the checkpoint, so a resumed run keeps its choice.
- `check_selection_split` (in training/config.py, so the launcher checks it without
  importing torch): a version without a validation split is refused (its holdout would
  choose the model and then judge it) unless `select_best.on_holdout`.

FSDP and tensor parallel are refused in the config (training/config.py): their weights
are sharded DTensors, which the copy here does not handle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import lightning
import numpy as np
import torch

from training.config import SelectBestConfig

MODES: dict[str, Literal["min", "max"]] = {"val_loss": "min", "val_macro_f1": "max"}


@dataclass
class BestEpoch:
    """The best epoch so far of a monitored figure, and the epochs since it."""

    mode: Literal["min", "max"]
    patience: int
    value: float | None = None
    epoch: int | None = None
    waited: int = 0

    def see(self, epoch: int, value: float) -> bool:
        """Take `epoch`'s figure; whether it is the new best."""
        if not math.isnan(value) and (self.value is None or self._beats(value, self.value)):
            self.value, self.epoch, self.waited = value, epoch, 0
            return True
        self.waited += 1
        return False

    def _beats(self, value: float, best: float) -> bool:
        return value < best if self.mode == "min" else value > best

    @property
    def should_stop(self) -> bool:
        return self.waited >= self.patience


class SelectBest(lightning.Callback):
    """Early stopping and best-weights restore for `train.select_best` (module docstring)."""

    def __init__(self, config: SelectBestConfig) -> None:
        self.monitor = config.monitor
        self.best = BestEpoch(MODES[config.monitor], config.patience)
        self.weights: dict[str, torch.Tensor] | None = None
        self.confusion: torch.Tensor | None = None
        self.val_loss: float | None = None  # the chosen epoch's, for the summary
        self.epochs_seen = 0
        self.stopped_early = False

    def on_validation_end(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        if trainer.sanity_checking:
            return
        value = float(self.figure(trainer))
        value = float(trainer.strategy.broadcast(value, src=0))  # one decision for all
        self.epochs_seen += 1
        if self.best.see(trainer.current_epoch, value):
            self.weights = {k: v.detach().cpu().clone() for k, v in pl_module.state_dict().items()}
            loss = trainer.callback_metrics.get("val_loss")
            self.val_loss = None if loss is None else float(loss)
            confusion = getattr(pl_module, "last_confusion", None)
            self.confusion = None if confusion is None else torch.as_tensor(confusion).clone()
        if self.best.should_stop:
            self.stopped_early = True
            trainer.should_stop = True

    def figure(self, trainer: lightning.Trainer) -> Any:
        if self.monitor not in trainer.callback_metrics:
            raise ValueError(
                f"select_best.monitor: the model logged no {self.monitor!r} at validation "
                f"(it logged {sorted(trainer.callback_metrics)})"
            )
        return trainer.callback_metrics[self.monitor]

    def on_train_end(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        if self.weights is None:
            return  # no epoch was validated, or every figure was NaN: the last weights stay
        with torch.no_grad():
            for name, tensor in pl_module.state_dict().items():
                tensor.copy_(self.weights[name])
        if self.confusion is not None:
            pl_module.last_confusion = self.confusion.numpy().astype(np.int64)

    def state_dict(self) -> dict[str, Any]:
        return {
            "value": self.best.value,
            "epoch": self.best.epoch,
            "waited": self.best.waited,
            "epochs_seen": self.epochs_seen,
            "weights": self.weights,
            "confusion": self.confusion,
            "val_loss": self.val_loss,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best.value, self.best.epoch = state_dict["value"], state_dict["epoch"]
        self.best.waited, self.epochs_seen = state_dict["waited"], state_dict["epochs_seen"]
        self.weights, self.confusion = state_dict["weights"], state_dict["confusion"]
        self.val_loss = state_dict["val_loss"]

    def summary(self) -> dict[str, Any]:
        """summary.json's `selection`: the figure, the epoch chosen (0-based) and its value."""
        return {
            "monitor": self.monitor,
            "mode": self.best.mode,
            "patience": self.best.patience,
            "epoch": self.best.epoch,
            "value": self.best.value,
            "epochs_validated": self.epochs_seen,
            "stopped_early": self.stopped_early,
        }
