"""The Lightning callbacks of a training job: which ones a job has, and the small ones.

- `JobCallbacks`: a job's callbacks from its config (checkpoints, counting, data
  wait, clipping, communication, per-rank step times (training/distributed/rank_time.py),
  the hang watchdog (training/distributed/watchdog.py)), kept by name for the summary.
- `SpeedReplan`: `loader.balance: speed`'s controller, fed by the per-rank step times,
  and what it tells the operator (per-rank metrics, a line when the split moves).
- `RememberedSplit`: `speed`'s learned split and step model kept in the output dir all
  its runs share (`TrainConfig.shared_output_dir`, not one run's folder) for the next job on
  the same hosts (training/data/split_memory.py), and every rank's host for the stream's
  checks (a checkpoint's shares count only on the hosts they were learned on).
- `DataWaitCallback`: the train loader's throughput and data-wait fraction per epoch
  (training/data/wait.py measures them).
- `BatchCounter`: the train batches this rank ran (summary.json compares ranks).
- `GradientClipping`: clips the global gradient norm before each optimizer
  step, for plain tensors and DTensors alike (FSDP2 shards, tensor-parallel
  layers), which Lightning's own clipping does not cover for sharded models.
  Logs `grad_norm` (before clipping).
- `CommMetrics`: per optimizer step, the bytes and seconds of gradient
  all-reduce that the strategy's `CommMeter` measured (training/distributed/comm.py), as
  `comm/allreduce_bytes`, `comm/allreduce_s` and `comm/compute_comm_ratio`
  (step time outside all-reduce over all-reduce time), and their totals for
  the summary. Values are rank 0's, logged without a collective.
- `SelectBest` (training/selection.py) when `select_best` is set: early stopping and
  the best epoch's weights restored at the train's end.
- `checkpoint_callbacks`: `last.ckpt`, at every epoch's end and every
  `checkpoint_every_n_steps` optimizer steps.
"""

from __future__ import annotations

import logging
import socket
import time
from typing import Any

import lightning
import numpy as np
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from torch.distributed.tensor import DTensor

from training.config import LAST_CHECKPOINT_NAME, TrainConfig
from training.data.balance import row_bounds
from training.data.loader import ShardStream
from training.data.split_memory import learned_entry, remember_split, remembered
from training.data.wait import interval, loader_metrics
from training.distributed.comm import CommMeter
from training.distributed.rank_time import RankTimes
from training.distributed.strategy import MeteredDDPStrategy
from training.distributed.watchdog import HangWatchdog
from training.log_cadence import logs_this_step
from training.selection import SelectBest


class JobCallbacks:
    """The callbacks of a job, kept by name for the summary."""

    def __init__(
        self,
        cfg: TrainConfig,
        strategy: Any,
        world_size: int = 1,
        train_stream: ShardStream | None = None,
    ) -> None:
        self.counter = BatchCounter()
        meter = strategy.meter if isinstance(strategy, MeteredDDPStrategy) else None
        self.comm = CommMetrics(meter) if meter is not None else None
        self.balance = (
            SpeedReplan(train_stream, cfg.loader.balance_every_n_steps)
            if cfg.loader.balance == "speed" and train_stream is not None
            else None
        )
        if self.balance is not None:
            self.ranks = RankTimes(meter, self.balance, cfg.loader.balance_every_n_steps)
        else:
            self.ranks = RankTimes(meter)
        extra: list[lightning.Callback] = [DataWaitCallback(), self.ranks]
        if self.balance is not None and train_stream is not None:
            extra.append(RememberedSplit(train_stream, cfg.shared_output_dir))
        if world_size > 1:  # one process has no peer to hang on, nor a collective timeout
            extra.append(HangWatchdog(cfg.watchdog_timeout_s, cfg.output_dir))
        if cfg.gradient_clip_norm is not None:
            extra.append(GradientClipping(cfg.gradient_clip_norm))
        self.selection = SelectBest(cfg.select_best) if cfg.select_best is not None else None
        extra += [self.selection] if self.selection is not None else []
        self.all: list[lightning.Callback] = [*checkpoint_callbacks(cfg), self.counter, *extra]
        self.all += [self.comm] if self.comm is not None else []


