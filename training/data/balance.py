"""How the rows of each global step are split among ranks: equally, by hand, by speed, by
tokens.

`loader.balance: equal` (the default) gives rank r unit r of each global step
(training/data/loader.py). Otherwise (`balance: speed`, or `balance_by: tokens`) the
global step's rows are exactly those `equal` gives, in the same order (the W units
one after the other), and rank r takes the r-th slice of them:

- the slices' sizes follow `shares` (one fraction per rank, summing to 1): in rows
  (`balance_by: samples`, largest remainder, `row_bounds`), or in real tokens
  (`balance_by: tokens`: a prefix split of the rows whose token sums follow the
  shares, `token_bounds`; a row's tokens are its non-zero ids, 0 being the pad id);
- `SharePlan` holds the shares from a stream position on. With `fixed`, the config's
  `balance_shares` for the whole run (sliced as `speed`'s are). With `speed`, the per-interval
  all_gather of the step times (training/distributed/rank_time.py) hands every rank the
  same figures, and every rank computes the same new shares from them
  (training/data/speed_control.py: the split that equalises the ranks' predicted steps
  of their own work, each a fixed cost plus a cost per row fitted from intervals at two
  splits (training/data/step_model.py; samples per second of own work until then),
  bounded, speeds near alike giving the equal split exactly, whose cuts fall on unit
  edges; the split moves only when two consecutive intervals agree, then to the newer
  one's target at once), effective two global steps after the position where they
  were computed, which no rank has reached by then: no collective of its own, and
  every rank slices every step alike;
- the shares are learned once: they carry over from epoch to epoch, and the stream's
  state (the checkpoint) holds the last ones with their world size and every rank's
  host (`SharePlan.state`), so a resume on the same world size and hosts starts from
  them, one on others from the split remembered for its hosts in the output dir
  (training/data/split_memory.py; a new job on the same hosts starts from it too), or
  from equal;
- every rank still yields one batch per global step (the same optimizer steps), every
  row of the step lands on exactly one rank, and the stream position stays (epoch,
  samples consumed): a resume on any world size continues the same stream;
- `loss_scale` = n_r * W / N (n_r this rank's real rows, N the step's): the mean loss of
  a rank times it, averaged over ranks by DDP, is the global step's mean loss, the same
  mathematics as the equal split;
- what a rank reads: by samples, only the units its slice overlaps (`slice_steps`). Unit
  k of every step comes from the partitions p = k (mod W), so with steady shares a rank
  decodes the row groups of those unit positions: a slice of share s overlaps at most
  s x W + 2 of the W units (a cut inside a unit at each end), a decode share of at most
  s + 2/W, and exactly s when its cuts fall on unit edges. A step's units are known once
  its shares are final, which `Horizon` tracks: re-plans are made at the stream's
  current position (they must be: `SpeedReplan` passes its state), so when the consumer
  asks for step k the shares of steps up to k + LAG_STEPS are final; batches are
  assembled and row groups read ahead only that far (two steps beyond the one handed
  out, as many as `prefetch_batches` 2 assembles). By tokens a cut needs every row's
  token count, so each rank reads and decodes every unit of the step (`whole_steps`,
  then `rank_slice`): the whole split.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any

import numpy as np
import torch

from training.data.partition import Recipe, Schedule
from training.data.speed_control import Reading, equal_shares, next_shares
from training.data.step_noise import step_dispersion

Batch = dict[str, torch.Tensor]

LAG_STEPS = 2  # new shares apply this many global steps after the position they were made at


def row_bounds(shares: np.ndarray, num_rows: int) -> np.ndarray:
    """Cut points [0, c1, ..., num_rows] of the slices: rows by largest remainder (ties to
    the lower rank), at least one row a rank when there are as many rows as ranks."""
    ideal = shares * num_rows
    counts = np.floor(ideal).astype(np.int64)
    order = np.argsort(-(ideal - counts), kind="stable")
    counts[order[: num_rows - int(counts.sum())]] += 1
    while num_rows >= len(counts) and counts.min() == 0:
        counts[int(np.argmax(counts))] -= 1
        counts[int(np.argmin(counts))] += 1
    return np.concatenate([[0], np.cumsum(counts)])


def token_bounds(shares: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """Cut points of a prefix split of rows whose token sums follow `shares`: the ascending
    cuts (at least one row a rank when there are as many rows as ranks) whose largest
    distance from its target, in tokens, is the least any such cuts reach. Nearest cuts
    pushed apart one by one can drift a rank's cut several rows from its target when
    small shares crowd into one row; this search moves the crowded cuts to both sides."""
    num_rows, world = len(tokens), len(shares)
    if num_rows == 0 or world == 1:
        return np.array([0] * world + [num_rows], np.int64)
    ends = np.concatenate([[0], np.cumsum(tokens)]).astype(np.float64)
    targets = np.cumsum(shares)[:-1] * ends[-1]
    errors = np.unique(np.abs(ends[None, :] - targets[:, None]))
    low, high = 0, len(errors) - 1  # the cuts' largest error is one of these distances
    while low < high:
        middle = (low + high) // 2
        if _cuts_within(errors[middle], ends, targets, num_rows) is None:
            low = middle + 1
        else:
            high = middle
    cuts = _cuts_within(errors[low], ends, targets, num_rows)
    assert cuts is not None  # the largest distance admits any ascending cuts
    return np.concatenate([[0], cuts, [num_rows]]).astype(np.int64)


def _cuts_within(
    error: float, ends: np.ndarray, targets: np.ndarray, num_rows: int
) -> np.ndarray | None:
    """The lowest ascending cuts each within `error` tokens of its target, or None. Taking
    each cut as low as it may go leaves the most room to the ones after it."""
    world = len(targets) + 1
    gap = 1 if num_rows >= world else 0  # one row a rank when there are enough rows
    cuts, previous = np.zeros(world - 1, np.int64), 0
    for rank, target in enumerate(targets, start=1):
        lowest = max(previous + gap, int(np.searchsorted(ends, target - error * (1 + 1e-12))))
        highest = num_rows - gap * (world - rank)
        if lowest > highest or ends[lowest] - target > error * (1 + 1e-12):
            return None
        cuts[rank - 1] = previous = lowest
    return cuts


class SharePlan:
    """Every rank's share from a stream position (epoch, samples consumed) on; the same on
    every rank, since every rank records the same changes (see the module). `last` is the
    controller's state: the last interval's reading (with its step model and the points
    it was fitted to), which the next one must agree with before the split moves
    (training/data/speed_control.py). It is not part of the saved state: a stream starts
    it from the reading learned on these hosts (`learned`, kept in the output dir beside
    the remembered split: `seeded`), or without one, when the first move waits one
    interval more and fixed costs are measured anew.

    A stream starts (`first_shares`) from `fixed` (`balance: fixed`, which never moves),
    else from a resumed checkpoint's shares, else from the split remembered for these
    hosts (training/data/split_memory.py, `remembered`), else from equal: saved shares
    count only on the world size and hosts (`hosts`, one name a rank) they were learned
    on, since another machine's ranks are not slow in the same way."""

    def __init__(self, fixed: list[float] | None = None) -> None:
        self.world_size = 0
        self.changes: list[tuple[tuple[int, int], np.ndarray]] = []
        self.last: Reading | None = None
        self.fixed = None if fixed is None else np.asarray(fixed, np.float64)
        self.hosts: list[str] | None = None  # every rank's host name, once the job knows them
        self.remembered: np.ndarray | None = None
        self.learned: Reading | None = None  # the controller's reading learned on these hosts
        self.resumed: tuple[np.ndarray, list[str] | None] | None = None
        # A process's first steps are its warm-up: from learned shares (or a learned
        # reading) its first interval would read as a change of speed and undo them.
        self.warming = False

    def shares_at(self, epoch: int, position: int, world_size: int) -> np.ndarray:
        """The shares of the global step that starts at `position` of `epoch`."""
        if world_size != self.world_size:  # a new run, or a resume on another world size
            self.world_size = world_size
            first = self.first_shares(world_size)
            self.changes, self.last = [((0, 0), first)], self.seeded(first)
            self.warming = self.last is not None or bool(np.ptp(first) > 0)
        key, found = (epoch, position), self.changes[0][1]
        for start, shares in self.changes:
            if start <= key:
                found = shares
        return found

    def first_shares(self, world_size: int) -> np.ndarray:
        """The shares a stream of `world_size` ranks starts from (see the class)."""
        if self.fixed is not None:
            if len(self.fixed) != world_size:
                raise ValueError(
                    f"loader.balance_shares has {len(self.fixed)} shares, one per rank, but "
                    f"the job runs {world_size} ranks"
                )
            return self.fixed
        resumed, self.resumed = self.resumed, None
        if resumed is not None and self.known_here(resumed[0], resumed[1], world_size):
            return resumed[0]
        if self.remembered is not None and len(self.remembered) == world_size:
            return self.remembered
        return equal_shares(world_size)

    def seeded(self, shares: np.ndarray) -> Reading | None:
        """The controller's first state: the reading learned on these hosts, as if it had
        run at `shares` and called for them; none under `fixed` or with nothing learned
        for this world size (training/data/split_memory.py)."""
        learned = self.learned
        if self.fixed is not None or learned is None or len(learned.shares) != len(shares):
            return None
        return replace(learned, shares=shares, target=shares)

    def known_here(self, shares: np.ndarray, hosts: list[str] | None, world_size: int) -> bool:
        """Whether saved `shares` (learned on `hosts`) hold for this job's ranks."""
        if len(shares) != world_size:
            return False
        return hosts is None or self.hosts is None or hosts == self.hosts

    def state(self) -> dict[str, Any]:
        """The last shares planned, their world size and the hosts they were learned on,
        for the stream's state (a checkpoint); nothing before any plan (`equal` keeps its
        state as it was)."""
        if not self.world_size:  # none planned yet: a resumed state is kept as it was
            if self.resumed is None:
                return {}
            shares, hosts = self.resumed
            return saved_state(shares, hosts)
        return saved_state(self.changes[-1][1], self.hosts)

    def load_state(self, state: dict[str, Any]) -> None:
        """Start from a state's shares, if it has any, when the stream starts on their world
        size and hosts (a state without hosts is from before they were saved: its world
        size alone decides); otherwise from what a new stream starts from."""
        if "balance_shares" not in state:
            return
        world, shares = int(state["balance_world_size"]), state["balance_shares"]
        found = np.asarray(shares, np.float64)
        if world < 1 or found.shape != (world,) or abs(found.sum() - 1.0) > 1e-6:
            raise ValueError(
                f"the saved stream state's balance_shares {shares} are not "
                f"balance_world_size ({world}) fractions summing to 1"
            )
        hosts = state.get("balance_hosts")
        self.resumed = (found, None if hosts is None else [str(host) for host in hosts])
        self.world_size, self.changes, self.last = 0, [], None

    def replan(
        self,
        epoch: int,
        position: int,
        global_batch: int,
        samples: list[float],
        busy_s: list[float],
        busy_sq_s: list[float] | None = None,
    ) -> np.ndarray:
        """Record the shares that follow from an interval's figures (gathered: the same on
        every rank: `busy_s` each rank's seconds of its own work, `busy_sq_s` the sum of
        its squared per-step seconds, if measured) and the previous interval's target,
        effective `LAG_STEPS` global steps after `position`; returns them (the shares in
        force at `position` when the split does not move)."""
        current = self.shares_at(epoch, position, len(samples))
        if self.warming:  # the first interval from learned shares: read nothing from it
            self.warming = False
            return current
        start = (epoch, position + LAG_STEPS * global_batch)
        rows, busy = np.asarray(samples, float), np.asarray(busy_s, float)
        spread = None
        if busy_sq_s is not None and len(busy_sq_s) == len(busy) and min(busy) > 0:
            steps = max(float(rows.sum()) / global_batch, 1.0)
            spread = step_dispersion(rows, busy, np.asarray(busy_sq_s, float), steps)
        shares, self.last = next_shares(current, rows, busy, self.last, spread)
        self.changes = [
            *[(k, s) for k, s in self.changes if k < (epoch, position)][-1:],
            *[(k, s) for k, s in self.changes if (epoch, position) <= k < start],
            (start, shares),
        ]
        return shares


