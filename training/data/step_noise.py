"""Each rank's step-to-step spread, and the split that minimises the expected step.

A synchronous step ends when the last rank's own work ends: its time is the largest of
the ranks' times, each a random variable, not the largest of their means. A rank that
shares its core with another process is not steadily slower, it is interrupted: the
scheduler takes the core from it for a few milliseconds at a time, so its step time
spreads far wider than a rank alone on its core. With their mean times equal, the step
waits for the noisier rank's bursts; a split that leaves that rank some slack (fewer
rows than equal busy times call for) gives a shorter step on average, though its mean
busy time is then below the other's (benchmarks/RESULTS.md M84, M85).

Each rank's per-step spread is read from an interval's sum of squared per-step times
(training/distributed/rank_time.py's `own_sq_s`) as its *dispersion*: the variance of
a step's time over its mean, in the step model's units (seconds over the global batch,
training/data/step_model.py). A variance proportional to the mean is what interruptions
give: their count grows with the time a rank is on its core, each of a like length, so
a rank with fewer rows is interrupted less. `expected_step` is the expected largest of
the ranks' times (Clark's moments of the largest of normal variables, one rank at a
time), `quickest_split` the split within the bounds whose expected step is the least
among those that equalise the ranks' means raised by Z_GRID standard deviations. With no
dispersion measured both are step_model.py's largest step and best split, exactly.
"""

from __future__ import annotations

import math

import numpy as np

from training.data.step_model import GAIN_BAND, StepModel, best_split

# Standard deviations each rank's mean is raised by to find the candidate splits: 0 is
# the split that equalises the means (step_model.py's); 3 leaves a noisy rank slack of
# three of its standard deviations, past which the expected step only grows.
Z_GRID = tuple(np.arange(13) / 4)
# A rank's relative spread a step (its standard deviation over its mean) is taken at most
# this: a step that waited for a checkpoint or the loader's start is not a rank's noise.
MAX_SPREAD = 1.0


def step_dispersion(
    samples: np.ndarray, busy_s: np.ndarray, busy_sq_s: np.ndarray, steps: float
) -> np.ndarray:
    """Each rank's variance over mean of a step's own work in an interval of `steps`
    steps where it took `samples` rows in `busy_s` s with squared per-step times summing
    to `busy_sq_s`, in the step model's units (seconds over the interval's rows a step)."""
    global_batch = float(samples.sum()) / steps
    mean = busy_s / steps
    variance = np.clip(busy_sq_s / steps - mean**2, 0.0, (MAX_SPREAD * mean) ** 2)
    return variance / (mean * global_batch)


def running(
    older: np.ndarray | None, measured: np.ndarray | None, weight: float
) -> np.ndarray | None:
    """The ranks' dispersion after an interval that measured `measured` (None: nothing),
    from `older`: their running mean, the newest weighing `weight`."""
    if measured is None or (older is not None and len(older) != len(measured)):
        return older
    return measured if older is None else (1 - weight) * older + weight * measured


def moments(
    model: StepModel, dispersion: np.ndarray, shares: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's (mean, variance) of a step's own work under `shares`."""
    mean = model.fixed + model.per_share * shares
    return mean, dispersion * np.maximum(mean, 0.0)


def expected_step(model: StepModel, dispersion: np.ndarray | None, shares: np.ndarray) -> float:
    """The expected largest of the ranks' step times under `shares` (each normal, with
    its dispersion; independent); the largest mean without a dispersion."""
    if dispersion is None or not dispersion.any():
        return model.largest(shares)
    means, variances = moments(model, dispersion, shares)
    mean, variance = float(means[0]), float(variances[0])
    for other_mean, other_variance in zip(means[1:], variances[1:], strict=True):
        mean, variance = largest_of_two(mean, variance, float(other_mean), float(other_variance))
    return mean


def largest_of_two(mean_a: float, var_a: float, mean_b: float, var_b: float) -> tuple[float, float]:
    """(mean, variance) of the larger of two independent normal variables (Clark, 1961)."""
    theta = math.sqrt(var_a + var_b)
    if theta <= 1e-12 * max(abs(mean_a), abs(mean_b), 1e-300):
        return (mean_a, var_a) if mean_a >= mean_b else (mean_b, var_b)
    alpha = (mean_a - mean_b) / theta
    above = 0.5 * (1.0 + math.erf(alpha / math.sqrt(2.0)))
    density = math.exp(-0.5 * alpha * alpha) / math.sqrt(2.0 * math.pi)
    first = mean_a * above + mean_b * (1.0 - above) + theta * density
    second = (mean_a**2 + var_a) * above + (mean_b**2 + var_b) * (1.0 - above)
    second += (mean_a + mean_b) * theta * density
    return first, max(second - first**2, 0.0)


def quickest_split(
    model: StepModel, dispersion: np.ndarray | None, low: float, high: float
) -> np.ndarray:
    """The split within [low, high] a rank of least expected step among the candidates
    (each rank's line raised by z of its standard deviations at the means' split, for z
    in Z_GRID, up to the bounds), the first (least z) where several tie; the equal split
    exactly when its expected step is within GAIN_BAND of the least. `best_split` without
    a dispersion."""
    plain = best_split(model, low, high)
    if dispersion is None or not dispersion.any():
        return plain
    deviation = np.sqrt(moments(model, dispersion, plain)[1])
    candidates = [plain]
    for z in Z_GRID[1:]:  # each further from the means' split: none past the bounds
        raised = StepModel(model.fixed + z * deviation, model.per_share, model.fitted)
        split = levelled(raised, low, high)
        if split is None:
            break
        candidates.append(split)
    steps = [expected_step(model, dispersion, split) for split in candidates]
    equal = np.full(len(plain), 1.0 / len(plain))
    if expected_step(model, dispersion, equal) <= min(steps) * (1.0 + GAIN_BAND):
        return equal
    return candidates[int(np.argmin(steps))]


def levelled(model: StepModel, low: float, high: float) -> np.ndarray | None:
    """The split that equalises the ranks' predicted steps (closed form: a bisection
    would cost a hundred times more, Z_GRID times an interval), or None where it does not
    lie within [low, high] a rank or some rank's rows cost nothing."""
    if not (model.per_share > 0).all():
        return None
    inverse = 1.0 / model.per_share
    level = (1.0 + float(model.fixed @ inverse)) / float(inverse.sum())
    shares = (level - model.fixed) * inverse
    return shares if shares.min() >= low and shares.max() <= high else None