class SpeedReplan:
    """`loader.balance: speed`: new shares for the train stream from the gathered step
    times (training/data/balance.py), logged from rank 0 as the MLflow metrics
    `balance/share_rank_<r>` and `balance/rows_rank_<r>` (rows a step); a move of some
    rank's rows by more than `MOVE_LINE` since the last line gives a line in the job's
    log and in `moves` (the summary's `balance_moves`, which the run log prints).

    What it measures is each rank's own work: its data wait (reading and decoding its
    rows) plus its batch's compute less the all-reduce it waited for. Not the whole step:
    the time between batches holds the interval's all_gather (where the rank that gets
    there first waits for the others), rank 0's logging and checkpoint barriers, none of
    which rows move, and on alike ranks those waits alone would read as one rank slower.
    Gathers come every interval (at least `every_n_steps` steps and 0.25 s,
    training/distributed/rank_time.py) and at each epoch's end, so short intervals (an
    epoch's last steps) are summed with the next ones until they hold at least
    `every_n_steps` steps: every re-plan reads at least that many."""

    MOVE_LINE = 0.1

    def __init__(self, stream: ShardStream, every_n_steps: int = 1) -> None:
        self.stream, self.every_n_steps = stream, every_n_steps
        self.moves: list[str] = []
        self._rows: np.ndarray | None = None  # rows a step when the last line was written
        self._held: list[dict[str, float]] = []  # figures of steps not yet re-planned from

    def __call__(self, trainer: lightning.Trainer, figures: list[dict[str, float]]) -> None:
        figures = self.hold(figures)
        if not figures:
            return
        state = self.stream.state_dict()
        batch_size = self.stream.config.batch_size
        shares = self.stream.shares.replan(
            state["epoch"],
            state["samples_consumed"],
            len(figures) * batch_size,
            [rank["samples"] for rank in figures],
            [own_work_s(rank) for rank in figures],
            own_spread(figures),
        )
        rows = np.diff(row_bounds(shares, len(shares) * batch_size))
        if not trainer.is_global_zero:
            return
        metrics = {f"balance/share_rank_{r}": float(v) for r, v in enumerate(shares)}
        metrics |= {f"balance/rows_rank_{r}": float(v) for r, v in enumerate(rows)}
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
        self.note_move(rows, trainer.global_step)

    def hold(self, figures: list[dict[str, float]]) -> list[dict[str, float]]:
        """The figures summed since the last re-plan once they hold `every_n_steps` steps
        (then the sum starts over), else none. Every rank sums the same gathered figures."""
        if len(self._held) == len(figures):
            figures = [
                {name: held[name] + value for name, value in rank.items()}
                for held, rank in zip(self._held, figures, strict=True)
            ]
        if figures and figures[0]["steps"] < self.every_n_steps:
            self._held = figures
            return []
        self._held = []
        return figures

    def note_move(self, rows: np.ndarray, step: int) -> None:
        """A line when some rank's rows a step moved by more than `MOVE_LINE` since the
        last line (from the equal split at first): "rank 1 slower: 382/130 rows a step"."""
        last = self._rows if self._rows is not None else np.full(len(rows), rows.mean())
        if np.abs(rows - last).max() <= self.MOVE_LINE * last.min():
            return
        self._rows = rows
        split = "/".join(str(int(count)) for count in rows)
        who = "ranks alike" if rows.min() == rows.max() else f"rank {int(np.argmin(rows))} slower"
        line = f"step {step}: {who}: {split} rows a step"
        self.moves.append(line)
        rank_zero_info(f"balance: {line}")


