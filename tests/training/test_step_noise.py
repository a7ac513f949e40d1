"""Each rank's per-step spread and the split of least expected step
(training/data/step_noise.py): exactly the step model's largest step and best split
without a spread, the expected step bounded by the means and their spreads, Clark's
moments against a sample, the dispersion read from an interval's sums, and slack left
to the noisier rank."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from training.data.speed_control import CAP, FLOOR
from training.data.step_model import StepModel, best_split
from training.data.step_noise import (
    expected_step,
    largest_of_two,
    moments,
    quickest_split,
    step_dispersion,
)

positive = st.floats(1e-6, 1e3, allow_nan=False, allow_infinity=False)
cost = st.floats(0.0, 1e3, allow_nan=False, allow_infinity=False)


@st.composite
def models(draw: st.DrawFn) -> tuple[StepModel, np.ndarray]:
    """A fitted model of 2-5 ranks, hostile scales, and a split of its rows."""
    world = draw(st.integers(2, 5))
    fixed = np.array(draw(st.lists(cost, min_size=world, max_size=world)))
    per_share = np.array(draw(st.lists(positive, min_size=world, max_size=world)))
    weights = np.array(draw(st.lists(positive, min_size=world, max_size=world)))
    return StepModel(fixed, per_share, True), weights / weights.sum()


@settings(max_examples=200, deadline=None)
@given(models(), st.sampled_from([None, "zeros"]))
def test_without_a_spread_the_expected_step_and_split_are_the_step_models(
    drawn: tuple[StepModel, np.ndarray], dispersion: str | None
) -> None:
    """Invariant: with no dispersion measured (None, or every rank's 0) the expected step
    is the largest predicted step and the quickest split is `best_split`'s, bit for bit,
    for any model: ranks whose per-step spread is not measured are balanced as before."""
    model, shares = drawn
    world = len(shares)
    spread = None if dispersion is None else np.zeros(world)
    low, high = FLOOR / world, min(1.0, CAP / world)
    assert expected_step(model, spread, shares) == model.largest(shares)
    assert np.array_equal(quickest_split(model, spread, low, high), best_split(model, low, high))


@settings(max_examples=200, deadline=None)
@given(models(), st.lists(st.floats(0.0, 10.0, allow_nan=False), min_size=5, max_size=5))
def test_the_expected_step_lies_between_the_largest_mean_and_it_plus_the_spreads(
    drawn: tuple[StepModel, np.ndarray], dispersions: list[float]
) -> None:
    """Invariant: the expected largest of the ranks' times is at least the largest mean
    and at most the largest mean plus every rank's standard deviation (E|X - m| <= sd),
    for any model, split and dispersions (0 included)."""
    model, shares = drawn
    dispersion = np.array(dispersions[: len(shares)])
    means, variances = moments(model, dispersion, shares)
    expected = expected_step(model, dispersion, shares)
    tolerance = 1e-9 * max(float(means.max()), 1e-300)
    assert means.max() - tolerance <= expected
    assert expected <= means.max() + np.sqrt(variances).sum() + tolerance


def test_clarks_moments_match_a_sample_of_two_normal_ranks() -> None:
    """Invariant: the mean of the larger of two independent normals is Clark's: equal
    means m give m + sqrt(va + vb) / sqrt(2 pi); unequal ones agree with 400,000 seeded
    draws within 0.2 %, and the variance within 2 %."""
    mean, _ = largest_of_two(10.0, 4.0, 10.0, 5.0)
    assert math.isclose(mean, 10.0 + 3.0 / math.sqrt(2 * math.pi), rel_tol=1e-12)
    rng = np.random.default_rng(7)
    a, b = 13.8 + 1.0 * rng.standard_normal(400_000), 12.0 + 6.4 * rng.standard_normal(400_000)
    mean, variance = largest_of_two(13.8, 1.0, 12.0, 6.4**2)
    larger = np.maximum(a, b)
    assert math.isclose(mean, float(larger.mean()), rel_tol=2e-3)
    assert math.isclose(variance, float(larger.var()), rel_tol=2e-2)


def test_the_dispersion_is_read_from_an_intervals_sums() -> None:
    """Invariant: from an interval's rows, busy seconds and squared per-step seconds, each
    rank's dispersion is its per-step variance over its mean, over the rows a step (the
    step model's units), clipped at a spread as large as the mean itself."""
    steps = np.array([[0.010, 0.011, 0.009, 0.010], [0.010, 0.030, 0.008, 0.012]])
    rows = np.array([380.0, 132.0]) * 4
    got = step_dispersion(rows, steps.sum(axis=1), (steps**2).sum(axis=1), 4.0)
    want = steps.var(axis=1) / (steps.mean(axis=1) * 512.0)
    assert np.allclose(got, want, rtol=1e-9)
    wild = np.array([[0.001, 0.001, 0.001, 0.5]])
    clipped = step_dispersion(np.array([1024.0]), wild.sum(axis=1), (wild**2).sum(axis=1), 4.0)
    mean = wild.mean()
    assert math.isclose(float(clipped[0]), mean**2 / (mean * 256.0), rel_tol=1e-9)


def test_the_noisier_rank_is_left_slack_and_alike_spreads_change_nothing() -> None:
    """Invariant: ranks whose mean steps the best split equalises (M84's fitted lines), the
    slowed one with a per-step spread of 40 % there and the other 5 %: the quickest split
    gives the slowed rank fewer rows than `best_split`, and its expected step is lower;
    with the same dispersion on both, alike ranks keep the equal split."""
    model = StepModel(np.array([0.0050, 0.0063]) / 512, np.array([22.6e-6, 56e-6]), True)
    plain = best_split(model, 0.125, 1.0)
    means = model.fixed + model.per_share * plain
    dispersion = np.array([0.05, 0.40]) ** 2 * means
    quick = quickest_split(model, dispersion, 0.125, 1.0)
    assert quick[1] < plain[1] - 10 / 512
    assert expected_step(model, dispersion, quick) < expected_step(model, dispersion, plain)
    alike = StepModel(np.full(2, model.fixed[1]), np.full(2, model.per_share[1]), True)
    same = np.full(2, dispersion[1])
    assert np.array_equal(quickest_split(alike, same, 0.125, 1.0), np.full(2, 0.5))
