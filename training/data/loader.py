"""Stream one split of a dataset version to every rank and DataLoader worker.

`ShardStream` is an `IterableDataset` that yields collated batches (dicts of
tensors: `features` float32 [B, D], `label` int64 class index, `id` int64,
`weight` float32: 1 for a real sample, 0 for padding), so it is used with
`batch_size=None`; `StreamLoader` is that DataLoader. The contract
(docs/architecture.md):

- The order of an epoch depends on (seed, epoch) and the loader's order fields
  (batch_size, num_partitions, shuffle_window_row_groups) only: a stream of units
  of batch_size rows, each from one partition's shuffle window
  (training/data/partition.py).
- Global step t covers units [start + t*W, start + (t+1)*W) at world size W;
  rank r takes unit r of them. Every rank yields the same number of batches, so
  DDP never waits on a missing one (docs/architecture.md M8). `remainder="drop"`
  leaves out the last partial global batch; `"pad"` fills it with repeats of the
  epoch's last sample, of weight 0.
- `loader.balance: speed` or `balance_by: tokens` keep each global step's rows and
  order but cut them into per-rank slices of other sizes (training/data/balance.py),
  with a `loss_scale` that makes the averaged loss the step's mean (one process per
  rank, no workers): by samples a rank reads only the units its slice overlaps, by
  tokens every unit of the step.
- Worker w of a rank yields the rank's steps t with t % num_workers == w;
  DataLoader's in-order round robin then restores the rank's order. World size x
  workers must divide num_partitions: each worker then serves whole partitions
  and decodes only their row groups (about 1/(W x workers) of the split, plus the
  two row groups at the ends of its run); other counts are refused with an error.
- The position (epoch, samples consumed) is global, independent of the world
  size and worker count, so a run resumes with either changed. An exhausted
  epoch moves the stream to the start of the next one. The state also records
  the order fields, and a checkpoint resumed with other values is refused.
- `len()` is the epoch's length as a trainer counts it: the batches each rank
  took before the saved position (`rank_batches` in the state) plus those left
  at the current world size. Lightning restores its own batch count on a
  mid-epoch resume and stops the epoch at `len()`, so a `len()` of only the
  batches left would end a resumed epoch early, dropping as many batches as
  were taken before the checkpoint (seen with Lightning 2.6).

Start-up reads the manifest only (training/data/shards.py). Each iterator reads the
row groups its batches need, at least one shuffle window of them ahead when
`ReadConfig.prefetch_row_groups` is not 0, in background threads
(training/data/readahead.py), optionally through a local disk cache
(training/data/cache.py). Rank, world size and worker are read when iteration
starts, never at import or construction.

Cost model (benchmarks/loader_bench.py): each row group is decoded by the one
worker that serves it (two at the ends of a worker's run), once per epoch, and
held from its first batch to its last: a worker holds about one shuffle window per
partition it serves, and opens them all in its first batches of an epoch (or of a
resume), which wait longer for data than later ones (benchmarks/RESULTS.md M26). A
batch leaves a worker process as one shared-memory segment (its tensors are views of
one buffer); for rows of a few hundred bytes that costs more than a worker saves, so
`num_workers=0` with read-ahead threads (pyarrow decodes without the GIL) is the fast
setting.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import closing
from functools import partial
from itertools import islice, tee
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from training.config import LoaderConfig
from training.data.balance import (
    Horizon,
    SharePlan,
    joined_slice,
    rank_slice,
    slice_keys,
    slice_steps,
    whole_steps,
)
from training.data.batches import Batch, assemble
from training.data.cache import ShardCache
from training.data.partition import EpochPlan, Recipe, Schedule, check_share
from training.data.readahead import Joined, ReadAhead, ReadConfig, prefetched
from training.data.shards import (
    Rows,
    ShardFiles,
    open_split,
    read_row_group,
    read_row_groups,
)
from training.data.wait import DataWaitMeter
from training.distributed.env import env_rank, env_world_size

# The loader fields the order of an epoch depends on (training/data/partition.py).
ORDER_FIELDS = ("batch_size", "num_partitions", "shuffle_window_row_groups")


def current_rank_world() -> tuple[int, int]:
    """(rank, world size) from torch.distributed, else env RANK/WORLD_SIZE, else (0, 1)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return env_rank(), env_world_size()


