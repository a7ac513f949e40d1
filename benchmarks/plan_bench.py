"""Planning micro-benchmark: `preprocessing.plan.split.plan_split` over footer counts of 1e6 files.

Synthesises the counts a scan of `--files` single-piece files would return (each file
one source of 3, `--strata-per-piece` of 16 classes, deterministic from `--seed`),
builds the columnar table `scan.count_records` makes of them, and times, each on its
own: building the table, `plan_split` of the training split per shuffle mode
(uniform class mix, 50,000-row shards) and of the (empty) holdout split, which
`run_reshard` always plans too. Memory is the process RSS, sampled every 20 ms: the
table's footprint, and each phase's peak above what it started with. Target: plan_split
under 60 s and the whole process under 4 GB. `--profile` prints cProfile's top entries.

    .venv/bin/python benchmarks/plan_bench.py --files 1000000
    .venv/bin/python benchmarks/plan_bench.py --files 1000000 --profile --modes stratified
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python benchmarks/NAME.py` puts benchmarks/ first on sys.path, `python -m benchmarks.NAME`
# the working directory: either way the repository root goes first, for `benchmarks.*` and
# for ballast itself in a clone without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import cProfile
import pstats
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import psutil

from preprocessing.config import MixConfig
from preprocessing.plan.counts import COUNT_DTYPE, Counts
from preprocessing.plan.split import SHUFFLE_MODES, plan_split

GB = 1e9
NUM_CLASSES = 16
NUM_SOURCES = 3
SHARD_ROWS = 50_000


class DiskSampler:
    """The most disk the work directory's filesystem used above its level at start,
    sampled on a background thread (staged objects and shards come and go in a run)."""

    def __init__(self, directory: str, interval_s: float = 0.5) -> None:
        self.directory, self.interval_s = directory, interval_s
        self.start = self.peak = shutil.disk_usage(directory).used
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, shutil.disk_usage(self.directory).used)

    def __enter__(self) -> DiskSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class RssSampler:
    """Peak RSS of this process, sampled on a background thread."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self.process, self.interval_s, self.peak = psutil.Process(), interval_s, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval_s)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Print the wall time, RSS after and peak RSS growth of the enclosed block."""
        before = self.process.memory_info().rss
        self.peak, start = before, time.perf_counter()
        yield
        wall = time.perf_counter() - start
        after = self.process.memory_info().rss
        self.peak = max(self.peak, after)
        print(
            f"{name:<34} {wall:>8.2f} s   RSS {after / GB:5.2f} GB   "
            f"peak +{(self.peak - before) / GB:5.2f} GB",
            flush=True,
        )

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def synthetic_counts(
    num_files: int, strata_per_piece: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(piece, label, source, rows) columns: each file's distinct classes and row counts."""
    rng = np.random.default_rng(seed)
    pieces = np.repeat(np.arange(num_files), strata_per_piece)
    first = rng.integers(0, NUM_CLASSES, num_files)
    step = np.arange(strata_per_piece)  # distinct classes per piece: first + 0, 1, 2 ...
    labels = (first[:, None] + step[None, :]).reshape(-1) % NUM_CLASSES
    rows = rng.integers(1, 5_000, len(pieces))
    return pieces, labels, pieces % NUM_SOURCES, rows


def build_records(columns: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]) -> Counts:
    """The table `scan.count_records` would make from those counts (source code s is
    `source-s`)."""
    table = np.zeros(len(columns[0]), dtype=COUNT_DTYPE)
    for name, column in zip(("piece", "label", "source", "num_rows"), columns, strict=True):
        table[name] = column
    return Counts(
        table.tobytes(), tuple(range(NUM_CLASSES)), tuple(f"source-{s}" for s in range(NUM_SOURCES))
    )


def profile(call: Callable[[], Any], top: int) -> None:
    """cProfile one call; print the top entries by own time and by cumulative time."""
    profiler = cProfile.Profile()
    profiler.runcall(call)
    for order in ("tottime", "cumulative"):
        print(f"\n--- cProfile, top {top} by {order} ---")
        pstats.Stats(profiler).sort_stats(order).print_stats(top)


def run(args: argparse.Namespace) -> None:
    mix = MixConfig(class_weighting="uniform")
    with RssSampler() as sampler:
        with sampler.phase("synthesise counts (numpy)"):
            columns = synthetic_counts(args.files, args.strata_per_piece, args.seed)
        with sampler.phase(f"build {len(columns[0]):,} count records"):
            records = build_records(columns)
        del columns
        for mode in args.modes:
            with sampler.phase(f"plan_split train {mode}"):
                plan = plan_split(records, "train", mix, None, SHARD_ROWS, mode, args.seed)
            print(
                f"  -> {plan.num_shards} shards, {plan.num_output_rows:,} rows, "
                f"{len(plan.piece_offsets.offsets):,} piece offsets",
                flush=True,
            )
            del plan
        with sampler.phase("plan_split holdout (empty)"):
            plan_split(records, "holdout", None, None, SHARD_ROWS, "stratified", args.seed)
        print(
            f"process peak RSS {psutil.Process().memory_info().rss / GB:.2f} GB now, "
            f"{_max_rss_gb():.2f} GB at most",
            flush=True,
        )
    if args.profile:
        profile(
            lambda: plan_split(records, "train", mix, None, SHARD_ROWS, args.modes[0], args.seed),
            args.top,
        )


def _max_rss_gb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=1_000_000, help="one piece per file")
    parser.add_argument("--strata-per-piece", type=int, default=4)
    parser.add_argument("--modes", nargs="+", choices=SHUFFLE_MODES, default=["stratified"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="cProfile the first mode")
    parser.add_argument("--top", type=int, default=15, help="profile entries to print")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
