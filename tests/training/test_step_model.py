"""The per-rank step model of `loader.balance: speed` (training/data/step_model.py) and the
controller built on it (training/data/speed_control.py): fits from readings at two
splits, and the split it picks when fixed costs dominate, when costs per row do, when a
split equalising the steps lies inside the bounds, and for alike ranks."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training.data.balance import SharePlan, row_bounds
from training.data.speed_control import (
    CAP,
    DEAD_BAND,
    FLOOR,
    PROBE_AFTER,
    bounded,
    cautious,
    next_shares,
)
from training.data.step_model import (
    GAIN_BAND,
    Point,
    StepModel,
    best_split,
    fit,
    least_largest,
)

ROWS = 512  # rows of a global step
# An interval's timing noise on a shared 2-core host: each rank's 4-step wall time at a
# fixed split varies by 14-17 % (benchmarks/RESULTS.md M49).
NOISE = 0.15


def model(fixed_ms: Sequence[float], per_row_ms: Sequence[float]) -> StepModel:
    """Ranks whose own work a step is fixed_ms + per_row_ms x rows (a share s of the step
    has ROWS x s rows)."""
    return StepModel(np.array(fixed_ms, float), np.array(per_row_ms) * ROWS, fitted=True)


def bounds(world: int) -> tuple[float, float]:
    return FLOOR / world, min(1.0, CAP / world)


def steps_ms(truth: StepModel, shares: np.ndarray) -> np.ndarray:
    return truth.fixed + truth.per_share * shares


def test_a_fit_from_two_splits_recovers_each_ranks_fixed_cost_and_cost_per_row() -> None:
    """Invariant: points on each rank's line at two splits, and one from an interval whose
    split changed part way (its mean share and mean cost), give back each line exactly;
    points at one split give lines through 0 without a prior, and with one the prior's
    lines scaled through the newest point (a rank slowed as a whole: both parts alike)."""
    truth = model([8.0, 16.0], [0.066, 0.132])
    at = [np.array([0.5, 0.5]), np.array([0.8, 0.2])]
    points = [Point(shares, steps_ms(truth, shares)) for shares in at]
    mixed = Point((at[0] + at[1]) / 2, (points[0].costs + points[1].costs) / 2)
    for history in (points, [points[0], mixed], [points[0], mixed, points[1]]):
        fitted = fit(history)
        assert fitted.fitted
        assert fitted.fixed == pytest.approx(truth.fixed)
        assert fitted.per_share == pytest.approx(truth.per_share)
    alone = fit([points[0], points[0]])
    assert not alone.fitted and np.array_equal(alone.fixed, [0.0, 0.0])
    assert alone.per_share == pytest.approx(points[0].costs / at[0])
    slowed = Point(at[1], steps_ms(truth, at[1]) * np.array([1.0, 2.0]))  # rank 1 2x slower
    scaled = fit([slowed, slowed], prior=truth)
    assert scaled.fitted and scaled.fixed == pytest.approx([8.0, 32.0])
    assert scaled.per_share == pytest.approx(truth.per_share * [1.0, 2.0])


def test_a_fit_keeps_fixed_costs_between_none_and_the_whole_step() -> None:
    """Invariant: noisy points whose line would have a negative fixed cost (rows costing
    more than the step) or a fixed cost beyond the step (rows costing less than nothing)
    give a fixed cost of 0 or of the whole mean step, the line through the points' mean."""
    points = [Point(np.array([0.5, 0.5]), np.array([1.0, 3.0]))]
    points.append(Point(np.array([0.75, 0.25]), np.array([3.0, 3.5])))
    fitted = fit(points)
    assert fitted.fixed[0] == 0.0 and fitted.per_share[0] == pytest.approx(2.0 / 0.625)
    assert fitted.fixed[1] == pytest.approx(3.25) and fitted.per_share[1] == 0.0


