"""Train a model on a dataset version: one call per rank.

`run_training(cfg)` builds the streams (a `StreamDataModule`), the model named
by `cfg.model.class_path`, the strategy (training/distributed/strategy.py) and a Lightning
`Trainer` whose devices and nodes come from the environment torchrun sets
(WORLD_SIZE, LOCAL_WORLD_SIZE); it fits, resuming from `last.ckpt` when
`cfg.resume` is set or `ckpt_path` is given, and rank 0 logs the trained
network to MLflow and writes `<output_dir>/summary.json`. It never spawns
processes itself: launch it with `python -m training` under torchrun
(training/launch.py), srun or a PyTorchJob (training/launchers.py,
docs/architecture.md M1).
"""

from __future__ import annotations

import gc
import logging
import os
import resource
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, cast

import lightning
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.tensor import DTensor

from tracking.config import TrackingConfig
from training.callbacks import BatchCounter, CommMetrics, GradientClipping
from training.config import TrainConfig
from training.data.datamodule import StreamDataModule
from training.data.loader import ShardStream
from training.data.wait import DataWaitCallback
from training.distributed.checkpoints import full_network_state, resolve_checkpoint
from training.distributed.parallelize import bind_parallelism
from training.distributed.strategy import MeteredDDPStrategy, build_strategy
from training.models.classifier import build_model
from training.summary import confusion_summary, write_summary


def run_training(cfg: TrainConfig, ckpt_path: str | None = None) -> dict[str, Any]:
    """Fit on `cfg.dataset` and return the summary (written by rank 0). `ckpt_path`:
    a checkpoint to resume from, or "last"; `cfg.resume` means "last" if there is one."""
    started = time.monotonic()
    lightning.seed_everything(cfg.seed, workers=True)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    data = StreamDataModule(cfg.dataset, cfg.loader, cfg.seed, cfg.read)
    check_enough_rows(data.train_stream, world_size, cfg)
    model = build_model(cfg.model, data.num_features, data.classes)
    strategy = build_strategy(cfg, world_size)
    if isinstance(strategy, ModelParallelStrategy):
        bind_parallelism(model, tensor_parallel=cfg.strategy == "tp")
    job = JobCallbacks(cfg, strategy)
    trainer = build_trainer(cfg, strategy, job, data.train_stream.num_batches(world_size))
    resume_from = resolve_checkpoint(ckpt_path, cfg.resume, cfg.checkpoint_uri)
    with warnings.catch_warnings(), node_system_metrics(cfg.tracking):
        # The streams' __len__ is exact on every rank and worker, which this warning doubts.
        warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")
        trainer.fit(model, datamodule=data, ckpt_path=resume_from)
    summary = summarise(trainer, model, cfg, job, time.monotonic() - started)
    summary["resumed_from"] = resume_from
    summary["loader"] = data.train_dataloader().metrics()
    model_uri = log_trained_model(cfg, trainer, model, data, summary["run_id"])
    if trainer.is_global_zero:
        summary["model_uri"] = model_uri
        write_summary(cfg.output_dir, summary)
    return summary


class JobCallbacks:
    """The callbacks of a job, kept by name for the summary."""

    def __init__(self, cfg: TrainConfig, strategy: Any) -> None:
        self.counter = BatchCounter()
        meter = strategy.meter if isinstance(strategy, MeteredDDPStrategy) else None
        self.comm = CommMetrics(meter) if meter is not None else None
        extra: list[lightning.Callback] = [DataWaitCallback()]
        if cfg.gradient_clip_norm is not None:
            extra.append(GradientClipping(cfg.gradient_clip_norm))
        self.all: list[lightning.Callback] = [*checkpoints(cfg), self.counter, *extra]
        self.all += [self.comm] if self.comm is not None else []


def checkpoints(cfg: TrainConfig) -> list[ModelCheckpoint]:
    """One file (or DCP directory), last.ckpt, rewritten at every epoch's end and, when
    `checkpoint_every_n_steps` is set, every that many optimizer steps (Lightning takes
    the two triggers only as two callbacks)."""
    common: dict[str, Any] = {"dirpath": cfg.checkpoint_uri, "filename": "last",
                              "save_top_k": 1, "enable_version_counter": False}
    every = cfg.checkpoint_every_n_steps
    return [ModelCheckpoint(**common)] + (
        [ModelCheckpoint(**common, every_n_train_steps=every)] if every else [])


def check_enough_rows(train: ShardStream, world_size: int, cfg: TrainConfig) -> None:
    """Refuse a train split too small for one global batch, which would train nothing."""
    if train.num_batches(world_size) == 0:
        raise ValueError(
            f"{cfg.dataset}: the train split has {train.num_rows} rows, fewer than one global "
            f"batch of {world_size} ranks x {cfg.loader.batch_size}"
        )


