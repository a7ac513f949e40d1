"""Train a model on a dataset version: one call per rank, config -> trainer -> fit -> close.

`run_training(cfg)` seeds, builds this rank's job (training/trainer.py: streams,
model, strategy, callbacks, Trainer), fits it, resuming from `last.ckpt` when
`cfg.resume` is set or `ckpt_path` is given, and closes the run: the summary's
figures (training/summary.py; a collective), the trained network logged to MLflow
from rank 0 (with `select_best`, the chosen epoch's weights, training/selection.py, and
tags naming it), and `<output_dir>/summary.json`. It never spawns processes itself:
launch it with `python -m training` under torchrun, srun or a PyTorchJob
(training/launch/, docs/architecture.md M1). `close_process_group`
and `exit_rank` end a rank's process.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn, cast

import lightning
import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from tracking.config import TrackingConfig
from training.config import TrainConfig
from training.distributed.checkpoints import full_network_state, resolve_checkpoint
from training.models.classifier import build_model
from training.summary import (
    CHOSEN_ON,
    SELECTED_BY_TAG,
    SELECTED_EPOCH_TAG,
    summarise,
    write_summary,
)
from training.trainer import TrainingJob, build_job


def run_training(
    cfg: TrainConfig,
    ckpt_path: str | None = None,
    config_sha256: str | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Fit on `cfg.dataset` and return the summary (written by rank 0). `ckpt_path`:
    a checkpoint to resume from, or "last"; `cfg.resume` or `resume` (a retry's) mean
    "last" if there is one (a retry alone only the run's own).
    `config_sha256`: the sha256 of the config file this rank read, recorded in the summary
    (the launcher checks it against the file it pinned and MLflow's tag)."""
    started = time.monotonic()
    lightning.seed_everything(cfg.seed, workers=True)
    job = build_job(cfg)
    resume_from = resolve_checkpoint(ckpt_path, cfg.resume or resume, cfg.resume_candidates)
    fit(job, cfg.tracking, resume_from)
    summary = summarise(job.trainer, job.model, cfg, job.callbacks, time.monotonic() - started)
    summary["resumed_from"] = resume_from
    summary["config_sha256"] = config_sha256
    summary["loader"] = job.data.train_dataloader().metrics()
    summary[CHOSEN_ON] = job.data.chosen_on  # the split `val_*` (and any selection) read
    selection = job.callbacks.selection
    summary["selection"] = selection.summary() if selection is not None else None
    if selection is not None and selection.best.epoch is not None:
        summary["val_loss"] = selection.val_loss  # the chosen epoch's, as val_macro_f1
    model_uri = log_trained_model(cfg, job, summary["run_id"])
    if job.trainer.is_global_zero:
        tag_selection(cfg, summary)
        summary["model_uri"] = model_uri
        write_summary(cfg.output_dir, summary)
    return summary


def fit(job: TrainingJob, tracking: TrackingConfig | None, resume_from: str | None) -> None:
    """`Trainer.fit` from `resume_from` (None: from the start), node metrics sampled."""
    with warnings.catch_warnings(), node_system_metrics(tracking):
        # The streams' __len__ is exact on every rank and worker, which this warning doubts.
        warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")
        # weights_only: a checkpoint holds tensors and plain metadata; unpickling code from
        # one is refused (docs/reliability.md, "Trust boundary").
        job.trainer.fit(job.model, datamodule=job.data, ckpt_path=resume_from, weights_only=True)


@contextmanager
def node_system_metrics(tracking: TrackingConfig | None) -> Iterator[None]:
    """Per-node CPU/memory/GPU metrics into the job's run (tracking imported only then)."""
    if tracking is None or tracking.run_id is None:
        yield
        return
    from tracking.run.system_metrics import node_system_metrics as sample_node

    with sample_node(tracking, tracking.run_id):
        yield


def log_trained_model(cfg: TrainConfig, job: TrainingJob, run_id: str | None) -> str | None:
    """Log the unsharded network (no Lightning wrapper) to the job's MLflow run from rank 0.
    Every rank calls it: gathering a sharded network is a collective."""
    model, trainer, data = job.model, job.trainer, job.data
    net = getattr(model, "net", None)
    if cfg.tracking is None or not isinstance(net, torch.nn.Module):
        return None
    state = full_network_state(net, isinstance(trainer.strategy, ModelParallelStrategy))
    if not trainer.is_global_zero or run_id is None:
        return None
    from tracking.run.model import log_model

    network = cast(torch.nn.Module, build_model(cfg.model, data.num_features, data.classes).net)
    network.load_state_dict(state)
    # The version's codec and classes go with the network: the model predicts on raw rows.
    return log_model(cfg.tracking, run_id, network, cfg.dataset)


def tag_selection(cfg: TrainConfig, summary: dict[str, Any]) -> None:
    """`select_best`'s choice as tags of the job's run (rank 0): the epoch logged and
    the rule, e.g. `val_loss (min), patience 3, on the validation split`."""
    chosen, run_id = summary["selection"], summary["run_id"]
    if chosen is None or cfg.tracking is None or run_id is None:
        return
    from tracking.run.job_config import tag_job_run

    rule = f"{chosen['monitor']} ({chosen['mode']}), patience {chosen['patience']}"
    tags = {SELECTED_EPOCH_TAG: str(chosen["epoch"])}
    tags[SELECTED_BY_TAG] = f"{rule}, on the {summary[CHOSEN_ON]} split"
    tag_job_run(cfg.tracking, run_id, tags)


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
    SIGABRT; seen on about 1 in 12 runs of a 2-rank gloo job on CPU), which turns a
    finished job into a failed one. Everything a rank writes is on disk or in MLflow
    by now, so the shutdown is skipped."""
    close_process_group()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
