"""The first fit of `loader.balance: speed` (training/data/speed_control.py), made from
two intervals before any interval is pooled: the timing noise is unmeasured there, not
zero, so the fit is read with NOISE_PRIOR's caution, not as exact."""

from __future__ import annotations

import numpy as np

from training.data.speed_control import FLOOR, equal_shares, read_interval
from training.data.step_model import StepModel, best_split

ROWS = 512  # rows of a global step
STEPS = 4  # steps an interval


def first_fit_returns(cases: int, noise: float, seed: int = 0) -> tuple[int, int]:
    """(cases judged, cases whose first fit sends the split back to equal although equal's
    step is over 1.1x the best split's). Each case: two ranks of random fixed cost and
    cost per row whose best split is off equal by 0.2 equal shares or more; an interval
    at equal, then one at the split it calls for (proportional to speed), each rank's
    work in each interval times a uniform factor within `noise` either way."""
    rng = np.random.default_rng(seed)
    judged = wrong = 0
    equal = equal_shares(2)
    for _ in range(cases):
        fixed, per_row = rng.uniform(0, 20, 2), rng.uniform(0.002, 0.1, 2)
        truth = StepModel(fixed, per_row * ROWS, fitted=True)
        best = best_split(truth, FLOOR / 2, 1.0)
        factors = rng.uniform(1 / (1 + noise), 1 + noise, (2, 2))
        first = read_interval(equal, *interval(fixed, per_row, equal, factors[0]))
        if abs(best[0] - 0.5) * 2 < 0.2 or first is None or np.array_equal(first.target, equal):
            continue
        judged += 1
        second = read_interval(
            first.target, *interval(fixed, per_row, first.target, factors[1]), first
        )
        assert second is not None
        back = np.array_equal(second.target, equal)
        wrong += bool(back and truth.largest(equal) > 1.1 * truth.largest(best))
    return judged, wrong


def interval(
    fixed: np.ndarray, per_row: np.ndarray, shares: np.ndarray, factor: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(rows, seconds of own work) of each rank over an interval run at `shares`."""
    rows = shares * ROWS
    return rows * STEPS, (fixed + per_row * rows) * factor * STEPS / 1e3


def test_a_first_fit_from_unpooled_intervals_rarely_sends_a_slow_rank_back_to_equal() -> None:
    """Invariant: over 1,500 random pairs of ranks whose best split is well off equal, with
    up to 30 % timing noise an interval either way (twice this host's), the first fit
    sends the split back to equal where equal costs over 1.1x the best step in at most
    3 % of the cases (17 of 940 with the prior; 106, 11 %, when the unmeasured noise was
    read as none: one slow interval then made a slow rank's rows look free). With up to
    15 %: at most 1 % (3 of 985; 55, 5.6 %, before)."""
    judged, wrong = first_fit_returns(1500, 0.3)
    assert judged > 800 and wrong <= 0.03 * judged
    judged, wrong = first_fit_returns(1500, 0.15, seed=1)
    assert judged > 800 and wrong <= 0.01 * judged