def test_fixed_costs_that_dominate_keep_the_equal_split() -> None:
    """Invariant: rank 1's fixed cost 4x rank 0's and its rows 2.5 % of its step: moving
    every row the bounds allow would shorten the largest step by less than GAIN_BAND, so
    the split is exactly equal (speed proportional to rows per second would take rank
    1's share to the floor)."""
    slow = model([10.0, 40.0], [0.02, 0.004])
    low, high = bounds(2)
    assert slow.largest(np.array([0.5, 0.5])) < least_largest(slow, low, high) * (1 + GAIN_BAND)
    assert np.array_equal(best_split(slow, low, high), [0.5, 0.5])


def test_costs_per_row_that_dominate_give_a_split_that_equalises_the_steps() -> None:
    """Invariant: with no fixed cost, a rank 2x slower a row gets a third of the rows and
    the two predicted steps are equal; with equal fixed costs as well the split is the
    same (equal fixed costs move nothing)."""
    for fixed in ([0.0, 0.0], [5.0, 5.0]):
        ranks = model(fixed, [0.05, 0.1])
        split = best_split(ranks, *bounds(2))
        assert split == pytest.approx([2 / 3, 1 / 3], abs=1e-9)
        assert np.ptp(steps_ms(ranks, split)) == pytest.approx(0.0, abs=1e-6)


def test_a_slower_fixed_cost_is_made_up_where_the_steps_cross_not_at_the_bound() -> None:
    """Invariant: a rank slowed as a whole (2x its fixed cost and its cost per row, as on a
    core shared with a busy loop) gets the split where the two predicted steps are equal,
    382/130 rows here, inside the bounds, not the floor; a fixed cost the others cannot
    make up even at the bound puts the slow rank at the floor, its predicted step then
    the least any split reaches."""
    shared = model([8.0, 16.0], [0.066, 0.132])
    split = best_split(shared, *bounds(2))
    assert list(np.diff(row_bounds(split, ROWS))) == [382, 130]
    assert np.ptp(steps_ms(shared, split)) == pytest.approx(0.0, abs=1e-6)
    beyond = model([10.0, 40.0], [0.02, 0.04])
    floor = best_split(beyond, *bounds(2))
    assert floor == pytest.approx([1 - FLOOR / 2, FLOOR / 2])
    assert beyond.largest(floor) == pytest.approx(least_largest(beyond, *bounds(2)))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_alike_ranks_get_exactly_the_equal_split(world: int) -> None:
    """Invariant: alike ranks (the same fixed cost and cost per row) get exactly the equal
    split, floats and all; so do ranks alike but for a fixed cost 2 % higher on one."""
    alike = model([6.0] * world, [0.05] * world)
    assert np.array_equal(best_split(alike, *bounds(world)), np.full(world, 1 / world))
    near = model([6.0] * (world - 1) + [6.12], [0.05] * world)
    assert np.array_equal(best_split(near, *bounds(world)), np.full(world, 1 / world))


def test_a_rank_whose_rows_cost_nothing_takes_only_what_the_slow_one_must_shed() -> None:
    """Invariant: of three ranks, a flat one (rows cost it nothing, so any share keeps its
    step) and one whose rows matter beside a slow one: the slow rank's share is where its
    step meets the least largest, and the other two share the rest equally (the split
    nearest the equal one of all that reach the least)."""
    ranks = StepModel(np.array([10.0, 4.0, 4.0]), np.array([0.0, 12.0, 36.0]), fitted=True)
    split = best_split(ranks, *bounds(3))
    assert split[1] == pytest.approx(split[0]) and split[2] < 1 / 3
    assert ranks.largest(split) == pytest.approx(least_largest(ranks, *bounds(3)))


