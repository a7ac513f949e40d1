"""`loader.balance: speed` on modelled ranks, without processes: how near the best fixed
split it runs from the first step, under seeded timing noise.

    .venv/bin/python benchmarks/hetero_modelled.py                  # about 2 min
    PYTHONPATH=/path/to/a26e4c8 .venv/bin/python benchmarks/hetero_modelled.py   # A/B
    .venv/bin/python benchmarks/hetero_modelled.py --spread   # per-step squares too (M85)
    .venv/bin/python benchmarks/hetero_modelled.py --host RUN_DIR ...   # a real host's noise

Each rank's own work a step is a + b x rows (four slowed shapes, alike ranks, and a rank
that turns slow mid-run), each re-plan interval (4 steps) times 1 + 15 % x a standard
normal per rank, as tests/training/test_balance_settle.py models it; the controller is
whatever `training` the interpreter imports (PYTHONPATH at another checkout: its
controller). Printed per case, over the seeds (mean / worst): the modelled step over the
best fixed split's (every split of the 512 rows tried; for alike ranks that is equal)
over the first epoch (the first 300 steps) and after it; mid-run, over the epoch after
the change (its 300 steps) and after that; a disturbance (rank 1 BURST x slower for two
intervals' steps, from a step not on an interval's edge), over the 300 steps from it and
after that. Not a timing: the figures are the model's,
exact per seed.

`--host`: the noise of a real host instead, replayed. Each RUN_DIR is a fixed split's run
of benchmarks/hetero_bench.py; its records give per step and rank the CPU the step took
over the rank's median (its drift, its bursts, both ranks at once), which multiplies the
modelled ranks' work step by step, from ROTATIONS starting points of each run. Printed
per slowed shape (mean / worst over the replays): the modelled time over the best fixed
split's under the same replay (the split fastest over all steps), first epoch and all.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Appended, not first: PYTHONPATH at another checkout runs that checkout's controller.
sys.path.append(str(Path(__file__).resolve().parents[1]))

import argparse
import json

import numpy as np

from training.data.balance import SharePlan, row_bounds

ROWS, EVERY, NOISE, EPOCH = 512, 4, 0.15, 300
Ranks = tuple[list[float], list[float]]
CASES: dict[str, Ranks] = {
    "all work 1.5x": ([0.010, 0.015], [5e-5, 7.5e-5]),
    "rows 2x": ([0.010, 0.010], [5e-5, 1e-4]),
    "fixed-heavy 1.5x": ([0.020, 0.030], [3e-5, 4.5e-5]),
    "quota-like 2x": ([0.014, 0.028], [1.2e-4, 2.4e-4]),
}
ALIKE: Ranks = ([0.010, 0.010], [5e-5, 5e-5])
MIDRUN = ("all work 1.5x", "quota-like 2x")
# A disturbance, not a change of speed: rank 1's own work BURST x slower for two intervals
# (M97: 8 steps of the tokens model's slowed rank 1.55x slower in its third epoch).
BURST, BURST_STEPS, BURST_AT = 1.55, 2 * EVERY, 450
# A replayed host (--host): the first WARM steps of a run (the warm-up) are left out, and
# each run is replayed from ROTATIONS starting points, its end wrapping to its start.
WARM, ROTATIONS = 20, 8


def run(
    ranks: Ranks,
    steps: int,
    seed: int,
    change: int | None = None,
    spread: bool = False,
    burst: int | None = None,
    host: np.ndarray | None = None,
) -> np.ndarray:
    """Each step's modelled time over the best fixed split's (of the speeds then);
    `spread`: each interval's squared per-step times reported too (times its noise);
    `burst`: rank 1's own work BURST x slower for BURST_STEPS steps from that step;
    `host`: per step and rank a real host's speed (host_trace) in place of the seeded
    noise, and each step's time itself returned, not over the best."""
    noise, plan = np.random.default_rng(seed), SharePlan()
    samples, busy, squared, ratios = np.zeros(2), np.zeros(2), np.zeros(2), []
    for step in range(steps):
        fixed, per_row = ALIKE if change is not None and step < change else ranks
        rows = np.diff(row_bounds(plan.shares_at(0, step * ROWS, 2), ROWS))
        own = np.array(fixed) + np.array(per_row) * rows
        if host is not None:
            own = own * host[step]
        if burst is not None and burst <= step < burst + BURST_STEPS:
            own = own * np.array([1.0, BURST])
        ratios.append(own.max() / (1.0 if host is not None else best_s((fixed, per_row))))
        samples, busy, squared = samples + rows, busy + own, squared + own**2
        if (step + 1) % EVERY == 0:
            draw = np.maximum(1 + NOISE * noise.standard_normal(2), 0.1)
            factor = draw if host is None else np.ones(2)  # a replayed host is its noise
            busy, squared = busy * factor, squared * factor**2
            sq = list(squared) if spread else None
            plan.replan(0, (step + 1) * ROWS, ROWS, list(samples), list(busy), sq)
            samples, busy, squared = np.zeros(2), np.zeros(2), np.zeros(2)
    return np.array(ratios)


