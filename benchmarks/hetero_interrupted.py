"""`loader.balance: speed` on modelled ranks where the slowed rank is interrupted, not
steadily slow: how near the best fixed split it runs over three epochs.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/hetero_interrupted.py                   # ~1 min
    PYTHONPATH=$PWD .venv/bin/python benchmarks/hetero_interrupted.py --first-seed 32 --seeds 64

A rank sharing its core with a busy loop gets half of it, in slices: its step is its own
work plus bursts of preemption (a Poisson count over the time it is on its core, each
burst exponential, 3 ms on average: INTERRUPTED_FRACTION of its busy time), so its step
spreads far wider than the fast rank's (5 % a step, normal). Fitted to RESULTS M84's
sweep (the demo classifier at `--scale 8`, batch 256 a rank): the fast rank's mean step
0.0050 s + 22.6 us a row, the slowed rank's 0.0063 s + 56 us a row (busy time at equal
0.0108 / 0.0206 s, at 455 fast rows 0.0153 / 0.0095 s). The modelled step is the later
of the two ranks'; the best fixed split's expected step comes from the same model, every
split of the 512 rows tried (TABLE_DRAWS draws each, one seed for all, so neighbouring
splits compare alike). Each re-plan interval (4 steps) reports each rank's rows, busy
seconds and squared per-step seconds, as training/distributed/rank_time.py gathers them.

Printed per case, over the seeds (mean / worst): the expected step at the run's split
over the best fixed split's, over the first epoch (300 steps), all three (900) and the
two after the first; `speed` as shipped (the expected step's target, step_noise.py)
beside it without the per-step spread (`--no-spread`: mean busy times equalised, the
controller before). Not a timing: exact per seed.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Appended, not first: PYTHONPATH at another checkout runs that checkout's controller.
sys.path.append(str(Path(__file__).resolve().parents[1]))

import argparse
from dataclasses import dataclass
from functools import cache

import numpy as np

from benchmarks.hetero_modelled import spread as seed_spread
from training.data.balance import SharePlan, row_bounds

ROWS, EVERY, EPOCH = 512, 4, 300
TABLE_DRAWS, TABLE_SEED = 8000, 20261207
INTERRUPTED_FRACTION, BURST_S, QUIET_NOISE = 0.5, 0.003, 0.05


@dataclass(frozen=True)
class Rank:
    """A rank's mean step (fixed s + s a row) and the fraction of it spent preempted."""

    fixed: float
    per_row: float
    interrupted: float = 0.0

    def steps(self, rows: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """One step time for each entry of `rows` (the rows this rank took that step)."""
        mean = self.fixed + self.per_row * rows
        own = mean * (1 - self.interrupted)
        quiet = own * (1 + QUIET_NOISE * rng.standard_normal(own.shape))
        if not self.interrupted:
            return quiet
        rate = self.interrupted / ((1 - self.interrupted) * BURST_S)  # bursts a second
        count = rng.poisson(rate * own)
        return quiet + rng.gamma(np.maximum(count, 1), BURST_S) * (count > 0)


FAST, SLOWED = Rank(0.0050, 22.6e-6), Rank(0.0063, 56e-6, INTERRUPTED_FRACTION)
CASES: dict[str, tuple[Rank, Rank]] = {
    "busy loop on rank 1 (M84)": (FAST, SLOWED),
    "alike, both interrupted": (SLOWED, SLOWED),
    "alike, quiet": (FAST, FAST),
}


@cache
def expected_steps(ranks: tuple[Rank, Rank]) -> np.ndarray:
    """The expected step at every split: entry r has r rows on rank 0 (r = 0 unused)."""
    expected = np.full(ROWS, np.inf)
    for fast in range(1, ROWS):
        rng = np.random.default_rng(TABLE_SEED)
        first = ranks[0].steps(np.full(TABLE_DRAWS, fast), rng)
        second = ranks[1].steps(np.full(TABLE_DRAWS, ROWS - fast), rng)
        expected[fast] = float(np.maximum(first, second).mean())
    return expected


def modelled_run(ranks: tuple[Rank, Rank], steps: int, seed: int, spread: bool = True) -> list[int]:
    """Rank 0's rows at each step under a `SharePlan` re-planned every EVERY steps from
    each rank's modelled steps (seeded); `spread`: with the squared per-step seconds."""
    rng, plan = np.random.default_rng(seed), SharePlan()
    samples, busy, squared, fast_rows = np.zeros(2), np.zeros(2), np.zeros(2), []
    for step in range(steps):
        rows = np.diff(row_bounds(plan.shares_at(0, step * ROWS, 2), ROWS))
        own = np.array([rank.steps(rows[r : r + 1], rng)[0] for r, rank in enumerate(ranks)])
        fast_rows.append(int(rows[0]))
        samples, busy, squared = samples + rows, busy + own, squared + own**2
        if (step + 1) % EVERY == 0:
            sq = list(squared) if spread else None
            plan.replan(0, (step + 1) * ROWS, ROWS, list(samples), list(busy), sq)
            samples, busy, squared = np.zeros(2), np.zeros(2), np.zeros(2)
    return fast_rows


def over_best(ranks: tuple[Rank, Rank], fast_rows: list[int]) -> np.ndarray:
    """Each step's expected step at its split over the best fixed split's (alike ranks:
    over the equal split's, the best by symmetry, which the table's draws blur)."""
    table = expected_steps(ranks)
    best = table[ROWS // 2] if ranks[0] == ranks[1] else table.min()
    return table[np.array(fast_rows)] / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=32)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds not tuned on: 32")
    parser.add_argument("--steps", type=int, default=3 * EPOCH)
    args = parser.parse_args()
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    print(
        "| case | controller | best fixed (rank 0 rows) | first epoch | all | after it "
        "| last split (median) |\n|---|---|---|---|---|---|---|"
    )
    for name, ranks in CASES.items():
        best = int(np.argmin(expected_steps(ranks)))
        for label, spread in (("speed", True), ("no spread", False)):
            rows = [modelled_run(ranks, args.steps, seed, spread) for seed in seeds]
            runs = [over_best(ranks, r) for r in rows]
            parts = (slice(EPOCH), slice(None), slice(EPOCH, None))
            cells = [seed_spread(runs, part) for part in parts]
            last = int(np.median([r[-1] for r in rows]))
            print(f"| {name} | {label} | {best} | {' | '.join(cells)} | {last} |")


if __name__ == "__main__":
    main()