def saved_state(shares: np.ndarray, hosts: list[str] | None) -> dict[str, Any]:
    """A `SharePlan`'s state: shares, their world size and, when known, their hosts."""
    state: dict[str, Any] = {
        "balance_world_size": len(shares),
        "balance_shares": [float(share) for share in shares],
    }
    return state | ({"balance_hosts": list(hosts)} if hosts is not None else {})


def whole_steps(batches: Iterator[Batch], world_size: int) -> Iterator[Batch]:
    """The global steps of a stream of units: each `world_size` batches concatenated."""
    while step := list(islice(batches, world_size)):
        yield {name: torch.cat([batch[name] for batch in step]) for name in step[0]}


def real_tokens(batch: Batch) -> np.ndarray:
    """Each row's real tokens: its non-zero ids (0 pads a sequence), none for padding rows."""
    tokens = (batch["features"] != 0).sum(dim=1) * (batch["weight"] > 0)
    return np.asarray(tokens.numpy(), np.int64)


def rank_slice(whole: Batch, shares: np.ndarray, rank: int, balance_by: str) -> Batch:
    """Rank `rank`'s rows of a global step, with its `loss_scale` (see the module)."""
    world = len(shares)
    num_rows = len(whole["id"])
    bounds = (
        token_bounds(shares, real_tokens(whole))
        if balance_by == "tokens"
        else row_bounds(shares, num_rows)
    )
    part = {name: tensor[bounds[rank] : bounds[rank + 1]] for name, tensor in whole.items()}
    total = float(whole["weight"].sum())
    part["loss_scale"] = scale_tensor(float(part["weight"].sum()) * world / max(total, 1.0))
    return part


