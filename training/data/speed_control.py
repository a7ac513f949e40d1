"""How `loader.balance: speed` moves the split of a global step among ranks.

Every interval (`loader.balance_every_n_steps` optimizer steps or more) every rank gets
every rank's rows and seconds of its own work (training/callbacks.py, `SpeedReplan`)
and computes, alike on every rank, a `Reading` (`read_interval`): the shares the
interval ran with (those in force when it is read) and its target, the split of least
expected step (training/data/step_model.py: each rank's own work a step is a fixed cost
plus a cost per row, fitted from the last `HISTORY` intervals at two splits; step_noise.py:
the step waits for the later of the ranks, each with its measured per-step spread, so a
rank interrupted in bursts is left slack; with no spread measured, the split that
equalises the ranks' predicted steps), bounded to [FLOOR, CAP] x the equal share, the
equal split exactly within EQUAL_BAND of it (every cut then on a unit edge). Until two
readings at splits far enough apart have measured a fixed cost, the target is shares
proportional to each rank's rows per second of work (fixed costs assumed none): the
first move is made from that, and the reading after it fits the model. Once fitted, the
target is the split nearest the equal one whose predicted (expected) step is within
GAIN_BAND of the least: when a slow rank's fixed
cost dominates (all of its work is slow, as on a core shared with another process) and
moving its rows cannot shorten its step by that much, the target is the equal split,
not the bound a split proportional to speed runs to interval after interval.

The rule (`next_shares`): the split moves only when the reading and the previous
interval's agree (`Reading.agrees`):

1. each calls for a move from the shares it ran with: its target beyond DEAD_BAND of
   them (and, once the model is fitted, predicted to shorten the largest step by
   GAIN_BAND), or the equal split from shares that are not exactly it;
2. the two moves point the same way (a positive inner product: the same ranks slower);
3. the two targets are within AGREE_BAND of each other, or the newer one is the first
   from a fitted model (the older assumed no fixed cost; the fit corrects it by as much
   as the fixed costs are, after a move that the older reading agreed to).

The fit is not trusted further than its points reach (`cautious_target`): each rank's
fitted cost per row is raised by CAUTION_K standard errors of its slope (at most to the
line through 0), kept through the fitted cost at the newest share, so the fewer and the
closer together the points, the nearer the target is to the split proportional to speed
from there (a move the speeds measured at the current split call for, whatever the fixed
costs), and the more intervals the fit reads, the nearer to the fitted one. A target of
the equal split from shares off it is taken only when lines steepened by
EQUAL_CAUTION_K standard errors call for it too: the return gains nothing the model can
see, and a fit from two noisy intervals (or one mixing a slow-down it did not detect)
that reads a slow rank's rows as costing nothing would otherwise hold a slowed rank at
equal for PROBE_AFTER readings or more (benchmarks/RESULTS.md M72). With exact readings
both are the fitted model.

Readings at one split are pooled into points, and a change of speed starts them over
(training/data/speed_change.py). A move must gain more than the noise band, NOISE_K
standard errors of the pooled point (an interval's noise, measured from the pooled
intervals, over the root of their number), unless the ranks' own work there is
IMBALANCE_K bands apart (a wrong fit that predicts too little); that gate holds for a
move off the equal split, while off it the cautious lines already shorten each move by
the fit's uncertainty (NOISE_PRIOR until an interval is pooled). Without it, under 15 %
noise an interval the split walks around the best one by tens of rows (M50).

Then the shares become the newer target at once, all the way. So a single disturbed
interval (a scheduler hiccup, a checkpoint, a GC pause on one rank) moves nothing, nor
do intervals that disagree; a change of speed that starts with an interval moves the
split two intervals after it (plus balance.py's LAG_STEPS), and the reading after that
move fits the fixed costs (its interval ran at the moved split) and corrects it at once.

A fitted model can be wrong for good: from noisy intervals it may read a slow rank's
cost as fixed and send the split back to equal, where every reading is at one split and
never tests the line. So while a fitted model holds the equal split against the ranks'
speeds there, after `Reading.wait` such readings (`Reading.held`; PROBE_AFTER, doubled
at each probe) the controller forgets the model and its points and measures again from
the split proportional to speed, as at the start.

The state between intervals is the last reading, nothing else: a pure function of
(shares, figures, last reading) gives (new shares, new reading), held by `SharePlan`
(training/data/balance.py), kept for the hosts' next job (training/data/split_memory.py).

All bands but GAIN_BAND, SHIFT and the noise band (relative: of the predicted step, of
a rank's cost, of the ranks' work) are in units of the equal share (1/W), compared on
the largest rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from training.data.speed_change import NOISE_WEIGHT, POOL, Pool, joined
from training.data.step_model import GAIN_BAND, Point, StepModel, fit, interval_point, rank_points
from training.data.step_noise import expected_step, quickest_split, running

# A rank's share stays within [FLOOR, CAP] x the equal share: a rank measured on a
# disturbed interval cannot be starved or flooded.
FLOOR, CAP = 0.25, 4.0
# Targets within this of the current shares change nothing: timing noise alone does not
# move rows back and forth (each move costs a step at the pace of the rank that got more).
DEAD_BAND = 0.02
# Targets within this of equal are the equal split exactly: every cut then falls on a
# unit edge, so alike ranks decode and step as under `equal`. A split a little off equal
# gains at most that little, while a cut inside a unit makes both ranks of a 2-rank step
# decode both units (benchmarks/RESULTS.md M33: +10.7 % on unloaded nodes).
EQUAL_BAND = 0.1
# Two consecutive targets within this of each other agree (if off in the same direction):
# wide enough for the timing noise of a steady slow rank, narrow enough that an interval
# straddling a change of speed waits for the next one rather than move half way.
AGREE_BAND = 0.1
# Readings at the equal split held by a fitted model, while the ranks' speeds there call
# for a move, before the model is forgotten and measured again (doubled at each probe).
# 8 intervals: well past HISTORY, so the probe never cuts short a fit still settling.
PROBE_AFTER = 8
# A move must also gain NOISE_K standard errors of the pooled point's timing (the noise
# band): an interval's relative noise (`Reading.noise`, a variance: speed_change.py's
# NOISE_WEIGHT) over the square root of the intervals pooled. Near
# the best split a move of a few rows changes the largest step by several percent, so
# noise alone would walk the split around it; the longer a split holds, the narrower.
NOISE_K = 1.0
# Until an interval is pooled the noise is unmeasured, not none: the caution terms read
# this (15 % an interval), else a fit from two unpooled intervals is taken as exact and one
# slow interval sends the split to equal (benchmarks/RESULTS.md M93). Measured 0: exact.
NOISE_PRIOR = 0.15**2
# Each rank's fitted cost per row is raised by this many standard errors of its slope
# (`cautious`), at most to the line through 0 (the split proportional to speed): a fit
# from few noisy points may read a slow rank's rows as costing nothing and send the split
# back to equal, where the cautious line moves it on by speed; the more intervals the
# fit reads, the nearer the fitted line. 0.5: 1 stalled the split short of the best one.
CAUTION_K = 0.5
# A fitted target of the equal split from shares off it is taken only when a model
# steepened by this many standard errors calls for equal too: a move back to equal gains
# nothing the model can see (best_split: equal is within GAIN_BAND of the least), so it
# waits until the fit is sure that moving rows no longer helps; until then the shares
# hold. Exact readings (no noise) return at once (tests/training/test_step_model.py).
EQUAL_CAUTION_K = 2.0
# A model's wrong fit can call for too small a gain where the ranks' measured work is
# far apart: a move is also made when that difference is this many noise bands.
IMBALANCE_K = 3.0


def equal_shares(world_size: int) -> np.ndarray:
    return np.full(world_size, 1.0 / world_size)


def bounded(shares: np.ndarray) -> np.ndarray:
    """`shares` normalised, each clipped into the bounds, the others rescaled to sum 1."""
    world = len(shares)
    low, high = FLOOR / world, min(1.0, CAP / world)
    result = shares / shares.sum()
    fixed = np.zeros(world, bool)
    for _ in range(world):
        clipped = np.clip(result, low, high)
        fixed |= clipped != result
        free = ~fixed
        if not free.any() or clipped[free].sum() <= 0:
            return clipped / clipped.sum()
        clipped[free] *= (1.0 - clipped[fixed].sum()) / clipped[free].sum()
        if np.array_equal(clipped, result):
            break
        result = clipped
    return result


@dataclass(frozen=True)
class Reading:
    """What one interval measured: the shares it ran with (those in force when it was
    read), the split it calls for (its target, see the module), the step model the
    target came from (None when made by hand), the last `HISTORY` points, newest last,
    the readings in a row at which a fitted model held the equal split against the ranks'
    speeds (`held`), how many such readings forget the model (`wait`), how many intervals
    the newest point pools (`pooled`; 0 when it differs from the one before by more than
    SHIFT: a change of speed, which the next interval must not be pooled with), the
    variance of an interval's relative timing noise (`noise`, see NOISE_K), and each
    rank's per-step dispersion (training/data/step_noise.py; None: not measured)."""

    shares: np.ndarray
    target: np.ndarray
    model: StepModel | None = None
    history: tuple[Point, ...] = ()
    held: int = 0
    wait: int = PROBE_AFTER
    pooled: int = 1
    noise: float = 0.0
    dispersion: np.ndarray | None = None

    @property
    def fitted(self) -> bool:
        return self.model is not None and self.model.fitted

    def moves(self) -> bool:
        """Whether the target calls for a move from the shares: the equal split from shares
        that are not exactly it; or beyond the dead band, once the model has measured
        fixed costs predicted to shorten the largest step by `GAIN_BAND` or more, and,
        from the equal split, predicted to gain the noise band or with the ranks' own work
        at the newest point IMBALANCE_K noise bands apart (off equal the cautious model
        has already shortened the move by the fit's uncertainty)."""
        equal = equal_shares(len(self.shares))
        if np.array_equal(self.target, equal):
            return not np.array_equal(self.shares, self.target)
        if np.abs(self.target - self.shares).max() * len(self.shares) < DEAD_BAND:
            return False
        if self.model is None:
            return True
        gain = self.expected(self.shares) / self.expected(self.target) - 1.0
        if self.fitted and gain < GAIN_BAND:
            return False
        if not np.array_equal(self.shares, equal):
            return True
        band = self.noise_band()
        return bool(gain >= band or self.imbalance() >= IMBALANCE_K * band)

    def expected(self, shares: np.ndarray) -> float:
        assert self.model is not None  # only called once a model is known
        return expected_step(self.model, self.dispersion, shares)

    def noise_band(self) -> float:
        """NOISE_K standard errors of the newest point's timing: an interval's noise over
        the root of the intervals it pools (at most 2 POOL - 1, the pool's weight)."""
        return float(NOISE_K * np.sqrt(self.noise / min(max(self.pooled, 1), 2 * POOL - 1)))

    def pool(self) -> Pool:
        """The points this reading's fit read, as speed_change.py pools them."""
        return Pool(self.history, self.pooled, self.noise)

    def imbalance(self) -> float:
        """How much the slowest rank's own work at the newest point exceeds the fastest's."""
        costs = self.history[-1].costs if self.history else np.ones(1)
        return float(costs.max() / costs.min() - 1.0)

    def agrees(self, older: Reading | None) -> bool:
        """Whether this reading and the one before it call for the same move: both move,
        each from the shares it ran with, in the same direction (a positive inner product
        of the two moves: the same ranks slower), to targets within `AGREE_BAND`, unless
        this one's target is the first from measured fixed costs (the older one's assumed
        none: the fit corrects it, by as much as the fixed costs are)."""
        if older is None or len(older.target) != len(self.target):
            return False
        if not (older.moves() and self.moves()):
            return False
        close = np.abs(self.target - older.target).max() * len(self.target) <= AGREE_BAND
        same_way = (older.target - older.shares) @ (self.target - self.shares) > 0
        return bool((close or (self.fitted and not older.fitted)) and same_way)


