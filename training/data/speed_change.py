"""How `loader.balance: speed`'s intervals become the step model's points: pooled at one
split, and started over at a change of speed.

Readings at one split are pooled (`joined`): the intervals in a row that ran wholly at
the shares in force, none off the pool by more than SHIFT, make one point, their mean,
and the fit reads every point since the last change of speed, each weighing the
intervals it pools. An interval off its pool by more than SHIFT is held apart: the next
one, off the same way, confirms a change of speed (the history starts over from it), or
shows it was one disturbed interval (dropped).

Two disturbed intervals in a row also confirm a change, and the points before it are
not kept to be restored: a rule that kept them for 8 intervals and restored them when
the newest point read the old speeds again held the best split after a disturbance on
exact modelled ranks, but on real nodes, whose speed drifts 10-25 % between stretches of
a hundred steps, its runs took 1.049x the time without it (the median of 6 pairs, 5 of
them slower), and replaying such a host's speeds it gained nothing (benchmarks/RESULTS.md
M98).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from training.data.step_model import Point

# The points a step model is fitted from (a change of speed starts them over): 16, each
# pooling up to 2 POOL - 1 intervals, average out 15 % timing noise an interval where the
# 4 points of M50 walked the split (tests/training/test_balance_settle.py).
HISTORY = 16
# Intervals in a row at one split are pooled into one point (their mean cost per row),
# the newest weighing at least 1/POOL: the longer the split holds, the less an
# interval's noise moves the fit, while a change of speed still shows within a few.
POOL = 8
# A rank whose cost per row in the newest interval is off the pooled one by more than
# this (relative) has changed speed: the pool restarts from that interval. About twice
# an interval's timing noise (15 % on a shared 2-core host), far under a 2x slow-down.
SHIFT = 0.35
# An interval's relative noise (a variance) is the running mean of the squared difference
# of each pooled interval from its pool, 0 until one is pooled, the newest weighing this.
NOISE_WEIGHT = 1 / 8


@dataclass(frozen=True)
class Pool:
    """The fit's points since the last change of speed, newest last; how many intervals the
    newest pools (0: it is off the pool before it by more than SHIFT, held apart); and an
    interval's relative noise (a variance, see NOISE_WEIGHT)."""

    history: tuple[Point, ...]
    pooled: int = 1
    noise: float = 0.0


def joined(before: Pool | None, point: Point) -> Pool:
    """The pool after `point`. At the split of the newest point (both ran wholly at it):
    merged into it when no rank's cost per row is off by more than SHIFT (their mean, the
    newest weighing 1 / min(n + 1, POOL); the noise takes in its largest relative
    difference from the pool); else appended, held apart: if the next interval is off the
    pool the same way, the ranks changed speed and the history starts over from it (the
    points before measured the old speeds, and the held one may straddle the change); if
    not, the held one was one disturbed interval and is dropped. At a new split: appended
    (the last `HISTORY` points kept), so that the fit reads every interval since the last
    change of speed."""
    if before is None or not before.history:
        return Pool((point,), 1, 0.0)
    newest = before.history[-1]
    if np.abs(point.shares - newest.shares).max() >= 1e-9:
        return replace(before, history=(*before.history, point)[-HISTORY:], pooled=1)
    off = float(np.abs(point.costs / newest.costs - 1.0).max())
    if before.pooled == 0 and len(before.history) > 1:  # the newest was off its pool
        pool = before.history[-2]
        if shifted(pool.costs, newest.costs, point.costs):  # a change of speed: start over
            return Pool((point,), 1, before.noise)  # (the first interval may straddle it)
        rest = replace(before, history=before.history[:-1], pooled=1)
        return joined(rest, point)  # one disturbed interval: read against the pool before
    if off > SHIFT:
        return replace(before, history=(*before.history, point)[-HISTORY:], pooled=0)
    weight = NOISE_WEIGHT if before.noise else 1.0  # the first measured noise is the noise
    noise = (1 - weight) * before.noise + weight * off**2
    count = min(before.pooled, POOL - 1)
    costs = (newest.costs * count + point.costs) / (count + 1)
    mean = Point(point.shares, costs, min(newest.weight + 1.0, 2.0 * POOL - 1))
    return Pool((*before.history[:-1], mean), before.pooled + 1, noise)


def shifted(pool: np.ndarray, suspect: np.ndarray, point: np.ndarray) -> bool:
    """Whether some rank's cost per row is off `pool`'s by more than SHIFT in both of two
    intervals in a row, the same way: a change of speed, not one disturbed interval."""
    first, second = suspect / pool - 1.0, point / pool - 1.0
    return bool(np.any((np.abs(first) > SHIFT) & (np.abs(second) > SHIFT) & (first * second > 0)))
