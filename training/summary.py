"""`summary.json`: what a training run reports back to its launcher, and its figures.

Rank 0 writes it under the run's `output_dir` (training/train.py); the launcher
reads it back (training/launch/job.py). `summarise` gathers the figures of a finished
fit: steps and batches of every rank, losses, the confusion summary, communication
totals, every rank's parameter, optimizer-state and peak memory bytes, and where every
rank's step time went (`<figure>_per_rank`, per optimizer step, and `straggler`:
training/distributed/rank_time.py). It is
a collective (every rank calls it, in the same order of gathers).

Light at import on purpose (json, numpy, fsspec): a flow reading a summary through
the launcher imports neither torch nor Lightning, so torch is imported only inside
the functions that gather figures from a trainer.
"""

from __future__ import annotations

import json
import math
import resource
from typing import TYPE_CHECKING, Any

import numpy as np
from fsspec.core import url_to_fs

from preprocessing.contract.names import mlflow_key
from tracking.lifecycle.metrics import macro_f1, per_class_recall

if TYPE_CHECKING:
    import lightning

    from training.callbacks import JobCallbacks
    from training.config import TrainConfig

SUMMARY_NAME = "summary.json"
# The split training's validation pass read, so what chose a checkpoint or stopped early:
# `validation`, or `holdout` for a version without one (then evaluation and promotion judge
# the rows that chose), or None. The same words as the run's MLflow tag of that name.
CHOSEN_ON = "checkpoint_chosen_on"
CHOSEN_ON_TAG = f"ballast.{CHOSEN_ON}"
# `train.select_best`: the epoch whose weights were logged (0-based, as Lightning counts)
# and the rule that chose it; summary.json's `selection` holds the same and the figure.
SELECTED_EPOCH_TAG, SELECTED_BY_TAG = "ballast.selected_epoch", "ballast.selected_by"


def summary_uri(output_dir: str) -> str:
    return f"{output_dir.rstrip('/')}/{SUMMARY_NAME}"


def write_summary(output_dir: str, summary: dict[str, Any]) -> str:
    """Write `summary.json` under `output_dir` (any fsspec URI) and return its URI."""
    uri = summary_uri(output_dir)
    fs, path = url_to_fs(uri)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, json.dumps(summary, indent=1, sort_keys=True).encode())
    return uri


def read_summary(output_dir: str) -> dict[str, Any]:
    """The summary rank 0 wrote under `output_dir`."""
    fs, path = url_to_fs(summary_uri(output_dir))
    summary: dict[str, Any] = json.loads(fs.cat_file(path))
    return summary


def summarise(
    trainer: lightning.Trainer,
    model: Any,
    cfg: TrainConfig,
    callbacks: JobCallbacks,
    elapsed_s: float,
) -> dict[str, Any]:
    """The figures of the run that a flow, a person or a test reads back (a collective)."""
    classes = list(getattr(model, "classes", []))
    summary: dict[str, Any] = {
        "strategy": cfg.strategy,
        "classes": classes,
        "comm": callbacks.comm.summary() if callbacks.comm is not None else None,
        "run_id": tracking_run_id(trainer, cfg),
        "tracking_delivery": getattr(trainer.logger, "last_report", None),
        "elapsed_s": round(elapsed_s, 3),
    }
    summary |= step_figures(trainer, callbacks.counter.count) | loss_figures(trainer)
    for name, value in memory_figures(model, trainer).items():
        summary[f"{name}_per_rank"] = gather_counts(trainer, value)
    summary |= rank_time_figures(trainer, callbacks)
    if callbacks.balance is not None:  # `speed`: how the split moved (rank 0's lines)
        summary["balance_moves"] = callbacks.balance.moves
    return summary | confusion_summary(getattr(model, "last_confusion", None), classes)


def step_figures(trainer: lightning.Trainer, num_batches: int) -> dict[str, Any]:
    """World size, epochs and steps, and every rank's batches, steps and node (gathers)."""
    return {
        "world_size": trainer.world_size,
        "batches_per_rank": gather_counts(trainer, num_batches),
        "global_step": trainer.global_step,
        "global_step_per_rank": gather_counts(trainer, trainer.global_step),
        "node_rank_per_rank": gather_counts(trainer, trainer.node_rank),
        "epochs": trainer.current_epoch,
    }


def rank_time_figures(trainer: lightning.Trainer, callbacks: JobCallbacks) -> dict[str, Any]:
    """Every rank's step, data-wait, compute and all-reduce seconds per optimizer step and
    samples/s, as `<figure>_per_rank`, and the straggler among them (a gather)."""
    from training.distributed.rank_time import straggler

    per_rank = callbacks.ranks.per_rank(trainer)
    return {f"{name}_per_rank": values for name, values in per_rank.items()} | {
        "straggler": straggler(per_rank)
    }


def loss_figures(trainer: lightning.Trainer) -> dict[str, float | None]:
    """The last epoch's train and validation loss, None where not logged."""
    metrics = trainer.callback_metrics
    return {
        name: None if (value := metrics.get(name)) is None else float(value)
        for name in ("train_loss", "val_loss")
    }


def tracking_run_id(trainer: lightning.Trainer, cfg: TrainConfig) -> str | None:
    """The MLflow run logged into (rank 0 knows it), else the configured one."""
    if cfg.tracking is None:
        return None
    run_id = getattr(trainer.logger, "run_id", None) if trainer.is_global_zero else None
    return run_id or cfg.tracking.run_id


def confusion_summary(confusion: np.ndarray | None, classes: list[str]) -> dict[str, Any]:
    """Macro F1, recall per class (None without support), the matrix itself, and the
    MLflow key of each class whose `val_recall/` metric is not named by the label as it is
    (`val_recall_keys`: label -> key, see preprocessing/contract/names.py)."""
    if confusion is None:
        return {"val_macro_f1": None, "val_recall": {}, "confusion_matrix": None}
    recall = per_class_recall(confusion)
    return {
        "val_macro_f1": macro_f1(confusion),
        "val_recall": {
            name: None if math.isnan(value) else float(value)
            for name, value in zip(classes, recall, strict=True)
        },
        "confusion_matrix": np.asarray(confusion).tolist(),
        "val_recall_keys": {
            str(name): key
            for name in classes
            if (key := mlflow_key(name, "val_recall/")) != f"val_recall/{name}"
        },
    }


def gather_counts(trainer: lightning.Trainer, count: int) -> list[int]:
    """Every rank's `count`, in rank order (a collective: every rank must call it)."""
    import torch

    local = torch.tensor([count], dtype=torch.long, device=trainer.strategy.root_device)
    return [int(value) for value in trainer.strategy.all_gather(local).reshape(-1).tolist()]


def memory_figures(model: Any, trainer: lightning.Trainer) -> dict[str, int]:
    """This rank's parameter bytes, optimizer-state bytes and peak memory."""
    import torch

    optimizer_state = [
        value
        for optimizer in trainer.optimizers
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
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


def local_bytes(tensors: Any) -> int:
    """Bytes these tensors hold on this rank (a DTensor counts its local shard)."""
    from torch.distributed.tensor import DTensor

    total = 0
    for tensor in tensors:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        total += local.numel() * local.element_size()
    return total
