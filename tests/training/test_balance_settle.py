"""`balance: speed` on modelled ranks (training/data/speed_control.py, step_model.py):
each rank's own work a step is a + b x rows, each re-plan interval's timing off by
seeded 15 % noise per rank (what a shared 2-core host gives, benchmarks/RESULTS.md
M49). Deterministic: the same seeds give the same figures. The controller reaches a
split near the best fixed one within the first steps and stays near it, keeps the equal
split on alike ranks, and follows a rank that turns slow mid-run."""

from __future__ import annotations

import numpy as np
import pytest

from training.data.balance import SharePlan, row_bounds

ROWS, EVERY, NOISE = 512, 4, 0.15
Ranks = tuple[list[float], list[float]]  # (seconds a step, seconds a row) per rank
SLOWED: dict[str, Ranks] = {
    "all of rank 1's work 1.5x slower": ([0.010, 0.015], [5e-5, 7.5e-5]),
    "rank 1's rows 2x slower": ([0.010, 0.010], [5e-5, 1e-4]),
    "fixed costs dominate, rank 1 1.5x": ([0.020, 0.030], [3e-5, 4.5e-5]),
}
ALIKE: Ranks = ([0.010, 0.010], [5e-5, 5e-5])
# A shape the 8-seed tests above leave out: all of rank 1's work 2x slower, rows most of
# each step (a CPU quota halved: benchmarks/hetero_quota.py).
QUOTA: Ranks = ([0.014, 0.028], [1.2e-4, 2.4e-4])
SEEDS = 32  # every seed must hold: the worst of 32 (benchmarks/hetero_modelled.py, M72)


def modelled_run(
    ranks: Ranks,
    steps: int,
    seed: int,
    change: tuple[int, Ranks] | None = None,
    plan: SharePlan | None = None,
) -> list[np.ndarray]:
    """Each step's rows per rank under a `SharePlan` (`plan`, or a new one) re-planned
    every EVERY steps from each rank's modelled own work (`ranks`, from step change[0] on
    change[1]), each interval's sum times 1 + NOISE x a standard normal (seeded)."""
    noise, world = np.random.default_rng(seed), len(ranks[0])
    plan = plan if plan is not None else SharePlan()
    history: list[np.ndarray] = []
    samples, busy = np.zeros(world), np.zeros(world)
    for step in range(steps):
        fixed, per_row = change[1] if change and step >= change[0] else ranks
        rows = np.diff(row_bounds(plan.shares_at(0, step * ROWS, world), ROWS))
        history.append(rows)
        samples += rows
        busy += np.array(fixed) + np.array(per_row) * rows
        if (step + 1) % EVERY == 0:
            busy *= np.maximum(1 + NOISE * noise.standard_normal(world), 0.1)
            plan.replan(0, (step + 1) * ROWS, ROWS, list(samples), list(busy))
            samples[:], busy[:] = 0, 0
    return history


def step_s(ranks: Ranks, rows: np.ndarray) -> float:
    return float((np.array(ranks[0]) + np.array(ranks[1]) * rows).max())


def best_fixed_s(ranks: Ranks) -> float:
    """The modelled step of the best fixed split (every split of the rows tried)."""
    return min(step_s(ranks, np.array([fast, ROWS - fast])) for fast in range(1, ROWS))


@pytest.mark.parametrize("case", list(SLOWED))
def test_a_slowed_rank_is_balanced_near_the_best_fixed_split_from_the_first_steps(
    case: str,
) -> None:
    """Invariant: with rank 1 slower (three shapes of cost), re-planned every 4 steps under
    15 % timing noise, in each of 8 seeded runs the mean modelled step is within 1.07x the
    best fixed split's over the first 300 steps (the equal split's first 10 steps
    included, 1.25-1.3x each), and within 1.045x over steps 100-600 (measured: 1.021-1.059
    and 1.006-1.038)."""
    ranks = SLOWED[case]
    best = best_fixed_s(ranks)
    for seed in range(8):
        steps = np.array([step_s(ranks, rows) / best for rows in modelled_run(ranks, 600, seed)])
        assert steps[:300].mean() <= 1.07, (seed, steps[:300].mean())
        assert steps[100:].mean() <= 1.045, (seed, steps[100:].mean())


