"""How `loader.balance: speed` moves the split of a global step among ranks.

Every interval (`loader.balance_every_n_steps` optimizer steps or more) every rank gets
every rank's rows and seconds of its own work (training/callbacks.py, `SpeedReplan`)
and computes, alike on every rank, a `Reading` (`read_interval`): the shares the
interval ran with (those in force when it is read) and its target, the split that
equalises the ranks' predicted steps (training/data/step_model.py: each rank's own work
a step is a fixed cost plus a cost per row, fitted from the last `HISTORY` intervals at
two splits), bounded to [FLOOR, CAP] x the equal share, and the equal split exactly
when it is within EQUAL_BAND of it (every cut then falls on a unit edge: alike ranks
decode and step as under `equal`). Until two readings at splits far enough apart have
measured a fixed cost, the target is shares proportional to each rank's rows per second
of work (fixed costs assumed none): the first move is made from that, and the reading
after it fits the model. Once fitted, the target is the split nearest the equal one
whose predicted largest step is within GAIN_BAND of the least: when a slow rank's fixed
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

Then the shares become the newer target at once, all the way: after a slow-down the
newer interval is the one measured wholly at the new speed. So a single disturbed
interval (a scheduler hiccup, a checkpoint, a GC pause on one rank) moves nothing, nor
do intervals that disagree (alternating noise); a change of speed that starts with an
interval moves the split two intervals after it (plus the two steps the shares wait,
balance.py's LAG_STEPS). The reading after that move fits the fixed costs (its interval
ran, in whole or in part, at the moved split) and corrects the move at once.

A fitted model can be wrong for good: fitted from two noisy intervals, it may read a
slow rank's cost as fixed, send the split back to equal, and from then on every reading
is at one split, which only rescales the line (step_model.py) and never tests it. So
while a fitted model holds the equal split and the ranks' speeds there call for a move,
the controller counts the readings (`Reading.held`); after `Reading.wait` of them
(PROBE_AFTER at first, doubled at each probe) it forgets the model and measures again
from the split proportional to speed, as at the start. A rank whose fixed cost does
dominate costs a few intervals at each doubling; alike ranks never probe.

The state between intervals is the last reading (its model and points), nothing else: a
pure function of (shares, figures, last reading) gives (new shares, new reading), held
by `SharePlan` (training/data/balance.py) and not saved in a checkpoint (a resume waits
one interval more before its first move, and measures its fixed costs anew).

All bands but GAIN_BAND (relative, of the predicted step) are in units of the equal
share (1/W), compared on the largest rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from training.data.step_model import GAIN_BAND, Point, StepModel, best_split, fit, interval_point

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
# The points a step model is fitted from: the newest and, per rank, the newest of the
# others at another split. Few, so that a point from before a change of speed soon ages
# out; enough to reach past the interval that straddles a move (or two, re-planned
# every 2 steps: the shares move 2 steps after they are planned).
HISTORY = 4
# Readings at the equal split held by a fitted model, while the ranks' speeds there call
# for a move, before the model is forgotten and measured again (doubled at each probe).
# 8 intervals: well past HISTORY, so the probe never cuts short a fit still settling.
PROBE_AFTER = 8


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
    speeds (`held`), and how many such readings forget the model (`wait`)."""

    shares: np.ndarray
    target: np.ndarray
    model: StepModel | None = None
    history: tuple[Point, ...] = ()
    held: int = 0
    wait: int = PROBE_AFTER

    @property
    def fitted(self) -> bool:
        return self.model is not None and self.model.fitted

    def moves(self) -> bool:
        """Whether the target calls for a move from the shares: the equal split from shares
        that are not exactly it; or beyond the dead band and, once the model has measured
        fixed costs, predicted to shorten the largest step by `GAIN_BAND` or more."""
        if np.array_equal(self.target, equal_shares(len(self.shares))):
            return not np.array_equal(self.shares, self.target)
        if np.abs(self.target - self.shares).max() * len(self.shares) < DEAD_BAND:
            return False
        if self.model is None or not self.fitted:
            return True
        gain = self.model.largest(self.shares) / self.model.largest(self.target)
        return bool(gain >= 1.0 + GAIN_BAND)

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
    shares: np.ndarray, samples: np.ndarray, busy_s: np.ndarray, last: Reading | None = None
) -> Reading | None:
    """The reading of an interval run with `shares`, where rank r took `samples[r]` rows in
    `busy_s[r]` seconds of its own work, after `last`: its point joins the history, the
    step model is fitted to it, and the target is the model's best split, or while no
    fixed cost is measured (or once a model held the equal split `last.wait` readings
    against the ranks' speeds) shares proportional to speed, bounded; the equal split
    exactly within `EQUAL_BAND` of it. None when some rank measured nothing or the
    figures are not one per rank."""
    world = len(shares)
    if len(samples) != world or len(busy_s) != world or min(samples.min(), busy_s.min()) <= 0:
        return None
    before = last if last is not None and len(last.shares) == world else None
    history = (*(before.history if before else ()), interval_point(samples, busy_s))[-HISTORY:]
    model = fit(history, before.model if before else None)
    speed, wait = snapped(bounded(samples / busy_s)), before.wait if before else PROBE_AFTER
    if not model.fitted:
        return Reading(shares, speed, model, history, 0, wait)
    target = snapped(bounded(best_split(model, FLOOR / world, min(1.0, CAP / world))))
    # A fitted model needs two readings, so `before` is a reading here.
    equal, unlike = equal_shares(world), not np.array_equal(speed, equal_shares(world))
    holding = unlike and all(np.array_equal(split, equal) for split in (shares, target))
    held = before.held + 1 if before is not None and holding else 0
    if held >= wait:  # forget the model: the next readings measure from speed again
        return Reading(shares, speed, fit(history[-1:]), history, 0, 2 * wait)
    return Reading(shares, target, model, history, held, wait)


def snapped(target: np.ndarray) -> np.ndarray:
    """`target`, or the equal split exactly when it is within `EQUAL_BAND` of it."""
    world = len(target)
    if np.abs(target - 1.0 / world).max() * world < EQUAL_BAND:
        return equal_shares(world)
    return target


def next_shares(
    shares: np.ndarray, samples: np.ndarray, busy_s: np.ndarray, last: Reading | None = None
) -> tuple[np.ndarray, Reading | None]:
    """(shares, reading) after an interval run with `shares` (see the module): this
    interval's target when its reading agrees with `last`, the previous interval's, else
    the shares as they are; and the reading, the state for the next interval. An
    interval that measured nothing on some rank is ignored (shares and state as they were)."""
    reading = read_interval(shares, samples, busy_s, last)
    if reading is None:
        return shares, last
    return (reading.target if reading.agrees(last) else shares), reading