def build_trainer(
    cfg: TrainConfig, strategy: Any, job: JobCallbacks, num_batches: int
) -> lightning.Trainer:
    """A Trainer for this rank: devices and nodes from torchrun's environment."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(world_size)))
    cuda = torch.cuda.is_available()
    return lightning.Trainer(
        accelerator="cuda" if cuda else "cpu",
        devices=local_world_size,
        num_nodes=world_size // local_world_size,
        strategy=strategy,
        precision=cfg.precision,
        accumulate_grad_batches=cfg.accumulate_grad_batches,
        use_distributed_sampler=False,
        max_epochs=cfg.max_epochs,
        logger=build_logger(cfg),
        callbacks=job.all,
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
    from tracking.logger import make_lightning_logger

    logger: Logger = make_lightning_logger(cfg.tracking)
    return logger


def log_trained_model(
    cfg: TrainConfig, trainer: lightning.Trainer, model: Any, data: StreamDataModule,
    run_id: str | None,
) -> str | None:
    """Log the unsharded network (no Lightning wrapper) to the job's MLflow run from rank 0.
    Every rank calls it: gathering a sharded network is a collective."""
    if cfg.tracking is None or not isinstance(getattr(model, "net", None), torch.nn.Module):
        return None
    sharded = isinstance(trainer.strategy, ModelParallelStrategy)
    state = full_network_state(model.net, sharded)
    if not trainer.is_global_zero or run_id is None:
        return None
    from tracking.registry import log_model

    network = cast(torch.nn.Module, build_model(cfg.model, data.num_features, data.classes).net)
    network.load_state_dict(state)
    example = getattr(model, "example_features", torch.zeros(1, data.num_features))
    classes = [str(value) for value in data.classes]
    return log_model(cfg.tracking, run_id, network, example.float().numpy(), classes)


def gather_counts(trainer: lightning.Trainer, count: int) -> list[int]:
    """Every rank's `count`, in rank order (a collective: every rank must call it)."""
    local = torch.tensor([count], dtype=torch.long, device=trainer.strategy.root_device)
    return [int(value) for value in trainer.strategy.all_gather(local).reshape(-1).tolist()]


def local_bytes(tensors: Any) -> int:
    """Bytes these tensors hold on this rank (a DTensor counts its local shard)."""
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total


def memory_figures(model: Any, trainer: lightning.Trainer) -> dict[str, int]:
    """This rank's parameter bytes, optimizer-state bytes and peak memory."""
    optimizer_state = [
        value for optimizer in trainer.optimizers for state in optimizer.state.values()
        for value in state.values() if isinstance(value, torch.Tensor) and value.dim() > 0
    ]
    if torch.cuda.is_available():
        peak = int(torch.cuda.max_memory_allocated())
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "param_bytes": local_bytes(model.parameters()),
        "optimizer_state_bytes": local_bytes(optimizer_state),
        "peak_memory_bytes": peak,
    }


def summarise(
    trainer: lightning.Trainer, model: Any, cfg: TrainConfig, job: JobCallbacks, elapsed_s: float
) -> dict[str, Any]:
    """The figures of the run that a flow, a person or a test reads back."""
    loss, val_loss = (trainer.callback_metrics.get(name) for name in ("train_loss", "val_loss"))
    classes = list(getattr(model, "classes", []))
    summary: dict[str, Any] = {
        "strategy": cfg.strategy,
        "world_size": trainer.world_size,
        "batches_per_rank": gather_counts(trainer, job.counter.count),
        "global_step": trainer.global_step,
        "global_step_per_rank": gather_counts(trainer, trainer.global_step),
        "node_rank_per_rank": gather_counts(trainer, trainer.node_rank),
        "classes": classes,
        "epochs": trainer.current_epoch,
        "train_loss": float(loss) if loss is not None else None,
        "val_loss": float(val_loss) if val_loss is not None else None,
        "comm": job.comm.summary() if job.comm is not None else None,
        "run_id": tracking_run_id(trainer, cfg),
        "tracking_delivery": getattr(trainer.logger, "last_report", None),
        "elapsed_s": round(elapsed_s, 3),
    }
    for name, value in memory_figures(model, trainer).items():
        summary[f"{name}_per_rank"] = gather_counts(trainer, value)
    return summary | confusion_summary(getattr(model, "last_confusion", None), classes)


def close_process_group(wait_for_peers: bool = True) -> None:
    """Destroy the process groups of this process, if any, once every rank got here
    (`wait_for_peers`; a failing rank does not wait for peers that may be dead).

    Trainers, DDP reducers and comm-hook states hold the groups in reference cycles;
    collecting them first lets the groups' threads be joined now, not in interpreter
    shutdown. The barrier keeps one rank from closing its sockets while a peer still
    has collectives in flight."""
    gc.collect()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if wait_for_peers:
            torch.distributed.barrier()
        torch.distributed.destroy_process_group()
    gc.collect()


def exit_rank(code: int) -> NoReturn:
    """Close the process groups, flush logs and streams, and end the process now.

    Interpreter shutdown after a successful distributed run sometimes aborts in a C++
    destructor of torch.distributed ("terminate called without an active exception",
    SIGABRT; seen on about 1 in 20 runs of a 2-rank gloo job on CPU), which turns a
    finished job into a failed one. Everything a rank writes is on disk or in MLflow
    by now, so the shutdown is skipped."""
    close_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def tracking_run_id(trainer: lightning.Trainer, cfg: TrainConfig) -> str | None:
    """The MLflow run logged into (rank 0 knows it), else the configured one."""
    if cfg.tracking is None:
        return None
    run_id = getattr(trainer.logger, "run_id", None) if trainer.is_global_zero else None
    return run_id or cfg.tracking.run_id


@contextmanager
def node_system_metrics(tracking: TrackingConfig | None) -> Iterator[None]:
    """Per-node CPU/memory/GPU metrics into the job's run (tracking imported only then)."""
    if tracking is None or tracking.run_id is None:
        yield
        return
    from tracking.system_metrics import node_system_metrics as sample_node

    with sample_node(tracking, tracking.run_id):
        yield
