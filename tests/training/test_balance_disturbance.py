"""A slow-down that lasts is followed by `loader.balance: speed` (training/data/
speed_change.py); a disturbance of two or three intervals is read as one, a known
limit this file pins as an expected failure.

Exact readings on modelled ranks (each rank's own work a step a + b x rows, no timing
noise), so every case is deterministic and the split's cost is exact. Two disturbed
intervals read as a change of speed for good hold the split 13-17 % off the best one 100
steps after the disturbance or more, in the worst case of each shape (benchmarks/
RESULTS.md M97). A rule that undid such a change passed the disturbance test, but its
real-node runs took 1.049x the time without it (median of 6 pairs, M98), so it is not in
the controller and the test is marked as failing, strictly: a controller that passes it
is to drop the mark. The noisy cases are test_balance_settle.py's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from training.data.balance import SharePlan, row_bounds

ROWS, EVERY, SETTLED = 512, 4, 448  # rows a step, steps an interval, the burst's step
Ranks = tuple[list[float], list[float]]  # (seconds a step, seconds a row) per rank
SHAPES: list[Ranks] = [
    ([0.010, 0.015], [5e-5, 7.5e-5]),  # all of rank 1's work 1.5x slower
    ([0.010, 0.010], [5e-5, 1e-4]),  # rank 1's rows 2x slower
    ([0.020, 0.030], [3e-5, 4.5e-5]),  # fixed costs dominate
    ([0.014, 0.028], [1.2e-4, 2.4e-4]),  # a CPU quota halved
]


def exact_run(ranks: Ranks, steps: int, slowed: tuple[int, int, int, float]) -> np.ndarray:
    """Each step's modelled time over the best fixed split's (of the speeds outside the
    disturbance), with rank slowed[0]'s work slowed[3] x from step slowed[1] to slowed[2]."""
    plan, world = SharePlan(), len(ranks[0])
    rank, start, end, factor = slowed
    samples, busy, ratios = np.zeros(world), np.zeros(world), []
    for step in range(steps):
        rows = np.diff(row_bounds(plan.shares_at(0, step * ROWS, world), ROWS))
        own = np.array(ranks[0]) + np.array(ranks[1]) * rows
        ratios.append(own.max() / best_step(ranks))
        if start <= step < end:
            own[rank] *= factor
        samples, busy = samples + rows, busy + own
        if (step + 1) % EVERY == 0:
            plan.replan(0, (step + 1) * ROWS, ROWS, list(samples), list(busy))
            samples, busy = np.zeros(world), np.zeros(world)
    return np.array(ratios)


def best_step(ranks: Ranks) -> float:
    fast = np.arange(1, ROWS)
    both = np.array(ranks[0])[:, None] + np.array(ranks[1])[:, None] * np.stack([fast, ROWS - fast])
    return float(both.max(axis=0).min())


@pytest.mark.xfail(
    strict=True,
    reason="a disturbance of 2-3 intervals reads as a change of speed (RESULTS.md M97, M98)",
)
# No shrinking: the expected failure is found at once, and shrinking it took 65 s.
@settings(
    max_examples=25,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    shape=st.sampled_from(range(len(SHAPES))),
    rank=st.sampled_from([0, 1]),
    intervals=st.sampled_from([2, 3]),
    factor=st.floats(1.45, 3.0),
)
def test_a_disturbance_of_whole_intervals_leaves_the_best_split(
    shape: int, rank: int, intervals: int, factor: float
) -> None:
    """Invariant: after the split settled at the best one, either rank 1.45-3x slower for
    two or three whole intervals and then as before (a disturbance the history starts over
    at) costs nothing from 100 steps after it on: every step within 1 % of the best fixed
    split's (with the undo rule of M97: at most 1.0063x; without it: 1.13-1.17x, for each
    shape, so this fails as marked)."""
    ranks = SHAPES[shape]
    end = SETTLED + intervals * EVERY
    ratios = exact_run(ranks, 720, (rank, SETTLED, end, factor))
    assert ratios[SETTLED - 48 : SETTLED].max() <= 1.01, "not settled before the burst"
    assert ratios[end + 100 :].max() <= 1.01, (
        ratios[end + 100 :].max(),
        ratios[end + 100 :].argmax(),
    )


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(range(len(SHAPES))), factor=st.floats(1.45, 3.0))
def test_a_slow_down_that_lasts_is_followed_not_undone(shape: int, factor: float) -> None:
    """Invariant: rank 1 turning 1.45-3x slower for good (a busy loop on its core) is a
    change of speed, never read as a disturbance: from 100 steps after it on, every step is
    within 2 % of the best fixed split's for the new speeds (measured: at most 1.018x, the
    quota-like pair)."""
    fixed, per_row = SHAPES[shape]
    slowed = ([fixed[0], fixed[1] * factor], [per_row[0], per_row[1] * factor])
    ratios = exact_run(SHAPES[shape], 720, (1, SETTLED, 720, factor))
    best_before, best_after = best_step(SHAPES[shape]), best_step(slowed)
    after = ratios[SETTLED + 100 :] * best_before / best_after
    assert after.max() <= 1.02, (after.max(), after.argmax())
