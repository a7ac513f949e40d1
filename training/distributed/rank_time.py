"""Where each rank's time goes, per step: data wait, compute, gradient all-reduce.

`RankTimes` (a Lightning callback, on every rank) times every train batch:

- `step_s`: wall time from the end of the previous batch to the end of this one;
- `data_wait_s`: the part spent inside the loader's `next()` (training/data/wait.py);
- `allreduce_blocked_s`: the part of gradient all-reduce the step waited for after
  backward had computed its last gradient, and `allreduce_hidden_s`, the part that ran
  while backward was still computing (comm/compute overlap, measured). Both come from
  the launch and completion of every all-reduce the `CommMeter` saw
  (training/distributed/comm.py): backward ends, to within one bucket, when the last
  bucket's all-reduce is launched; an all-reduce outside backward (post-local SGD's
  averaging) blocks the step all along;
- `compute_s`: the batch's own time (forward, backward, optimizer step) less the
  blocked all-reduce; measured apart from the step, so `step_s` ~ `data_wait_s` +
  `compute_s` + `allreduce_blocked_s` is a check, the rest being the loop's overhead
  (Lightning's own, callbacks after this one, checkpoints written between steps);
- `samples`: rows of the batch, hence `samples_per_s`;
- `own_sq_s`: the step's own work (data wait plus compute) squared, hence `own_sd_s`,
  its standard deviation from step to step (`loader.balance: speed` reads a rank
  interrupted in bursts from it: training/data/step_noise.py).

In synchronous DDP every rank's step takes as long as the slowest rank's: a straggler
shows as the rank with the largest `busy_s` (step time less blocked all-reduce) while
the others wait in all-reduce. At every `log_every_n_steps` optimizer steps (and at
each epoch's end) one all_gather brings every rank's figures of the interval to rank 0,
which logs them as `rank_<r>/<figure>` (per optimizer step). `straggler` says which rank
is slowest, its slowdown against the median, and the share of the step lost to it.
`on_gathered` receives every interval's gathered totals on every rank (`loader.balance:
speed` re-plans the ranks' shares from their data wait plus compute, which, unlike
`step_s`, holds none of the gather's own wait: training/callbacks.py); `every_n_steps`
then gathers at least that often. Those gathers run in the background: launched at the
interval's end and taken at the next step's end, by when that step's gradient
all-reduce, queued after it, is done. Waiting for every rank at every interval's end
made a 2-rank MLP's gather step 1.5-2 ms longer (10 ms steps; +4.5 % a step at
`every_n_steps` 4, benchmarks/RESULTS.md M53). The epoch's last interval and the run's
totals are gathered at once, as without `on_gathered`. Such an interval also lasts at
least `min_interval_s` (MIN_INTERVAL_S) at the last interval's pace, in whole steps
(`interval_steps`: from the gathered figures, so every rank counts the same).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from statistics import median
from typing import Any

import lightning
import torch
import torch.distributed as dist

from training.data.wait import loader_metrics
from training.distributed.comm import CommMeter, Span

ALLREDUCE_FIGURES = ("allreduce_blocked_s", "allreduce_hidden_s")
# A re-plan's interval lasts at least this long: a rank under a CPU quota (Linux CFS's
# 100 ms period, as a Kubernetes CPU limit sets it) runs in bursts, and an interval of a
# few 10 ms steps read one burst or one stall; and the gather is a small part of it.
MIN_INTERVAL_S = 0.25
# Called on every rank with every rank's totals of the interval just gathered, by name.
Gathered = Callable[[lightning.Trainer, list[dict[str, float]]], None]


@dataclass
class StepTotals:
    """Sums over the optimizer steps of an interval (or of the run)."""

    steps: float = 0.0
    step_s: float = 0.0
    data_wait_s: float = 0.0
    compute_s: float = 0.0
    allreduce_blocked_s: float = 0.0
    allreduce_hidden_s: float = 0.0
    samples: float = 0.0
    own_sq_s: float = 0.0  # the sum of each step's (data wait + compute) squared

    def add(self, other: StepTotals) -> None:
        for name in names():
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def values(self) -> list[float]:
        return [float(getattr(self, name)) for name in names()]


def names() -> list[str]:
    return [field.name for field in fields(StepTotals)]


def per_step(values: list[float], with_allreduce: bool) -> dict[str, float]:
    """Seconds per optimizer step, samples per second and busy seconds, from totals."""
    totals = dict(zip(names(), values, strict=True))
    steps, step_s = max(totals.pop("steps"), 1.0), totals["step_s"]
    figures = {name: value / steps for name, value in totals.items() if name != "samples"}
    figures["samples_per_s"] = totals["samples"] / step_s if step_s > 0 else 0.0
    figures["busy_s"] = figures["step_s"] - figures["allreduce_blocked_s"]
    own = figures["data_wait_s"] + figures["compute_s"]  # a step's own work, its mean
    figures["own_sd_s"] = math.sqrt(max(figures.pop("own_sq_s") - own**2, 0.0))
    if not with_allreduce:  # not measured (no DDP comm hook): absent, not zero
        for name in ALLREDUCE_FIGURES:
            figures.pop(name)
    return figures


def split_spans(spans: list[Span]) -> tuple[float, float]:
    """(blocked, hidden) seconds of one batch's all-reduces (see the module)."""
    outside = sum(span.ended - span.started for span in spans if not span.in_backward)
    inside = sorted((s.started, s.ended) for s in spans if s.in_backward)
    if not inside:
        return outside, 0.0
    backward_end = max(started for started, _ in inside)
    blocked = hidden = 0.0
    merged_start, merged_end = inside[0]
    for started, ended in [*inside[1:], (float("inf"), float("inf"))]:
        if started > merged_end:  # a gap: the merged run of all-reduces ends here
            blocked += max(0.0, merged_end - max(merged_start, backward_end))
            hidden += max(0.0, min(merged_end, backward_end) - merged_start)
            merged_start = started
        merged_end = max(merged_end, ended)
    return blocked + outside, hidden