class RememberedSplit(lightning.Callback):
    """`speed`: at setup, every rank's host name (gathered) and the split and controller's
    reading remembered for them in the shared output dir (at this global batch), read by
    rank 0 and broadcast so that every rank slices alike; at each epoch's end and the
    fit's, rank 0 records the split in force and the last reading when either changed
    since the last record. A file that cannot be written costs the memory, not the job."""

    def __init__(self, stream: ShardStream, output_dir: str) -> None:
        self.stream, self.output_dir = stream, output_dir
        self._written: tuple[list[float], dict[str, Any] | None] | None = None

    def setup(self, trainer: lightning.Trainer, pl_module: Any, stage: str) -> None:
        plan = self.stream.shares
        plan.hosts = gathered_hosts()
        batch = self.global_batch(len(plan.hosts))
        found: list[Any] = [None, None]
        if trainer.is_global_zero:
            found = list(remembered(self.output_dir, plan.hosts, batch))
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.broadcast_object_list(found, src=0)
        plan.remembered, plan.learned = found
        self._written = None

    def global_batch(self, world_size: int) -> int:
        return world_size * self.stream.config.batch_size

    def on_train_epoch_end(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        self.record(trainer)

    def on_fit_end(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        self.record(trainer)

    def record(self, trainer: lightning.Trainer) -> None:
        plan = self.stream.shares
        if not trainer.is_global_zero or not plan.changes or plan.hosts is None:
            return
        shares = [float(share) for share in plan.changes[-1][1]]
        batch = self.global_batch(len(shares))
        learned = None if plan.last is None else learned_entry(plan.last, batch)
        if (shares, learned) == self._written:
            return
        try:
            remember_split(self.output_dir, plan.hosts, np.asarray(shares), learned)
        except OSError as error:
            logging.getLogger(__name__).warning("balance split not remembered: %s", error)
            return
        self._written = (shares, learned)


def gathered_hosts() -> list[str]:
    """Every rank's host name, in rank order (this one's alone without a process group)."""
    name = socket.gethostname()
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [name]
    hosts: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(hosts, name)
    return [str(host) for host in hosts]


def own_spread(figures: list[dict[str, float]]) -> list[float] | None:
    """Every rank's sum of its squared per-step own work, or None where some rank's
    figures do not hold it (the controller then equalises mean times alone)."""
    if not all("own_sq_s" in rank for rank in figures):
        return None
    return [rank["own_sq_s"] for rank in figures]


def own_work_s(figures: dict[str, float]) -> float:
    """A rank's seconds of its own work in an interval (see `SpeedReplan`)."""
    return figures["data_wait_s"] + figures["compute_s"]


def checkpoint_callbacks(cfg: TrainConfig) -> list[ModelCheckpoint]:
    """One file (or DCP directory), last.ckpt, rewritten at every epoch's end and, when
    `checkpoint_every_n_steps` is set, every that many optimizer steps (Lightning takes
    the two triggers only as two callbacks)."""
    common: dict[str, Any] = {
        "dirpath": cfg.checkpoint_uri,
        "filename": LAST_CHECKPOINT_NAME.removesuffix(".ckpt"),
        "save_top_k": 1,
        "enable_version_counter": False,
    }
    every = cfg.checkpoint_every_n_steps
    return [ModelCheckpoint(**common)] + (
        [ModelCheckpoint(**common, every_n_train_steps=every)] if every else []
    )


class BatchCounter(lightning.Callback):
    """Train batches run by this rank in this process."""

    def __init__(self) -> None:
        self.count = 0

    def on_train_batch_end(self, trainer: lightning.Trainer, *args: Any) -> None:
        self.count += 1


class GradientClipping(lightning.Callback):
    """Scale all gradients so that their global L2 norm is at most `max_norm`."""

    def __init__(self, max_norm: float) -> None:
        self.max_norm = max_norm

    def on_before_optimizer_step(
        self, trainer: lightning.Trainer, pl_module: Any, optimizer: torch.optim.Optimizer
    ) -> None:
        grads = [
            p.grad
            for group in optimizer.param_groups
            for p in group["params"]
            if p.grad is not None
        ]
        if not grads:
            return
        total = torch.nn.utils.get_total_norm(grads)
        if isinstance(total, DTensor):
            total = total.full_tensor()
        scale = float((self.max_norm / (total + 1e-6)).clamp(max=1.0))
        for grad in grads if scale < 1.0 else []:
            grad.mul_(scale)
        pl_module.log("grad_norm", float(total), on_step=True, on_epoch=False, batch_size=1)


class CommMetrics(lightning.Callback):
    """Logs the metered gradient communication of every optimizer step."""

    def __init__(self, meter: CommMeter) -> None:
        self.meter = meter
        self.steps, self.last_bytes, self.first_bytes = 0, 0, 0
        self._step_start: float | None = None
        self._global_step = -1

    def on_train_start(self, trainer: lightning.Trainer, *args: Any) -> None:
        self._global_step = trainer.global_step  # a resumed run starts past 0

    def on_train_batch_start(self, trainer: lightning.Trainer, *args: Any) -> None:
        if self._step_start is None:
            self._step_start = time.perf_counter()

    def on_train_batch_end(self, trainer: lightning.Trainer, pl_module: Any, *args: Any) -> None:
        if trainer.global_step == self._global_step or self._step_start is None:
            return  # accumulating: the step is not over
        self._global_step = trainer.global_step
        step_s = time.perf_counter() - self._step_start
        self._step_start = None
        num_bytes, comm_s = self.meter.take()
        self.record(num_bytes)
        if not logs_this_step(trainer):
            return
        figures = {"comm/allreduce_bytes": float(num_bytes), "comm/allreduce_s": comm_s}
        if comm_s > 0:
            figures["comm/compute_comm_ratio"] = max(step_s - comm_s, 0.0) / comm_s
        for name, value in figures.items():
            pl_module.log(name, value, on_step=True, on_epoch=False, batch_size=1)

    def record(self, num_bytes: int) -> None:
        self.first_bytes = num_bytes if self.steps == 0 else self.first_bytes
        self.last_bytes = num_bytes
        self.steps += 1

    def summary(self) -> dict[str, Any]:
        """Totals of this process: bytes and seconds, per step on average, first and last."""
        steps = max(self.steps, 1)
        return {
            "steps": self.steps,
            "allreduce_bytes_total": self.meter.total_bytes,
            "allreduce_s_total": round(self.meter.total_seconds, 6),
            "allreduce_bytes_per_step": self.meter.total_bytes / steps,
            "allreduce_s_per_step": self.meter.total_seconds / steps,
            "first_step_bytes": self.first_bytes,
            "last_step_bytes": self.last_bytes,
        }


class DataWaitCallback(lightning.Callback):
    """Logs the train loader's `loader/samples_per_s`, `loader/data_wait_fraction` and
    `loader/data_wait_s` once per train epoch, from rank 0, through `pl_module.log`."""

    def __init__(self) -> None:
        self._start: dict[str, float] | None = None

    def on_train_start(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        self._start = loader_metrics(trainer)  # a run resumed mid-epoch starts no epoch

    def on_train_epoch_start(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        self._start = loader_metrics(trainer)

    def on_train_epoch_end(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        now = loader_metrics(trainer)
        if now is None or self._start is None:
            return
        figures = interval(self._start, now)
        for name in ("samples_per_s", "data_wait_fraction", "data_wait_s"):
            pl_module.log(f"loader/{name}", figures[name], rank_zero_only=True)
