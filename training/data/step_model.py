"""A per-rank model of a step's own work, and the split of a global step it calls for.

Each rank's own work a step (data wait plus compute; the all-reduce it then waits in is
shared, not its own) is modelled as affine in its share of the step's rows:
t_r(s) = fixed_r + per_share_r x s, a fixed cost (backward's and the optimizer's work
that rows do not scale, Python overhead) plus a cost per row. A split proportional to
rows per second assumes fixed_r = 0: when a rank is slow because all of its work is
slow (a core shared with another process), it keeps moving rows off it, interval after
interval, to the bound, though the rows left no longer carry the cost.

Readings are `Point`s: each rank's share of the interval's rows and its seconds of own
work per row of the interval (all ranks' rows): with the same global batch every
interval that is a fixed cost `fixed_r` (seconds a step over the global batch) plus
`per_share_r` x the share, whatever the interval's length, and an interval whose split
changed part way is still a point on the same line (its mean share, its mean cost).

`fit` fits each rank's line to the points since the last change of speed (weighted
least squares, each point weighing the intervals it pools; while the newest may be a
new speed's, only the newest at its split) when their shares span at least
`MIN_SPREAD` equal shares.
Readings at one split cannot tell the fixed cost from the cost per row: a rank whose
points do not span that keeps the line it had, scaled through the newest point (a line
through 0 before any fit: the split proportional to speed). `best_split` gives the split
within the bounds whose predicted largest step is the least (the one that equalises the
predicted steps, when one does; the bound when the slow rank's fixed cost exceeds what
the others can take on), nearest the equal split where several are, and the equal split
exactly when its predicted largest step is within `GAIN_BAND` of the least: when moving
rows cannot gain that much (a slow rank whose fixed cost dominates), and for alike ranks.

All shares and spreads are fractions of the step's rows; bands are relative.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Points whose shares of a rank span less than this (in equal shares) leave its line as
# it was: timing noise over so small a difference is no slope (0.1 fitted lines flat from
# an interval's noise in simulation). 0.2 takes in the interval that straddles a move of
# 0.4 equal shares (half of it at each split).
MIN_SPREAD = 0.2
# A split whose predicted largest step is within this of the least is as good: a move
# that gains less than this is not made (an interval's timing noise is more).
GAIN_BAND = 0.03
# Splits whose predicted largest step is within this of the least are all the least (the
# bisection's rounding); the one nearest the equal split is taken.
TIE_BAND = 1e-9
BISECTIONS = 100


@dataclass(frozen=True)
class Point:
    """One interval: each rank's share of its rows and seconds of own work per row."""

    shares: np.ndarray
    costs: np.ndarray
    weight: float = 1.0  # the intervals it pools (their mean): its weight in a fit


def interval_point(samples: np.ndarray, busy_s: np.ndarray) -> Point:
    """The point of an interval where rank r took `samples[r]` rows in `busy_s[r]` s."""
    total = float(samples.sum())
    return Point(samples / total, busy_s / total)


@dataclass(frozen=True)
class StepModel:
    """Each rank's own work a step over the global batch: `fixed` + `per_share` x its
    share. `fitted`: some fixed cost was measured from two splits (now or before);
    otherwise fixed costs are assumed 0 (the split proportional to speed)."""

    fixed: np.ndarray
    per_share: np.ndarray
    fitted: bool

    def largest(self, shares: np.ndarray) -> float:
        """The predicted largest step (over the global batch) under `shares`."""
        return float((self.fixed + self.per_share * shares).max())


def fit(
    history: Sequence[Point], prior: StepModel | None = None, superseding: bool = False
) -> StepModel:
    """Each rank's weighted least-squares line through the points of `history` (each
    weighing the intervals it pools, so that the noise of every interval read since the
    last change of speed averages out) when their shares span at least `MIN_SPREAD`; a
    rank whose points do not has `prior`'s line scaled through the newest point (a rank
    slowed or sped up as a whole: its fixed cost and its cost per row alike), or without
    a prior a line through 0. `superseding`: the newest point may be a new speed's, so the
    older ones at its split (within MIN_SPREAD / 2) are left out."""
    latest, world = history[-1], len(history[-1].shares)
    known = prior is not None and prior.fitted and len(prior.fixed) == world
    fixed, per_share = np.zeros(world), latest.costs / latest.shares
    for rank in range(world):
        shares, costs, weights = rank_points(history, rank, superseding)
        if np.ptp(shares) * world >= MIN_SPREAD:
            fixed[rank], per_share[rank] = line(shares, costs, weights)
            known = True
        elif known and prior is not None:
            at = prior.fixed[rank] + prior.per_share[rank] * latest.shares[rank]
            scale = latest.costs[rank] / at if at > 0 else 1.0
            fixed[rank], per_share[rank] = prior.fixed[rank] * scale, prior.per_share[rank] * scale
    return StepModel(fixed, per_share, known)