class StreamClosed(Exception):
    """The iterator a `Horizon` paces was closed while its producer waited for shares."""


class Horizon:
    """How far ahead of the consumer a step's shares are final. Re-plans are made at the
    stream's recorded position, between batches: once the consumer asks for step k, the
    next one can come only after step k is handed out, at position start + (k + 1) x
    global batch, and applies `LAG_STEPS` (2) steps after that: the shares of steps up to
    k + LAG_STEPS can no longer change (up to step LAG_STEPS - 1 before step 0 is asked
    for). Asked from the consumer's thread, waited on by the batch producer's."""

    def __init__(self) -> None:
        self._asked, self._closed = -1, False
        self._changed = threading.Condition()

    def ask(self, step: int) -> None:
        with self._changed:
            self._asked = step
            self._changed.notify_all()

    def known(self, step: int) -> bool:
        return step <= self._asked + LAG_STEPS

    def wait(self, step: int) -> None:
        """Block until the shares of `step` are final; StreamClosed once closed."""
        with self._changed:
            self._changed.wait_for(lambda: self._closed or self.known(step))
            if self._closed:
                raise StreamClosed

    def __enter__(self) -> Horizon:
        return self

    def __exit__(self, *exc: object) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()


@dataclass(frozen=True)
class SliceStep:
    """One rank's part of a global step under `speed` by samples: the recipes of the units
    its slice overlaps, the slice as rows [lo, hi) of those units' rows, and the step's
    real rows (its `loss_scale` denominator)."""

    recipes: list[Recipe]
    lo: int
    hi: int
    real_rows: int


