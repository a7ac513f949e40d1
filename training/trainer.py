"""Build one rank's training job from its config: data, model, strategy, callbacks, Trainer.

`build_job(cfg)` makes, in this order (the model's weights come from the seeded
generator, so the order is part of a run's result): the streams (a
`StreamDataModule`), the model named by `cfg.model.class_path`, the strategy
(training/distributed/strategy.py, sharding the model for FSDP2 / tensor parallel),
the job's callbacks (training/callbacks.py), the MLflow logger when tracking is
configured, and a Lightning `Trainer` whose devices and nodes come from the
environment torchrun sets (WORLD_SIZE, LOCAL_WORLD_SIZE; one process without it).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import lightning
import torch
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import ModelParallelStrategy

from training.callbacks import JobCallbacks
from training.config import TrainConfig, check_selection_split
from training.data.datamodule import StreamDataModule
from training.data.loader import ShardStream
from training.distributed.env import env_local_world_size, env_world_size
from training.distributed.parallelize import bind_parallelism
from training.distributed.strategy import build_strategy
from training.models.classifier import build_model


@dataclass(frozen=True)
class TrainingJob:
    """What one rank fits, and what its summary reads afterwards."""

    data: StreamDataModule
    model: lightning.LightningModule
    callbacks: JobCallbacks
    trainer: lightning.Trainer


@dataclass(frozen=True)
class RankWorld:
    """The ranks of the job (WORLD_SIZE) and those on this node (LOCAL_WORLD_SIZE)."""

    world_size: int
    local_world_size: int

    @classmethod
    def from_environment(cls) -> RankWorld:
        return cls(env_world_size(), env_local_world_size())


def build_job(cfg: TrainConfig) -> TrainingJob:
    """The data, model, callbacks and Trainer of this rank (call after seeding)."""
    world = RankWorld.from_environment()
    data = StreamDataModule(cfg.dataset, cfg.loader, cfg.seed, cfg.read)
    check_enough_rows(data.train_stream, world.world_size, cfg)
    check_selection_split(cfg.select_best, data.chosen_on)
    model = build_model(cfg.model, data.num_features, data.classes)
    strategy = build_strategy(cfg, world.world_size)
    if isinstance(strategy, ModelParallelStrategy):
        bind_parallelism(model, tensor_parallel=cfg.strategy == "tp")
    callbacks = JobCallbacks(cfg, strategy, world.world_size, data.train_stream)
    num_batches = data.train_stream.num_batches(world.world_size)
    trainer = build_trainer(cfg, world, strategy, callbacks, num_batches)
    return TrainingJob(data, model, callbacks, trainer)


def check_enough_rows(train: ShardStream, world_size: int, cfg: TrainConfig) -> None:
    """Refuse a train split too small for one global batch, which would train nothing."""
    if train.num_batches(world_size) == 0:
        raise ValueError(
            f"{cfg.dataset}: the train split has {train.num_rows} rows, fewer than one global "
            f"batch of {world_size} ranks x {cfg.loader.batch_size}"
        )


def build_trainer(
    cfg: TrainConfig, world: RankWorld, strategy: Any, callbacks: JobCallbacks, num_batches: int
) -> lightning.Trainer:
    """A Trainer for this rank: devices and nodes from torchrun's environment."""
    cuda = torch.cuda.is_available()
    return lightning.Trainer(
        accelerator="cuda" if cuda else "cpu",
        devices=world.local_world_size,
        num_nodes=world.world_size // world.local_world_size,
        strategy=strategy,
        precision=cfg.precision,
        accumulate_grad_batches=cfg.accumulate_grad_batches,
        use_distributed_sampler=False,
        max_epochs=cfg.max_epochs,
        logger=build_logger(cfg),
        callbacks=callbacks.all,
        default_root_dir=cfg.output_dir,
        enable_progress_bar=sys.stderr.isatty(),
        enable_model_summary=False,
        log_every_n_steps=max(1, min(50, num_batches)),
        # CUDA attention kernels have no deterministic backward: warn there instead.
        deterministic="warn" if cuda else True,
    )


def build_logger(cfg: TrainConfig) -> Logger | bool:
    """The MLflow logger when tracking is configured; tracking is imported only then."""
    if cfg.tracking is None:
        return False
    from tracking.run.logger import make_lightning_logger

    logger: Logger = make_lightning_logger(cfg.tracking)
    return logger