def current_worker() -> tuple[int, int]:
    """(worker id, number of workers) inside a DataLoader worker, else (0, 1)."""
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)


def num_steps(num_rows: int, start: int, global_batch: int, remainder: str) -> int:
    """Global steps left in an epoch of `num_rows` samples from position `start`."""
    left = max(num_rows - start, 0)
    return -(-left // global_batch) if remainder == "pad" else left // global_batch


class ShardStream(IterableDataset):
    """One split of a dataset version as a stream of per-rank batches; see the module docstring."""

    def __init__(
        self,
        dataset: str,
        split: str,
        config: LoaderConfig,
        seed: int,
        read: ReadConfig | None = None,
    ) -> None:
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        self.columns, self.layout, self.classes = open_split(dataset, split)
        self.split, self.config, self.seed = split, config, seed
        self.read = read or ReadConfig()
        self.files = ShardFiles(
            self.layout, open_cache(self.read), self.read.retry, self.read.verify
        )
        self._epoch, self._consumed, self._taken = 0, 0, 0
        self.rows_decoded = 0  # by this process's iterators: the decode share it measures
        self.shares = SharePlan(config.balance_shares)  # training/data/balance.py

    @property
    def num_rows(self) -> int:
        return self.layout.num_rows

    @property
    def num_features(self) -> int:
        return self.layout.num_features

    def num_batches(self, world_size: int) -> int:
        """Batches every rank yields for the rest of the current epoch (a world size that
        does not divide the partition count is refused here, before any training)."""
        check_share(self.config.num_partitions, world_size, 1)
        global_batch = world_size * self.config.batch_size
        return num_steps(self.num_rows, self._consumed, global_batch, self.config.remainder)

    def epoch_batches(self, world_size: int) -> int:
        """The current epoch's batches per rank as a trainer counts them: those taken before
        the saved position (at whatever world size) plus those left at `world_size`."""
        return self._taken + self.num_batches(world_size)

    def __len__(self) -> int:
        return self.epoch_batches(current_rank_world()[1])

    def set_epoch(self, epoch: int) -> None:
        """Move to the start of `epoch`, unless the stream is already inside it (a resume)."""
        if epoch != self._epoch:
            self.load_state_dict({"epoch": epoch, "samples_consumed": 0})

    def state_dict(self) -> dict[str, Any]:
        """The global position (independent of world size and worker count), the batches
        each rank took to reach it, the loader fields the epoch's order depends on, and
        under `speed` the shares learned so far (training/data/balance.py)."""
        return {
            "epoch": self._epoch,
            "samples_consumed": self._consumed,
            "rank_batches": self._taken,
            **{name: getattr(self.config, name) for name in ORDER_FIELDS},
            **self.shares.state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Move to a saved position; refused when it was saved under another order (the
        rest of its epoch would skip and repeat samples) or off a unit boundary."""
        epoch, consumed = int(state["epoch"]), int(state["samples_consumed"])
        taken = int(state.get("rank_batches", 0))
        if min(epoch, consumed, taken) < 0:
            raise ValueError(f"invalid stream state {state}")
        for name in ORDER_FIELDS:
            if name in state and int(state[name]) != getattr(self.config, name):
                raise ValueError(
                    f"the saved stream position was ordered with loader.{name}={state[name]}, "
                    f"this run has {getattr(self.config, name)}; resuming would skip and repeat "
                    f"samples of epoch {epoch}: set loader.{name} to {state[name]}"
                )
        if consumed % self.config.batch_size:
            raise ValueError(
                f"samples_consumed {consumed} of the saved stream position is not "
                f"a multiple of loader.batch_size {self.config.batch_size}"
            )
        self.shares.load_state(state)
        self._epoch, self._consumed, self._taken = epoch, consumed, taken

    def __iter__(self) -> Iterator[Batch]:
        return self.iterate()

    def iterate(
        self, rank_world: tuple[int, int] | None = None, worker: tuple[int, int] | None = None
    ) -> Iterator[Batch]:
        """This rank's (or this worker's) batches for the rest of the epoch.

        `rank_world` and `worker` override what torch.distributed and the DataLoader
        report (tests simulate ranks and workers with them). The position is read
        now, not at the first batch. The stream records its progress itself only
        when one worker yields all of the rank's batches; `StreamLoader` does otherwise.
        """
        rank, world_size = rank_world or current_rank_world()
        worker_id, num_workers = worker or current_worker()
        if not (0 <= rank < world_size and 0 <= worker_id < num_workers):
            raise ValueError(f"rank {rank} of {world_size}, worker {worker_id} of {num_workers}")
        check_share(self.config.num_partitions, world_size, num_workers)
        if self.config.balanced and num_workers > 1:
            raise ValueError(
                "loader.balance / balance_by other than equal / samples slice "
                f"whole global steps in one process, not {num_workers} workers"
            )
        steps = range(worker_id, self.num_batches(world_size), num_workers)
        return self._generate(steps, rank, world_size, record=num_workers == 1)

    def _generate(self, steps: range, rank: int, world_size: int, record: bool) -> Iterator[Batch]:
        epoch, start, taken = self._epoch, self._consumed, self._taken
        global_batch = world_size * self.config.batch_size
        # Whole steps (every unit of each step) are sliced when handed out.
        whole, horizon = self.config.balanced and not self.config.sliced_by_units, Horizon()
        reads, made = self._planned(steps, rank, world_size, horizon)
        with reads, closing(prefetched(made, self.read.prefetch_batches)) as batches, horizon:
            for step in steps:
                horizon.ask(step)
                batch = next(batches)
                if whole:
                    shares = self.shares.shares_at(epoch, start + step * global_batch, world_size)
                    batch = rank_slice(batch, shares, rank, self.config.balance_by)
                if record:
                    done = start + (step + 1) * global_batch
                    self.record_progress(epoch, done, world_size, taken + step + 1)
                yield batch
        if record:
            self.load_state_dict({"epoch": epoch + 1, "samples_consumed": 0})

    def _planned(
        self, steps: range, rank: int, world_size: int, horizon: Horizon
    ) -> tuple[ReadAhead[Rows], Iterator[Batch]]:
        """The read-ahead and the batches of `steps`: this rank's units (`equal`), whole steps
        (`balance_by: tokens`), or the units this rank's slice overlaps (`speed` by samples)."""
        config, epoch, start = self.config, self._epoch, self._consumed
        first = start // config.batch_size + (0 if config.balanced else rank)  # step 0's unit
        units = range(
            first + steps.start * world_size,
            first + steps.stop * world_size,
            1 if config.balanced else steps.step * world_size,
        )
        plan = EpochPlan(self.layout, self.seed, epoch, config)
        schedule, read = Schedule(plan, units), partial(self.load_group, plan)
        joined = Joined(partial(self.same_shard, plan), partial(self.load_groups, plan))
        if not config.sliced_by_units:
            ahead, recipes = tee(schedule)
            keys = (s for r in ahead for s in r.load)
            reads = ReadAhead(read, keys, self.read_depth(), joined)
            made = self._assembled(recipes, reads)
            return reads, whole_steps(made, world_size) if config.balanced else made
        parts = slice_steps(
            schedule,
            steps,
            (rank, world_size),
            horizon,
            lambda position: self.shares.shares_at(epoch, position, world_size),
        )
        planned, cuts, assembling = tee(parts, 3)
        reads = ReadAhead(read, slice_keys(planned, steps, horizon), self.read_depth(), joined)
        units_made = self._assembled((r for p in assembling for r in p.recipes), reads)
        return reads, (
            joined_slice(part, list(islice(units_made, len(part.recipes))), world_size)
            for part in cuts
        )

    def read_depth(self) -> int:
        """Row groups read ahead: a window's groups are first needed together, so at least
        one window (and the group it straddles) when reading ahead at all."""
        depth = self.read.prefetch_row_groups
        return max(depth, self.config.shuffle_window_row_groups + 1) if depth else 0

    def _assembled(self, recipes: Iterator[Recipe], reads: ReadAhead[Rows]) -> Iterator[Batch]:
        """Batches of `recipes`, each slot's group held from its first batch to its last."""
        groups: dict[int, Rows] = {}
        for recipe in recipes:
            for slot in recipe.load:
                groups[slot] = reads.get(slot)
                self.rows_decoded += len(groups[slot].id)
            yield assemble(recipe, groups, self.layout.num_features)
            for slot in recipe.free:
                del groups[slot]

    def load_group(self, plan: EpochPlan, slot: int) -> Rows:
        """Read and decode the row group at `slot` of the plan (its rows in file order: the
        recipe's window shuffles them)."""
        return read_row_group(self.layout, int(plan.order[slot]), self.columns, self.files)

    def load_groups(self, plan: EpochPlan, slots: list[int]) -> list[Rows]:
        """`load_group` of each of `slots` (row groups of one shard), by one read."""
        groups = [int(plan.order[slot]) for slot in slots]
        return read_row_groups(self.layout, groups, self.columns, self.files)

    def same_shard(self, plan: EpochPlan, slots: list[int], slot: int) -> bool:
        """Whether the row group at `slot` may be read with those at `slots`: another row
        group of the same shard."""
        shard, order = self.layout.group_shard, plan.order
        return shard[order[slot]] == shard[order[slots[0]]] and slot not in slots

    def record_progress(
        self, epoch: int, samples_consumed: int, world_size: int, rank_batches: int
    ) -> None:
        """Note that batches up to this position were handed out. An epoch with no full
        step left for `world_size` ranks is over: the position moves to the next one, so
        a checkpoint taken after the last batch resumes at the next epoch."""
        global_batch = world_size * self.config.batch_size
        if num_steps(self.num_rows, samples_consumed, global_batch, self.config.remainder) == 0:
            epoch, samples_consumed, rank_batches = epoch + 1, 0, 0
        self._epoch, self._consumed, self._taken = epoch, samples_consumed, rank_batches


def open_cache(read: ReadConfig) -> ShardCache | None:
    return ShardCache(read.cache_dir, read.cache_bytes) if read.cache_dir else None


class StreamLoader(DataLoader):
    """A DataLoader over a `ShardStream` whose position is saved in Lightning checkpoints.

    Lightning stores `state_dict()` of a loader that has one (the `_Stateful`
    protocol) with the fit loop. With worker processes the stream in this process
    never iterates, so the position is recorded here as batches are handed out;
    Lightning asks for a batch only when its step is about to run (it prefetches
    none from a loader with a length), so handed out means consumed. A `rewind`
    loader starts every pass at the beginning of epoch 0 (validation).
    `metrics()` gives the samples per second and the time spent waiting for data.
    Memory is pinned for the copy to the GPU when CUDA is available.
    """

    def __init__(
        self, stream: ShardStream, num_workers: int | None = None, rewind: bool = False
    ) -> None:
        workers = stream.config.num_workers if num_workers is None else num_workers
        super().__init__(
            stream, batch_size=None, num_workers=workers, pin_memory=torch.cuda.is_available()
        )
        self.stream, self.rewind = stream, rewind
        self.meter = DataWaitMeter()

    def __iter__(self) -> Iterator[Batch]:  # type: ignore[override]
        if self.rewind:
            self.stream.load_state_dict({"epoch": 0, "samples_consumed": 0})
        state = self.stream.state_dict()
        world_size = current_rank_world()[1]
        # Refused here, in the rank's process, rather than in each worker.
        check_share(self.stream.config.num_partitions, world_size, self.num_workers)
        batches = super().__iter__() if self.num_workers else self._in_process()
        return self.meter.timed(self._recorded(batches, state, world_size))

    def _in_process(self) -> Iterator[Batch]:
        """The stream's batches without DataLoader's single-process iterator: its profiler
        annotation and conversion of each batch cost 57-85 us a batch here, 6% of the
        loader's CPU; the batches are tensors already, pinned as DataLoader pins them."""
        for batch in self.stream.iterate():
            yield {name: t.pin_memory() for name, t in batch.items()} if self.pin_memory else batch

    def _recorded(
        self, batches: Iterator[Batch], state: dict[str, int], world_size: int
    ) -> Iterator[Batch]:
        epoch, start, taken = state["epoch"], state["samples_consumed"], state["rank_batches"]
        global_batch = world_size * self.stream.config.batch_size
        for step, batch in enumerate(batches, start=1):
            done = start + step * global_batch
            self.stream.record_progress(epoch, done, world_size, taken + step)
            yield batch
        self.stream.load_state_dict({"epoch": epoch + 1, "samples_consumed": 0})

    def metrics(self) -> dict[str, float]:
        """Samples, batches, wall and data-wait seconds since construction, samples_per_s
        and data_wait_fraction (training/data/wait.py)."""
        return self.meter.metrics()

    def state_dict(self) -> dict[str, Any]:
        return self.stream.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stream.load_state_dict(state)