def slice_steps(
    schedule: Schedule,
    steps: range,
    rank_world: tuple[int, int],
    horizon: Horizon,
    shares_at: Callable[[int], np.ndarray],
) -> Iterator[SliceStep]:
    """Each step's `SliceStep` once its shares (`shares_at` its stream position) are final.
    The schedule's units are every unit of the steps, W a step; this rank's slice, rows
    row_bounds(shares, W x B) of the step, covers units lo // B to (hi - 1) // B of it:
    only they are planned and read."""
    (rank, world), batch_size = rank_world, schedule.plan.batch_size
    for index, step in enumerate(steps):
        horizon.wait(step)
        position = schedule.units[index * world] * batch_size
        cuts = row_bounds(shares_at(position), world * batch_size)
        lo, hi = int(cuts[rank]), int(cuts[rank + 1])
        first, stop = lo // batch_size, -(-hi // batch_size)
        batches = range(index * world + first, index * world + stop)
        recipes = [schedule.recipe(batch, schedule.units[batch]) for batch in batches]
        real_rows = min(world * batch_size, max(schedule.plan.num_rows - position, 0))
        yield SliceStep(recipes, lo - first * batch_size, hi - first * batch_size, real_rows)


def slice_keys(parts: Iterator[SliceStep], steps: range, horizon: Horizon) -> Iterator[int | None]:
    """The slots `parts` load, in order, for a read-ahead: None (nothing known yet) while the
    next step's shares are not final, so reading ahead stops there rather than wait."""
    for step in steps:
        while not horizon.known(step):
            yield None
        part = next(parts, None)
        if part is None:
            return
        yield from (slot for recipe in part.recipes for slot in recipe.load)


def joined_slice(part: SliceStep, units: list[Batch], world_size: int) -> Batch:
    """The rank's batch from its units' batches: exactly the rows and `loss_scale` that
    `rank_slice` cuts from the whole step."""
    whole = {name: torch.cat([unit[name] for unit in units]) for name in units[0]}
    sliced = {name: tensor[part.lo : part.hi] for name, tensor in whole.items()}
    total = float(part.real_rows)
    sliced["loss_scale"] = scale_tensor(
        float(sliced["weight"].sum()) * world_size / max(total, 1.0)
    )
    return sliced


def scale_tensor(scale: float) -> torch.Tensor:
    """A `loss_scale` in float64, which the model casts to its loss's dtype: a float32 one
    would round n_r W / N (6 x 2 / 54 off by 1e-8), past float64 training's 1e-12."""
    return torch.tensor(scale, dtype=torch.float64)
