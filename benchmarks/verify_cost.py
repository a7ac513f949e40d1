"""The loader benchmark's `--verify` section: what `read.verify: sha256` costs against `size`.

Each mode reads one epoch of the train split with a fresh `ShardStream` (0 workers,
default read-ahead, 1024-row batches), so `sha256` hashes every shard once, as the first
epoch of a run does; the modes run round robin `repeat` times and each keeps its fastest
pass. Printed: rows/s per mode and each mode's rows/s relative to `size` (the default).
The file pages are warm after the first pass: the hash reads from the page cache, the
cheapest case; on S3 it is a second download of every shard.
"""

from __future__ import annotations

import argparse
import time

from training.config import LoaderConfig
from training.data.loader import ShardStream
from training.data.readahead import ReadConfig

BATCH = 1024


def epoch_rows_per_s(root: str, verify: str) -> float:
    """Rows per second of one epoch, start-up included, under `read.verify: verify`."""
    started = time.perf_counter()
    read = ReadConfig(verify=verify)  # type: ignore[arg-type]
    stream = ShardStream(root, "train", LoaderConfig(batch_size=BATCH), seed=0, read=read)
    rows = sum(len(batch["id"]) for batch in stream)
    return rows / (time.perf_counter() - started)


def verify_report(root: str, args: argparse.Namespace) -> dict[str, float]:
    """Print and return the best rows/s of each mode of `--verify` (none: nothing)."""
    best = dict.fromkeys(args.verify.split(",") if args.verify else [], 0.0)
    if not best:
        return best
    for _ in range(args.repeat):
        for mode in best:
            best[mode] = max(best[mode], epoch_rows_per_s(root, mode))
    base = best.get("size") or next(iter(best.values()))
    print(f"\n{'read.verify':12} {'rows/s':>12} {'vs size':>8}")
    for mode, rate in best.items():
        print(f"{mode:12} {rate:12,.0f} {rate / base:8.0%}")
    return best
