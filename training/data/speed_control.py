"""How `loader.balance: speed` moves the split of a global step among ranks.

Every interval (`loader.balance_every_n_steps` optimizer steps or more) every rank gets
every rank's rows and seconds of its own work (training/callbacks.py, `SpeedReplan`)
and computes, alike on every rank, a `Reading` (`read_interval`): the shares the
interval ran with (those in force when it is read) and its target, shares proportional
to each rank's rows per second of work (a fixed point has every rank equally busy),
bounded to [FLOOR, CAP] x the equal share, and the equal split exactly when it is within
EQUAL_BAND of it (every cut then falls on a unit edge: alike ranks decode and step as
under `equal`).

The rule (`next_shares`): the split moves only when the reading and the previous
interval's agree (`Reading.agrees`):

1. each calls for a move from the shares it ran with: its target beyond DEAD_BAND of
   them, or the equal split from shares that are not exactly it;
2. the two moves point the same way (a positive inner product: the same ranks slower);
3. the two targets are within AGREE_BAND of each other.

Then the shares become the newer target at once, all the way: after a slow-down the
newer interval is the one measured wholly at the new speed. So a single disturbed
interval (a scheduler hiccup, a checkpoint, a GC pause on one rank) moves nothing, nor
do intervals that disagree (alternating noise); a change of speed that starts with an
interval moves the split two intervals after it (plus the two steps the shares wait,
balance.py's LAG_STEPS). The reading that made a move and the next one, run with the
moved shares, may agree on more of the same move: a per-step cost that rows do not
scale, which the per-row speed under-corrects, is made up one interval later.

The state between intervals is the last reading, nothing else: a pure function of
(shares, figures, last reading) gives (new shares, new reading), held by `SharePlan`
(training/data/balance.py) and not saved in a checkpoint (a resume waits one interval
more before its first move).

All bands are in units of the equal share (1/W), compared on the largest rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
    read) and the split it calls for, its target (see the module)."""

    shares: np.ndarray
    target: np.ndarray

    def moves(self) -> bool:
        """Whether the target calls for a move from the shares: beyond the dead band, or
        the equal split from shares that are not exactly it."""
        if np.array_equal(self.target, equal_shares(len(self.shares))):
            return not np.array_equal(self.shares, self.target)
        return bool(np.abs(self.target - self.shares).max() * len(self.shares) >= DEAD_BAND)

    def agrees(self, older: Reading | None) -> bool:
        """Whether this reading and the one before it call for the same move: both move,
        each from the shares it ran with, in the same direction (a positive inner product
        of the two moves: the same ranks slower), to targets within `AGREE_BAND`."""
        if older is None or len(older.target) != len(self.target):
            return False
        if not (older.moves() and self.moves()):
            return False
        close = np.abs(self.target - older.target).max() * len(self.target) <= AGREE_BAND
        same_way = (older.target - older.shares) @ (self.target - self.shares) > 0
        return bool(close and same_way)


def read_interval(shares: np.ndarray, samples: np.ndarray, busy_s: np.ndarray) -> Reading | None:
    """The reading of an interval run with `shares`, where rank r took `samples[r]` rows in
    `busy_s[r]` seconds of its own work: the target is shares proportional to its speed,
    bounded, and the equal split exactly within `EQUAL_BAND` of it; None when some rank
    measured nothing or the figures are not one per rank."""
    world = len(shares)
    if len(samples) != world or len(busy_s) != world or min(samples.min(), busy_s.min()) <= 0:
        return None
    speeds = samples / busy_s
    target = speeds / speeds.sum()
    if np.abs(target - 1.0 / world).max() * world < EQUAL_BAND:
        return Reading(shares, equal_shares(world))
    return Reading(shares, bounded(target))


def next_shares(
    shares: np.ndarray, samples: np.ndarray, busy_s: np.ndarray, last: Reading | None = None
) -> tuple[np.ndarray, Reading | None]:
    """(shares, reading) after an interval run with `shares` (see the module): this
    interval's target when its reading agrees with `last`, the previous interval's, else
    the shares as they are; and the reading, the state for the next interval. An
    interval that measured nothing on some rank is ignored (shares and state as they were)."""
    reading = read_interval(shares, samples, busy_s)
    if reading is None:
        return shares, last
    return (reading.target if reading.agrees(last) else shares), reading