def read_interval(
    shares: np.ndarray,
    samples: np.ndarray,
    busy_s: np.ndarray,
    last: Reading | None = None,
    dispersion: np.ndarray | None = None,
) -> Reading | None:
    """The reading of an interval run with `shares`, where rank r took `samples[r]` rows in
    `busy_s[r]` seconds of its own work, after `last`: its point joins the history, the
    step model is fitted to it, and the target is the model's best split, or while no
    fixed cost is measured (or once a model held the equal split `last.wait` readings
    against the ranks' speeds) shares proportional to speed, bounded; the equal split
    exactly within `EQUAL_BAND` of it; with the ranks' `dispersion` measured, the split of
    least expected step (step_noise.py). None when some rank measured nothing or the
    figures are not one per rank."""
    world = len(shares)
    if len(samples) != world or len(busy_s) != world or min(samples.min(), busy_s.min()) <= 0:
        return None
    before = last if last is not None and len(last.shares) == world else None
    pool = joined(before.pool() if before else None, interval_point(samples, busy_s))
    history, pooled, noise = pool.history, pool.pooled, pool.noise
    model = fit(history, before.model if before else None, superseding=pooled == 0)
    pooled_point = history[-1]  # samples / busy_s, or its mean over the intervals pooled
    speed = snapped(bounded(pooled_point.shares / pooled_point.costs))
    wait = before.wait if before else PROBE_AFTER
    # None from a run's first interval: its first steps hold the warm-up.
    spread = running(before.dispersion, dispersion, NOISE_WEIGHT) if before else None
    if not model.fitted:
        return Reading(shares, speed, model, history, 0, wait, pooled, noise, spread)
    measured = noise > 0 or any(point.weight > 1 for point in history)
    noises = (noise if measured else NOISE_PRIOR, spread)
    model, target = cautious_target(shares, model, history, noises, pooled == 0)
    # A fitted model needs two readings, so `before` is a reading here.
    equal = equal_shares(world)
    unlike = not np.array_equal(speed, equal)
    holding = unlike and all(np.array_equal(split, equal) for split in (shares, target))
    held = before.held + 1 if before is not None and holding else 0
    if held >= wait:  # forget the model: the next readings measure from speed again
        forgot = fit(history[-1:])
        return Reading(shares, speed, forgot, history[-1:], 0, 2 * wait, pooled, noise, spread)
    return Reading(shares, target, model, history, held, wait, pooled, noise, spread)