def rank_points(
    history: Sequence[Point], rank: int, superseding: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rank `rank`'s (shares, costs, weights) of the points of `history`; `superseding`:
    without the older points within MIN_SPREAD / 2 of the newest in share."""
    world, newest = len(history[-1].shares), history[-1].shares[rank]
    kept = [
        point
        for point in history[:-1]
        if not superseding or abs(point.shares[rank] - newest) * world >= MIN_SPREAD / 2
    ] + [history[-1]]
    return (
        np.array([point.shares[rank] for point in kept]),
        np.array([point.costs[rank] for point in kept]),
        np.array([point.weight for point in kept]),
    )


def line(
    shares: np.ndarray, costs: np.ndarray, weights: np.ndarray | None = None
) -> tuple[float, float]:
    """(fixed cost, cost per share) of the weighted least-squares line through the points,
    its fixed cost within [0, their mean cost]: noise cannot make rows cost less than
    nothing, nor a fixed cost exceed the whole step; the line then goes through their
    mean."""
    weights = np.ones(len(shares)) if weights is None else weights
    weights = weights / weights.sum()
    mean_share, mean_cost = float(weights @ shares), float(weights @ costs)
    centred = shares - mean_share
    slope = float((weights * centred) @ (costs - mean_cost) / ((weights * centred) @ centred))
    fixed = min(max(mean_cost - slope * mean_share, 0.0), mean_cost)
    return fixed, (mean_cost - fixed) / mean_share


def room(model: StepModel, level: float, low: float, high: float) -> np.ndarray:
    """Each rank's largest share, within [low, high], whose predicted step is within
    `level` (`low` for a rank whose step exceeds it even at `low`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        reach = (level - model.fixed) / model.per_share
    flat = np.where(level >= model.fixed, high, low)  # rows cost such a rank nothing
    return np.clip(np.where(model.per_share > 0, reach, flat), low, high)


def least_largest(model: StepModel, low: float, high: float) -> float:
    """The least predicted largest step of any split within [low, high] a rank: the least
    level at which the ranks' room holds the whole step."""
    world = len(model.fixed)
    below = float((model.fixed + model.per_share * low).max())
    above = float((model.fixed + model.per_share * high).max())
    for _ in range(BISECTIONS):
        middle = (below + above) / 2
        if room(model, middle, low, high).sum() >= 1.0 - 1e-12:
            above = middle
        else:
            below = middle
        if above - below <= 1e-12 * max(above, 1e-300) or world == 1:
            break
    return above


def best_split(model: StepModel, low: float, high: float) -> np.ndarray:
    """The split within [low, high] a rank whose predicted largest step is the least, the
    one nearest the equal split where several are (a flat rank's rows cost nothing); the
    equal split exactly when its predicted largest step is within `GAIN_BAND` of the least
    (moving rows would not gain that much)."""
    world = len(model.fixed)
    equal = np.full(world, 1.0 / world)
    least = least_largest(model, low, high)
    if model.largest(equal) <= least * (1.0 + GAIN_BAND):
        return equal
    return nearest(equal, low, room(model, least * (1.0 + TIE_BAND), low, high))


def nearest(equal: np.ndarray, low: float, caps: np.ndarray) -> np.ndarray:
    """The split nearest `equal` within [low, caps]: each rank's share the equal share plus
    one common lift, clipped (the caps must hold the whole step)."""
    below, above = -1.0, 1.0  # the sum of the clipped shares grows with the lift
    for _ in range(BISECTIONS):
        lift = (below + above) / 2
        if np.clip(equal + lift, low, caps).sum() >= 1.0:
            above = lift
        else:
            below = lift
    shares = np.clip(equal + above, low, caps)
    return shares / shares.sum()