def run_plan(
    fixed_ms: list[float],
    per_row_ms: list[float],
    steps: int,
    until: int = 0,
    noise: np.random.Generator | None = None,
) -> list[np.ndarray]:
    """Each step's rows per rank under a `SharePlan` re-planned every 4 steps from own work
    of fixed_ms + per_row_ms x rows a step (exactly, or with `noise`: each rank's work in
    each interval times a lognormal factor of sigma NOISE); before step `until` the
    last rank's own work never falls below its step at the equal split, whatever its rows
    (a disturbance that makes its first move look as though its rows cost nothing)."""
    plan, history, world = SharePlan(), [], len(fixed_ms)
    samples, busy = np.zeros(world), np.zeros(world)
    at_equal = fixed_ms[-1] + per_row_ms[-1] * ROWS / world
    factor = np.ones(world)
    for step in range(steps):
        rows = np.diff(row_bounds(plan.shares_at(0, step * ROWS, world), ROWS))
        history.append(rows)
        samples += rows
        if noise is not None and step % 4 == 0:
            factor = noise.lognormal(0.0, NOISE, world)
        own_ms = (np.array(fixed_ms) + np.array(per_row_ms) * rows) * factor
        if step < until:
            own_ms[-1] = max(own_ms[-1], at_equal)
        busy += own_ms / 1e3
        if (step + 1) % 4 == 0:
            plan.replan(0, (step + 1) * ROWS, ROWS, list(samples), list(busy))
            samples[:], busy[:] = 0, 0
    return history


def moves(history: list[np.ndarray]) -> list[list[int]]:
    return [
        [int(rows) for rows in history[step]]
        for step in range(1, len(history))
        if not np.array_equal(history[step], history[step - 1])
    ]


def test_the_controller_stops_where_moving_rows_stops_helping() -> None:
    """Invariant: re-planned every 4 steps from exact readings, (a) a rank slowed as a
    whole gets the split that equalises the steps within 20 steps, in three moves (by
    speed, again by speed from the interval that straddles the move, then by the fitted
    model), and keeps it to step 200; (b) a rank whose fixed cost dominates is moved
    once by its speed (no fixed cost measured yet), then, once two splits have measured
    it, returns to the equal split exactly; since the ranks' speeds there still differ,
    it measures again after PROBE_AFTER readings at equal, then after twice as many, and
    so on (4 visits of 2 intervals to the speed split in 400 steps, each followed by the
    equal split again); it never reaches the floor the split proportional to speed runs
    to (64 rows of 256)."""
    shared = run_plan([8.0, 16.0], [0.066, 0.132], 200)
    assert moves(shared) == [[341, 171], [353, 159], [382, 130]]
    assert all(list(rows) == [382, 130] for rows in shared[20:])
    history = run_plan([10.0, 40.0], [0.02, 0.004], 400)
    assert moves(history) == [[374, 138], [256, 256]] * 4
    starts = [step for step in range(1, 400) if history[step][1] == 138 != history[step - 1][1]]
    gaps = [later - earlier - 2 * 4 for earlier, later in itertools.pairwise(starts)]
    assert gaps == [4 * (wait + 1) for wait in (PROBE_AFTER, 2 * PROBE_AFTER, 4 * PROBE_AFTER)]
    assert min(int(rows[1]) for rows in history) == 138


def test_a_fit_that_read_a_slow_rank_as_fixed_does_not_hold_the_equal_split() -> None:
    """Invariant: when the intervals after the first move read the slow rank's own work as
    though its rows cost nothing (so the fit sends the split back to equal), the equal
    split holds only until PROBE_AFTER readings there have shown the ranks' speeds
    differ: the controller then measures again and reaches the split that equalises the
    steps (382/130 rows, as without the disturbance) within 12 intervals of the return,
    and keeps it to step 200."""
    history = run_plan([8.0, 16.0], [0.066, 0.132], 200, until=24)
    back = next(step for step in range(1, 200) if history[step][1] == 256 != history[step - 1][1])
    assert moves(history)[:3] == [[341, 171], [366, 146], [256, 256]]
    settled = next(step for step in range(back, 200) if list(history[step]) == [382, 130])
    assert settled - back <= 4 * (PROBE_AFTER + 4)
    assert all(list(rows) == [382, 130] for rows in history[settled:])


