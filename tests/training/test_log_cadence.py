"""The step metrics reach the loggers on Lightning's cadence and only then: the built-in
classifier's `train_loss_step` and CommMetrics' `comm/*` are logged on the steps Lightning
hands to its loggers (every `log_every_n_steps`, training/log_cadence.py), and skipping
the other steps' `log` calls changes no figure: the epoch's `train_loss` is still the mean
of every step's loss, weighted by batch size, though it too is logged only on that
cadence and at the epoch's last step. One process, an in-memory logger, no service."""

from __future__ import annotations

from typing import Any

import lightning
import torch
from lightning.pytorch.loggers.logger import Logger
from torch.utils.data import DataLoader

from training.callbacks import CommMetrics
from training.distributed.comm import CommMeter
from training.models.classifier import FeatureClassifier

NUM_STEPS, EVERY = 12, 5


class MemoryLogger(Logger):
    """Each `log_metrics` call's metric names, by the step Lightning gives it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "memory"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.calls.append((int(step or 0), dict(metrics)))

    def steps_of(self, name: str) -> list[int]:
        return [step for step, metrics in self.calls if name in metrics]


class StepLosses(FeatureClassifier):
    """The built-in classifier; keeps each step's loss and the names it logs, per call."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.step_losses: list[float] = []
        self.logged: list[str] = []

    def log(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.logged.append(name)
        super().log(name, *args, **kwargs)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.step_losses.append(float(loss.detach()))
        return loss


def batches(sizes: list[int] | None = None) -> DataLoader[dict[str, torch.Tensor]]:
    """Ready batches, 12 of 8 rows unless `sizes` says (`batch_size=None`: the loader hands
    them on as they are)."""
    generator = torch.Generator().manual_seed(0)
    ready = [
        {
            "features": torch.randn(size, 4, generator=generator),
            "label": torch.randint(0, 3, (size,), generator=generator),
            "weight": torch.ones(size),
        }
        for size in sizes or [8] * NUM_STEPS
    ]
    return DataLoader(ready, batch_size=None)  # type: ignore[arg-type]


def test_step_metrics_reach_the_loggers_on_lightnings_cadence_and_the_epoch_mean_keeps_all() -> (
    None
):
    """Invariant: with `log_every_n_steps=5` over 12 steps, `train_loss_step` and
    `comm/allreduce_bytes` reach the logger at steps 4 and 9 (Lightning's zero-based steps
    of the 5th and 10th batch), the steps an ungated `log` call reaches, so skipping the
    other calls loses nothing; and the epoch's `train_loss` is the mean of all 12 steps'
    losses (equal batch sizes)."""
    model = StepLosses(4, [0, 1, 2], {"hidden_sizes": [8]})
    logger = MemoryLogger()
    trainer = lightning.Trainer(
        max_epochs=1,
        logger=logger,
        log_every_n_steps=EVERY,
        callbacks=[CommMetrics(CommMeter())],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(model, train_dataloaders=batches())
    assert logger.steps_of("train_loss_step") == [EVERY - 1, 2 * EVERY - 1]
    assert logger.steps_of("comm/allreduce_bytes") == [EVERY - 1, 2 * EVERY - 1]
    assert len(model.step_losses) == NUM_STEPS
    epoch_loss = float(trainer.callback_metrics["train_loss"])
    assert abs(epoch_loss - sum(model.step_losses) / NUM_STEPS) < 1e-6


def test_the_epoch_train_loss_is_every_steps_mean_by_size_logged_on_cadence_and_at_its_end() -> (
    None
):
    """Invariant: over 13 steps of uneven batches (3 to 15 rows) with `log_every_n_steps=5`,
    the epoch's `train_loss` is the mean of every step's loss weighted by its rows, as when
    each step logged it; yet `train_loss` is logged 3 times (steps 4 and 9 on the cadence,
    12 at the epoch's end), not 13: each call costs the same whichever step it is."""
    sizes = [3 + (7 * step) % 13 for step in range(13)]
    model = StepLosses(4, [0, 1, 2], {"hidden_sizes": [8]})
    trainer = lightning.Trainer(
        max_epochs=1,
        logger=MemoryLogger(),
        log_every_n_steps=EVERY,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(model, train_dataloaders=batches(sizes))
    weighted = sum(loss * size for loss, size in zip(model.step_losses, sizes, strict=True))
    epoch_loss = float(trainer.callback_metrics["train_loss"])
    assert abs(epoch_loss - weighted / sum(sizes)) < 1e-6
    assert model.logged.count("train_loss") == 3