def best_s(ranks: Ranks) -> float:
    """The step of the fastest fixed split of `ranks` (on an even host)."""
    return float(fixed_times(ranks, np.ones((1, 2))).min())


def host_trace(run_dir: Path) -> np.ndarray:
    """Per step (rows) and rank (columns), the CPU a step of `run_dir`'s run took over
    the rank's median, from its records, the first WARM steps left out."""
    cpu = [
        [json.loads(line)["cpu_s"] for line in path.read_text().splitlines()]
        for path in (run_dir / "record" / f"rank{rank}.jsonl" for rank in range(2))
    ]
    steps = np.diff(np.array(cpu), axis=1)[:, WARM:]
    return (steps / np.median(steps, axis=1, keepdims=True)).T


def fixed_times(ranks: Ranks, host: np.ndarray) -> np.ndarray:
    """Per step (rows) and fixed split (columns: the fast rank's rows, 1 to ROWS - 1),
    the step's time under `host`."""
    fast = np.arange(1, ROWS)
    own = np.array(ranks[0])[:, None] + np.array(ranks[1])[:, None] * np.stack([fast, ROWS - fast])
    return np.asarray((host[:, :, None] * own[None]).max(axis=1))


def replays(run_dirs: list[Path]) -> None:
    """Per slowed shape, speed's time over the best fixed split's on each replayed host."""
    print("| shape, a real host replayed | first epoch (300 steps) | all steps |\n|---|---|---|")
    traces = [host_trace(run_dir) for run_dir in run_dirs]
    for name, ranks in CASES.items():
        first, whole = [], []
        for trace in traces:
            for start in range(0, len(trace), -(-len(trace) // ROTATIONS)):
                host = np.roll(trace, -start, axis=0)
                times, fixed = run(ranks, len(host), 0, host=host), fixed_times(ranks, host)
                best = fixed[:, int(fixed.sum(axis=0).argmin())]
                first.append(times[:EPOCH].sum() / best[:EPOCH].sum())
                whole.append(times.sum() / best.sum())
        print(f"| {name} | {np.mean(first):.3f} / {max(first):.3f} | ", end="")
        print(f"{np.mean(whole):.3f} / {max(whole):.3f} |")


def spread(runs: list[np.ndarray], part: slice) -> str:
    values = [float(r[part].mean()) for r in runs]
    return f"{np.mean(values):.3f} / {max(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=32)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds not tuned on: 32")
    parser.add_argument("--steps", type=int, default=900)
    parser.add_argument(
        "--spread", action="store_true", help="report squared per-step times (M85's path)"
    )
    parser.add_argument(
        "--host", nargs="+", type=Path, help="fixed-split run dirs: their noise replayed"
    )
    args = parser.parse_args()
    if args.host:
        return replays(args.host)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    first, after = slice(EPOCH), slice(EPOCH, None)
    print("| case | first epoch (300 steps) | after it |\n|---|---|---|")
    for name, ranks in [*CASES.items(), ("alike (over equal)", ALIKE)]:
        runs = [run(ranks, args.steps, seed, spread=args.spread) for seed in seeds]
        print(f"| {name} | {spread(runs, first)} | {spread(runs, after)} |")
    for name in MIDRUN:
        runs = [run(CASES[name], args.steps, seed, EPOCH, args.spread) for seed in seeds]
        print(
            f"| slowed at step {EPOCH} ({name}): the epoch after the change / after it | "
            f"{spread(runs, slice(EPOCH, 2 * EPOCH))} | {spread(runs, slice(2 * EPOCH, None))} |"
        )
    for name in CASES:
        runs = [
            run(CASES[name], args.steps, seed, spread=args.spread, burst=BURST_AT) for seed in seeds
        ]
        print(
            f"| {BURST}x for {BURST_STEPS} steps at step {BURST_AT} ({name}): the 300 steps "
            f"from it / after | {spread(runs, slice(BURST_AT, BURST_AT + EPOCH))} | "
            f"{spread(runs, slice(BURST_AT + EPOCH, None))} |"
        )


if __name__ == "__main__":
    main()