def interval_steps(figures: list[dict[str, float]], fewest: int, min_interval_s: float) -> int:
    """Steps the next re-plan interval holds: at least `fewest`, and enough to last
    `min_interval_s` at the pace of the slowest rank in the interval of `figures` (every
    rank's totals, by name)."""
    pace = max(rank["step_s"] / max(rank["steps"], 1.0) for rank in figures)
    if pace <= 0:
        return fewest
    return max(fewest, math.ceil(min_interval_s / pace - 1e-9))


def straggler(per_rank: dict[str, list[float]]) -> dict[str, float] | None:
    """The slowest rank by busy time, its slowdown against the median rank, and the share
    of the mean step the job loses waiting for it; None without all-reduce figures."""
    busy, steps = per_rank.get("busy_s"), per_rank.get("step_s")
    if not busy or not steps or "allreduce_blocked_s" not in per_rank:
        return None
    slowest, typical = max(range(len(busy)), key=busy.__getitem__), median(busy)
    mean_step = sum(steps) / len(steps)
    return {
        "rank": slowest,
        "slowdown_vs_median": busy[slowest] / typical if typical > 0 else 1.0,
        "lost_share": (busy[slowest] - typical) / mean_step if mean_step > 0 else 0.0,
    }


class RankTimes(lightning.Callback):
    """Times every train batch of this rank; gathers and logs the figures per interval."""

    def __init__(
        self,
        meter: CommMeter | None,
        on_gathered: Gathered | None = None,
        every_n_steps: int | None = None,
        min_interval_s: float = MIN_INTERVAL_S,
    ) -> None:
        self.meter, self.on_gathered, self.every_n_steps = meter, on_gathered, every_n_steps
        self.min_interval_s = min_interval_s
        self._interval_steps = every_n_steps or 1  # `on_gathered`'s, until a gather says
        self.total, self.interval, self.pending = StepTotals(), StepTotals(), StepTotals()
        self._last_end = self._batch_start = time.perf_counter()
        self._data_wait, self._global_step = 0.0, -1
        self._in_flight: PendingGather | None = None  # the last interval's, taken a step later

    def on_train_start(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        self._global_step = trainer.global_step  # a resumed run starts past 0

    def on_train_epoch_start(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        self._last_end, self._data_wait = time.perf_counter(), data_wait_s(trainer)
        if self.meter is not None:
            self.meter.take_spans()  # validation's or setup's, if any

    def on_train_batch_start(self, trainer: lightning.Trainer, *args: Any) -> None:
        self._batch_start = time.perf_counter()

    def on_train_batch_end(
        self, trainer: lightning.Trainer, pl_module: Any, outputs: Any, batch: Any, *args: Any
    ) -> None:
        self.pending.add(self.time_batch(trainer, batch))
        if trainer.global_step == self._global_step:
            return  # accumulating: the optimizer step is not over
        self._global_step = trainer.global_step
        self.take_in_flight(trainer)
        self.pending.steps = 1.0
        self.pending.own_sq_s = (self.pending.data_wait_s + self.pending.compute_s) ** 2
        self.interval.add(self.pending)
        self.total.add(self.pending)
        self.pending = StepTotals()
        if self.on_gathered is not None:
            if self.interval.steps >= self._interval_steps:
                self.log_interval(trainer, background=True)
            return
        # Set on the Trainer by its logger connector (the Trainer class does not declare it).
        if trainer.global_step % max(int(getattr(trainer, "log_every_n_steps", 1)), 1) == 0:
            self.log_interval(trainer)

    def on_train_epoch_end(self, trainer: lightning.Trainer, pl_module: Any) -> None:
        self.take_in_flight(trainer)
        if self.interval.steps > 0:  # every rank ran the same steps: all gather, or none
            self.log_interval(trainer)

    def time_batch(self, trainer: lightning.Trainer, batch: Any) -> StepTotals:
        """The figures of the batch that just ended (see the module)."""
        now, waited = time.perf_counter(), data_wait_s(trainer)
        spans = self.meter.take_spans() if self.meter is not None else []
        blocked, hidden = split_spans(spans)
        ids = batch.get("id") if isinstance(batch, dict) else None
        figures = StepTotals(
            step_s=now - self._last_end,
            data_wait_s=waited - self._data_wait,
            compute_s=max(0.0, now - self._batch_start - blocked),
            allreduce_blocked_s=blocked,
            allreduce_hidden_s=hidden,
            samples=float(len(ids)) if ids is not None else 0.0,
        )
        self._last_end, self._data_wait = now, waited
        return figures

    def log_interval(self, trainer: lightning.Trainer, background: bool = False) -> None:
        """All-gather the interval's figures (one collective) and log them from rank 0;
        `background`: launch the gather and deliver it at the next step's end."""
        gather = start_gather(trainer, self.interval.values())
        self.interval = StepTotals()
        if background:
            self._in_flight = gather
        else:
            self.deliver(trainer, gather)

    def take_in_flight(self, trainer: lightning.Trainer) -> None:
        """Deliver the gather launched at the last interval's end, if any (every rank takes
        it at the same step)."""
        gather, self._in_flight = self._in_flight, None
        if gather is not None:
            self.deliver(trainer, gather)

    def deliver(self, trainer: lightning.Trainer, gather: PendingGather) -> None:
        """Hand a finished gather to `on_gathered` and log it from rank 0 at its step."""
        gathered = gather.rows()
        if self.on_gathered is not None:  # the same figures on every rank (a re-plan's input)
            figures = [dict(zip(names(), values, strict=True)) for values in gathered]
            fewest = self.every_n_steps or 1
            self._interval_steps = interval_steps(figures, fewest, self.min_interval_s)
            self.on_gathered(trainer, figures)
        if not trainer.is_global_zero or not trainer.loggers:
            return
        metrics = {
            f"rank_{rank}/{name}": value
            for rank, values in enumerate(gathered)
            for name, value in per_step(values, self.meter is not None).items()
        }
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=gather.step)

    def per_rank(self, trainer: lightning.Trainer) -> dict[str, list[float]]:
        """Every rank's run figures per optimizer step, by figure (a collective)."""
        self.take_in_flight(trainer)
        gathered = start_gather(trainer, self.total.values()).rows()
        figures = [per_step(values, self.meter is not None) for values in gathered]
        return {name: [round(rank[name], 6) for rank in figures] for name in figures[0]}


def data_wait_s(trainer: lightning.Trainer) -> float:
    """Seconds the train loader has kept this process waiting (0 without a StreamLoader)."""
    metrics = loader_metrics(trainer)
    return float(metrics["data_wait_s"]) if metrics is not None else 0.0


@dataclass
class PendingGather:
    """An all-gather of every rank's figures, launched at optimizer step `step`; `work` is
    torch.distributed's handle while it runs (None: one process, nothing to wait for)."""

    gathered: torch.Tensor  # (world size, figures)
    work: Any
    step: int

    def rows(self) -> list[list[float]]:
        """Every rank's figures, in rank order, once the gather is done."""
        if self.work is not None:
            self.work.wait()
        return [[float(value) for value in row] for row in self.gathered.tolist()]


def start_gather(trainer: lightning.Trainer, values: list[float]) -> PendingGather:
    """Launch the gather of every rank's `values` (a collective: every rank must call it,
    in the same order as every other collective)."""
    device = trainer.strategy.root_device
    local = torch.tensor([values], dtype=torch.float64, device=device)  # one row a rank
    if not (dist.is_available() and dist.is_initialized()):
        return PendingGather(local, None, trainer.global_step)
    gathered = local.new_empty((dist.get_world_size(), len(values)))
    work = dist.all_gather_single(gathered, local, async_op=True)
    return PendingGather(gathered, work, trainer.global_step)