def test_alike_ranks_keep_the_equal_split_under_timing_noise() -> None:
    """Invariant: on alike ranks under 15 % timing noise, in each of 8 seeded runs of 600
    steps the split is exactly the equal one at 97 % of the steps or more (at most 16
    steps off it here), and the mean modelled step is within 1 % of equal's."""
    equal = step_s(ALIKE, np.array([ROWS // 2, ROWS // 2]))
    for seed in range(8):
        history = modelled_run(ALIKE, 600, seed)
        off = sum(1 for rows in history if rows[0] != ROWS // 2)
        assert off <= 0.03 * 600, (seed, off)
        assert np.mean([step_s(ALIKE, rows) for rows in history]) <= 1.01 * equal


def test_a_rank_that_turns_slow_mid_run_is_followed() -> None:
    """Invariant: alike ranks until step 300, then all of rank 1's work 1.5x slower: in
    each of 8 seeded runs under 15 % noise the split first moves off equal within 40 steps
    of the change (6-38 here), toward the faster rank, and the mean modelled step from
    step 400 on is within 1.09x the best fixed split for the new speeds (1.010-1.070;
    from the change on, 1.027-1.096)."""
    slowed = SLOWED["all of rank 1's work 1.5x slower"]
    best = best_fixed_s(slowed)
    for seed in range(8):
        history = modelled_run(ALIKE, 600, seed, change=(300, slowed))
        moved = next(s for s in range(300, 600) if history[s][0] != history[s - 1][0])
        assert moved - 300 <= 40 and history[moved][0] > ROWS // 2, (seed, moved)
        later = np.mean([step_s(slowed, rows) / best for rows in history[400:]])
        assert later <= 1.09, (seed, later)


@pytest.mark.parametrize("case", [*SLOWED, "quota-like"])
def test_every_seed_runs_within_1_10x_the_best_fixed_split_in_the_first_epoch(
    case: str,
) -> None:
    """Invariant: with rank 1 slower (four shapes of cost), under 15 % timing noise, in
    every one of 32 seeded runs the mean modelled step over the first epoch (300 steps)
    is within 1.10x the best fixed split's, and within 1.05x over the next 300 (measured:
    at most 1.081x and 1.048x; the controller before failed the first epoch at 1.176x
    with fixed costs dominating and 1.134x quota-like, its first fit from two noisy
    intervals sending the split back to equal for 8 intervals or more)."""
    ranks = QUOTA if case == "quota-like" else SLOWED[case]
    best = best_fixed_s(ranks)
    for seed in range(SEEDS):
        steps = np.array([step_s(ranks, rows) / best for rows in modelled_run(ranks, 600, seed)])
        assert steps[:300].mean() <= 1.10, (seed, steps[:300].mean())
        assert steps[300:].mean() <= 1.05, (seed, steps[300:].mean())


def test_every_seed_follows_a_rank_slowed_mid_run_within_the_epoch_after() -> None:
    """Invariant: alike ranks until step 300, then all of rank 1's work 1.5x slower: in
    every one of 32 seeded runs the mean modelled step over the 300 steps after the change
    is within 1.10x the best fixed split for the new speeds (measured: at most 1.096x;
    before, 1.122x: a fit mixing the old speed's points sent the split back to equal)."""
    slowed = SLOWED["all of rank 1's work 1.5x slower"]
    best = best_fixed_s(slowed)
    for seed in range(SEEDS):
        history = modelled_run(ALIKE, 600, seed, change=(300, slowed))
        after = np.mean([step_s(slowed, rows) / best for rows in history[300:]])
        assert after <= 1.10, (seed, after)