def test_a_fitted_move_needs_a_gain_of_gain_band() -> None:
    """Invariant: once the model is fitted, a target beyond the dead band but predicted to
    shorten the largest step by less than GAIN_BAND moves nothing: a split 8 rows of 512
    off the one that equalises the steps stays where it is."""
    truth = model([8.0, 16.0], [0.066, 0.132])
    last = None
    for split in ([0.5, 0.5], [0.75, 0.25], [0.75, 0.25]):
        shares = np.array(split)
        samples = shares * ROWS
        busy = steps_ms(truth, shares) / 1e3
        _, last = next_shares(shares, samples, busy, last)
    assert last is not None and last.fitted
    near = np.array([390, 122]) / ROWS  # 8 rows off 382/130: 1.6 % longer a step
    moved, reading = next_shares(near, near * ROWS, steps_ms(truth, near) / 1e3, last)
    assert moved is near and reading is not None and not reading.moves()
    assert np.abs(reading.target - near).max() * 2 >= DEAD_BAND


def test_timing_noise_does_not_walk_the_split_around_the_best_one() -> None:
    """Invariant: under 15 % timing noise an interval (lognormal, per rank), with a rank
    twice as slow in all its work (14 + 0.06 ms a row against 28 + 0.12), the split
    stays once moved: over 5 seeded runs of 1,200 steps, at most 10 moves after step 100
    in any run (4-7 here; without pooling and the noise band, 5-76), and each run's
    modelled time is within 0.70x `equal`'s (0.683-0.696x; without them 0.694-0.714x;
    the ideal 0.67x)."""
    fixed, per_row = [14.0, 28.0], [0.06, 0.12]
    for seed in range(5):
        history = run_plan(fixed, per_row, 1200, noise=np.random.default_rng(seed))
        later = moves(history[100:])
        steps = [float(np.max(np.array(fixed) + np.array(per_row) * rows)) for rows in history]
        assert len(later) <= 10, (seed, later)
        assert sum(steps) <= 0.70 * 1200 * (fixed[1] + per_row[1] * ROWS / 2), seed


@settings(max_examples=200, deadline=None)
@given(
    fixed=st.lists(st.floats(0.0, 50.0), min_size=2, max_size=4),
    per_row=st.lists(st.floats(1e-4, 1.0), min_size=4, max_size=4),
    spread=st.floats(0.0, 0.4),
    noise=st.floats(0.0, 1.0),
    k=st.floats(0.0, 4.0),
)
def test_a_cautious_line_is_steeper_never_past_the_line_through_0_and_keeps_its_level(
    fixed: list[float], per_row: list[float], spread: float, noise: float, k: float
) -> None:
    """Invariant: for any fitted lines, points at two splits (any spread, even none) and
    any noise, `cautious` raises no rank's cost per row by less than 0 nor past the line
    through 0 (its fixed cost stays >= 0: rows never cost more than the whole step), and
    every rank's predicted cost at the newest share is the fitted one; with no noise it
    changes nothing."""
    world = len(fixed)
    truth = model(fixed, per_row[:world])
    equal = np.full(world, 1.0 / world)
    moved = bounded(equal + spread * (np.arange(world) - (world - 1) / 2) / world)
    history = tuple(Point(s, steps_ms(truth, s), w) for s, w in ((equal, 3.0), (moved, 1.0)))
    steeper = cautious(truth, history, noise**2, False, k)
    at = history[-1].shares
    assert np.all(steeper.per_share >= truth.per_share - 1e-12)
    assert np.all(steeper.fixed >= -1e-9 * (1 + truth.fixed))
    assert np.allclose(steeper.fixed + steeper.per_share * at, truth.fixed + truth.per_share * at)
    if noise == 0:
        assert np.allclose(steeper.per_share, truth.per_share)
