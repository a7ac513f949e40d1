"""How `loader.balance: speed`'s intervals become the step model's points: pooled at one
split, started over at a change of speed, and the change undone when it was a disturbance.

Readings at one split are pooled (`joined`): the intervals in a row that ran wholly at
the shares in force, none off the pool by more than SHIFT, make one point, their mean,
and the fit reads every point since the last change of speed, each weighing the
intervals it pools. An interval off its pool by more than SHIFT is held apart: the next
one, off the same way, confirms a change of speed (the history starts over from it), or
shows it was one disturbed interval (dropped).

Two disturbed intervals in a row also confirm a change (benchmarks/RESULTS.md M97: 8
steps of one rank 1.55x slower, in the tokens model's third epoch), and the split then
moves by speed. Read as a new speed for good, the disturbed point stays in the fit and
steepens the slow rank's line, so the split stays past the best one until the end of
the run. So the points before a change are kept (`SpeedChange`) for POOL intervals
after it: when the newest point, pooling two intervals or more, is nearer the speeds
before the change than the changed ones (`passed`), the change was a disturbance and is
undone: the points before it come back, the newest after them, the disturbed ones gone.
A real change of speed is not undone: its points stay off the old model by its ratio,
whatever the split.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from training.data.step_model import Point, StepModel, fit

# The points a step model is fitted from (a change of speed starts them over): 16, each
# pooling up to 2 POOL - 1 intervals, average out 15 % timing noise an interval where the
# 4 points of M50 walked the split (tests/training/test_balance_settle.py).
HISTORY = 16
# Intervals in a row at one split are pooled into one point (their mean cost per row),
# the newest weighing at least 1/POOL: the longer the split holds, the less an
# interval's noise moves the fit, while a change of speed still shows within a few. A
# change of speed can be undone for this many intervals after it.
POOL = 8
# A rank whose cost per row in the newest interval is off the pooled one by more than
# this (relative) has changed speed: the pool restarts from that interval. About twice
# an interval's timing noise (15 % on a shared 2-core host), far under a 2x slow-down.
SHIFT = 0.35
# An interval's relative noise (a variance) is the running mean of the squared difference
# of each pooled interval from its pool, 0 until one is pooled, the newest weighing this.
NOISE_WEIGHT = 1 / 8


@dataclass(frozen=True)
class SpeedChange:
    """A change of speed the history started over at, while it may still be undone: the
    points before it, the model fitted to them, and each rank's cost over its pool's in
    the interval that confirmed the change."""

    history: tuple[Point, ...]
    model: StepModel
    ratio: np.ndarray


@dataclass(frozen=True)
class Pool:
    """The fit's points since the last change of speed, newest last; how many intervals the
    newest pools (0: it is off the pool before it by more than SHIFT, held apart); an
    interval's relative noise (a variance, see NOISE_WEIGHT); and the change of speed the
    points started at, while it may still be undone."""

    history: tuple[Point, ...]
    pooled: int = 1
    noise: float = 0.0
    change: SpeedChange | None = None


def joined(before: Pool | None, point: Point, model: StepModel | None = None) -> Pool:
    """The pool after `point` (`pooled`), `model` the one fitted before it; a change of
    speed it follows undone when the newest point pooling two intervals or more is nearer
    the speeds before it (`passed`), and no longer kept POOL intervals after it."""
    if before is None or not before.history:
        return Pool((point,), 1, 0.0)
    after = pooled(before, point, model)
    change = after.change
    if change is None or after.pooled < 2:
        return after
    if passed(change, after.history[-1]):  # a disturbance: the points before it come back
        return Pool((*change.history, after.history[-1])[-HISTORY:], after.pooled, after.noise)
    if sum(kept.weight for kept in after.history) >= POOL:
        return replace(after, change=None)
    return after


def pooled(before: Pool, point: Point, model: StepModel | None) -> Pool:
    """The pool with `point`. At the split of the newest point (both ran wholly at it):
    merged into it when no rank's cost per row is off by more than SHIFT (their mean, the
    newest weighing 1 / min(n + 1, POOL); the noise takes in its largest relative
    difference from the pool); else appended, held apart: if the next interval is off the
    pool the same way, the ranks changed speed and the history starts over from it (the
    points before measured the old speeds, and the held one may straddle the change); if
    not, the held one was one disturbed interval and is dropped. At a new split: appended
    (the last `HISTORY` points kept), so that the fit reads every interval since the last
    change of speed."""
    newest = before.history[-1]
    if np.abs(point.shares - newest.shares).max() >= 1e-9:
        return replace(before, history=(*before.history, point)[-HISTORY:], pooled=1)
    off = float(np.abs(point.costs / newest.costs - 1.0).max())
    if before.pooled == 0 and len(before.history) > 1:  # the newest was off its pool
        pool = before.history[-2]
        if shifted(pool.costs, newest.costs, point.costs):  # a change of speed: start over
            change = speed_change(before.history[:-1], point.costs / pool.costs, model)
            return Pool((point,), 1, before.noise, change)  # (the first may straddle it)
        rest = replace(before, history=before.history[:-1], pooled=1)
        return pooled(rest, point, model)  # one disturbed interval: read against the pool
    if off > SHIFT:
        return replace(before, history=(*before.history, point)[-HISTORY:], pooled=0)
    weight = NOISE_WEIGHT if before.noise else 1.0  # the first measured noise is the noise
    noise = (1 - weight) * before.noise + weight * off**2
    count = min(before.pooled, POOL - 1)
    costs = (newest.costs * count + point.costs) / (count + 1)
    mean = Point(point.shares, costs, min(newest.weight + 1.0, 2.0 * POOL - 1))
    history = (*before.history[:-1], mean)
    return replace(before, history=history, pooled=before.pooled + 1, noise=noise)


def speed_change(
    history: tuple[Point, ...], ratio: np.ndarray, model: StepModel | None
) -> SpeedChange | None:
    """The change of speed from the points of `history` by `ratio`, kept to be undone only
    when they measured a steady speed (their newest point pools POOL intervals or more):
    a run's first interval holds the warm-up, which the change after it is not to be
    undone to, and a pool of a few noisy intervals is no speed to restore (M97: undoing
    to any pooled speed worsened the modelled worst cases). `model`: the last reading's,
    the prior for a rank whose points do not span a fit."""
    if history[-1].weight < POOL:
        return None
    return SpeedChange(history, fit(history, model), ratio)


def shifted(pool: np.ndarray, suspect: np.ndarray, point: np.ndarray) -> bool:
    """Whether some rank's cost per row is off `pool`'s by more than SHIFT in both of two
    intervals in a row, the same way: a change of speed, not one disturbed interval."""
    first, second = suspect / pool - 1.0, point / pool - 1.0
    return bool(np.any((np.abs(first) > SHIFT) & (np.abs(second) > SHIFT) & (first * second > 0)))


def passed(change: SpeedChange, point: Point) -> bool:
    """Whether `point` reads the speeds before `change` again: each rank's cost per row
    over what the model before it predicts at the point's shares is within SHIFT of 1,
    and nearer 1 than the change's ratio (summed over the ranks, in logs)."""
    expected = change.model.fixed + change.model.per_share * point.shares
    if np.any(expected <= 0):  # a fit predicting no cost: nothing to compare with
        return False
    over = point.costs / expected
    if np.abs(over - 1.0).max() > SHIFT:
        return False
    return bool(np.abs(np.log(over)).sum() < np.abs(np.log(over / change.ratio)).sum())