def cautious_target(
    shares: np.ndarray,
    model: StepModel,
    history: tuple[Point, ...],
    noises: tuple[float, np.ndarray | None],
    new: bool,
) -> tuple[StepModel, np.ndarray]:
    """The cautious model (CAUTION_K) and its target, bounded and snapped; a target of the
    equal split from `shares` off it only when the model steepened by EQUAL_CAUTION_K
    also calls for equal, else `shares` (hold). `noises`: an interval's relative noise
    and the ranks' dispersion (the target the split of least expected step). `new`: the
    newest point may be a new speed's (`fit`'s `superseding`)."""
    noise, dispersion = noises
    world = len(shares)
    low, high, equal = FLOOR / world, min(1.0, CAP / world), equal_shares(world)
    steeper = cautious(model, history, noise, new, CAUTION_K)
    target = snapped(bounded(quickest_split(steeper, dispersion, low, high)))
    if np.array_equal(target, equal) and not np.array_equal(shares, equal):
        doubt = cautious(model, history, noise, new, EQUAL_CAUTION_K)
        doubted = snapped(bounded(quickest_split(doubt, dispersion, low, high)))
        target = target if np.array_equal(doubted, equal) else shares
    return steeper, target


def cautious(
    model: StepModel, history: tuple[Point, ...], noise: float, superseding: bool, k: float
) -> StepModel:
    """`model` with each fitted rank's cost per row raised by `k` standard errors of its
    slope (an interval's relative `noise` at the rank's cost, over the weighted spread of
    the shares its fit read), at most to the line through 0, kept through the fitted cost
    at the newest share; a rank whose points all sit at one share kept as fitted."""
    newest = history[-1].shares
    level = model.fixed + model.per_share * newest
    per_share = model.per_share.copy()
    for rank in range(len(newest)):
        shares, _, weights = rank_points(history, rank, superseding)
        spread = float(weights @ (shares - weights @ shares / weights.sum()) ** 2)
        if spread <= 0:
            continue
        error = float(np.sqrt(noise / spread)) * level[rank]
        per_share[rank] = min(per_share[rank] + k * error, level[rank] / newest[rank])
    return StepModel(level - per_share * newest, per_share, model.fitted)


def snapped(target: np.ndarray) -> np.ndarray:
    """`target`, or the equal split exactly when it is within `EQUAL_BAND` of it."""
    world = len(target)
    if np.abs(target - 1.0 / world).max() * world < EQUAL_BAND:
        return equal_shares(world)
    return target


def next_shares(
    shares: np.ndarray,
    samples: np.ndarray,
    busy_s: np.ndarray,
    last: Reading | None = None,
    dispersion: np.ndarray | None = None,
) -> tuple[np.ndarray, Reading | None]:
    """(shares, reading) after an interval run with `shares` (see the module): this
    interval's target when its reading agrees with `last`, the previous interval's, else
    the shares as they are; and the reading, the state for the next interval. An
    interval that measured nothing on some rank is ignored (shares and state as they were).
    `dispersion`: the ranks' per-step spread in the interval (step_noise.py), if measured."""
    reading = read_interval(shares, samples, busy_s, last, dispersion)
    if reading is None:
        return shares, last
    return (reading.target if reading.agrees(last) else shares), reading
