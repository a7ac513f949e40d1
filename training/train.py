"""Train the feature classifier on a dataset version: one call per rank.

`run_training(cfg)` builds the streams, the model and a Lightning `Trainer`
whose devices and nodes come from the environment torchrun sets (WORLD_SIZE,
LOCAL_WORLD_SIZE), fits, and has rank 0 write `<output_dir>/summary.json`.
It never spawns processes itself: launch it with `python -m training` under
torchrun (training/launch.py), srun or a PyTorchJob (shared/FINDINGS.md 1).
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from datetime import timedelta
from typing import Any

import lightning
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import DDPStrategy, Strategy

from preprocessing.manifest import read_manifest
from training.config import TrainConfig
from training.loader import ShardStream, StreamLoader
from training.model import FeatureClassifier
from training.summary import confusion_summary, write_summary


class StreamEpochs(lightning.Callback):
    """Keeps the streams in step with the Trainer: one epoch of the train stream per
    trainer epoch, and every validation pass over the holdout from its start."""

    def __init__(self, train: ShardStream, holdout: ShardStream | None) -> None:
        self.train, self.holdout = train, holdout

    def on_train_epoch_start(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        self.train.set_epoch(trainer.current_epoch)

    def on_validation_epoch_end(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        if self.holdout is not None:
            self.holdout.load_state_dict({"epoch": 0, "samples_consumed": 0})


def run_training(cfg: TrainConfig, ckpt_path: str | None = None) -> dict[str, Any]:
    """Fit on `cfg.dataset` and return the summary (written by rank 0); resume from `ckpt_path`."""
    started = time.monotonic()
    lightning.seed_everything(cfg.seed, workers=True)
    train, holdout = build_streams(cfg)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    check_enough_rows(train, world_size, cfg)
    model = FeatureClassifier(train.num_features, train.classes, cfg.model.model_dump())
    trainer = build_trainer(cfg, [StreamEpochs(train, holdout)], train.num_batches(world_size))
    val_loader = StreamLoader(holdout) if holdout is not None else None
    with warnings.catch_warnings():
        # The streams' __len__ is exact on every rank and worker, which this warning doubts.
        warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")
        trainer.fit(model, StreamLoader(train), val_loader, ckpt_path=ckpt_path)
    summary = summarise(trainer, model, cfg, time.monotonic() - started)
    if trainer.is_global_zero:
        summary["model_uri"] = log_trained_model(cfg, model, summary["run_id"])
        write_summary(cfg.output_dir, summary)
    return summary


def log_trained_model(cfg: TrainConfig, model: FeatureClassifier,
                      run_id: str | None) -> str | None:
    """Rank 0: log the network (no Lightning wrapper) to the job's MLflow run."""
    if cfg.tracking is None or run_id is None:
        return None
    from tracking.registry import log_model

    example = model.example_features.float().numpy()
    return log_model(cfg.tracking, run_id, model.net, example, model.classes)


def check_enough_rows(train: ShardStream, world_size: int, cfg: TrainConfig) -> None:
    """Refuse a train split too small for one global batch, which would train nothing."""
    if train.num_batches(world_size) == 0:
        raise ValueError(
            f"{cfg.dataset}: the train split has {train.num_rows} rows, fewer than one global "
            f"batch of {world_size} ranks x {cfg.loader.batch_size}"
        )


def build_streams(cfg: TrainConfig) -> tuple[ShardStream, ShardStream | None]:
    """The train stream, and the holdout stream padded to whole batches (None if empty)."""
    train = ShardStream(cfg.dataset, "train", cfg.loader, cfg.seed)
    manifest, _ = read_manifest(cfg.dataset)
    if "holdout" not in manifest.splits or manifest.split("holdout").num_rows == 0:
        return train, None
    padded = cfg.loader.model_copy(update={"remainder": "pad"})
    return train, ShardStream(cfg.dataset, "holdout", padded, cfg.seed)


def build_trainer(
    cfg: TrainConfig, callbacks: list[lightning.Callback], num_batches: int
) -> lightning.Trainer:
    """A Trainer for this rank: devices and nodes from torchrun's environment."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    checkpoint = ModelCheckpoint(
        dirpath=f"{cfg.output_dir.rstrip('/')}/checkpoints", save_last=True
    )
    return lightning.Trainer(
        accelerator="cuda" if torch.cuda.is_available() else "cpu",
        devices=local_world_size,
        num_nodes=world_size // local_world_size,
        strategy=build_strategy(cfg, world_size),
        use_distributed_sampler=False,
        max_epochs=cfg.max_epochs,
        logger=build_logger(cfg),
        callbacks=[checkpoint, *callbacks],
        default_root_dir=cfg.output_dir,
        enable_progress_bar=sys.stderr.isatty(),
        log_every_n_steps=max(1, min(50, num_batches)),
        deterministic=True,
    )


def build_strategy(cfg: TrainConfig, world_size: int) -> Strategy | str:
    """DDP with a process-group timeout when there are several ranks, else Lightning's default."""
    if world_size == 1:
        return "auto"
    return DDPStrategy(
        process_group_backend="nccl" if torch.cuda.is_available() else "gloo",
        timeout=timedelta(seconds=cfg.process_group_timeout_s),
    )


def build_logger(cfg: TrainConfig) -> Logger | bool:
    """The MLflow logger when tracking is configured; tracking is imported only then."""
    if cfg.tracking is None:
        return False
    from tracking.logger import make_lightning_logger

    logger: Logger = make_lightning_logger(cfg.tracking, cfg.output_dir)
    return logger


def gather_counts(trainer: lightning.Trainer, count: int) -> list[int]:
    """Every rank's `count`, in rank order (a collective: every rank must call it)."""
    local = torch.tensor([count], dtype=torch.long, device=trainer.strategy.root_device)
    return [int(value) for value in trainer.strategy.all_gather(local).reshape(-1).tolist()]


def summarise(
    trainer: lightning.Trainer, model: FeatureClassifier, cfg: TrainConfig, elapsed_s: float
) -> dict[str, Any]:
    """The figures of the run that a flow, a person or a test reads back."""
    batches_per_rank = gather_counts(trainer, model.num_train_batches)
    loss = trainer.callback_metrics.get("train_loss")
    summary: dict[str, Any] = {
        "world_size": trainer.world_size,
        "batches_per_rank": batches_per_rank,
        "classes": model.classes,
        "epochs": trainer.current_epoch,
        "train_loss": float(loss) if loss is not None else None,
        "run_id": tracking_run_id(trainer, cfg),
        "tracking_delivery": getattr(trainer.logger, "last_report", None),
        "elapsed_s": round(elapsed_s, 3),
    }
    return summary | confusion_summary(model.last_confusion, model.classes)


def tracking_run_id(trainer: lightning.Trainer, cfg: TrainConfig) -> str | None:
    """The MLflow run logged into (rank 0 knows it), else the configured one."""
    if cfg.tracking is None:
        return None
    run_id = getattr(trainer.logger, "run_id", None) if trainer.is_global_zero else None
    return run_id or cfg.tracking.run_id
