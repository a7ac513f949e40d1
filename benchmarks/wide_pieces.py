"""The small wide loader's own costs, piece by piece, in CPU-ms, beside pyarrow's direct read.

For the code on PYTHONPATH (run it once per tree, alternating trees, for an A/B: every call
it makes exists in the last release's code too) on a version already made by
benchmarks/wide_case.py:

- `open`: the manifest read and checked, and the feature codec built from it (what the
  loader does before its first read; `Columns.from_manifest(read_manifest(root))`), the
  garbage collector paused as the loader pauses it;
- `decode`: every train row group, read once beforehand, encoded by a fresh codec (its
  plan included), as the loader decodes them;
- the loader: one epoch (a fresh `ShardStream`, default read-ahead, one rank), its rows
  per second and per CPU-second (this process, every thread), the first batch included;
- pyarrow's direct reader: `pq.ParquetFile(shard).read(columns=...)` to one matrix by
  `to_pandas().to_numpy()` (benchmarks/wide_case.py's fastest user idiom).

For the A/B, copy this file into each tree's benchmarks/ and run it there: it puts its own
tree first on the path, as the other benchmarks do.

Loader and direct reads alternate `--rounds` times; medians are printed with their spread
(min-max). CPU-ms figures move less than wall on a shared host.

    .venv/bin/python benchmarks/wide_pieces.py \
        /tmp/wide-bench/wide-3000x5000-float32-3files --batch-size 1000
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import gc
import statistics
import time
from collections.abc import Callable

import pyarrow.parquet as pq
import torch  # noqa: F401  (loaded, as in a trainer's process: its allocator and threads)

from preprocessing.contract.codec import FeatureCodec
from preprocessing.contract.manifest import read_manifest, shard_uri
from training.config import LoaderConfig
from training.data.loader import ShardStream
from training.data.shards import Columns


def timed(step: Callable[[], int]) -> tuple[int, float, float]:
    """`step()`'s result, wall seconds and CPU seconds (this process, every thread)."""
    started, cpu = time.perf_counter(), time.process_time()
    result = step()
    return result, time.perf_counter() - started, time.process_time() - cpu


def shard_files(root: str) -> list[str]:
    manifest, location = read_manifest(root)
    return [shard_uri(location, entry) for entry in manifest.split("train").shards]


def direct_rows(files: list[str], skip: tuple[str, ...] = ("id", "label", "source")) -> int:
    """benchmarks/wide_case.py's `pyarrow_file_rows`, here so that this file runs on the
    last release's tree too (its wide_case.py has no direct reader)."""
    tables = (pq.ParquetFile(file) for file in files)
    return sum(
        len(
            table.read(columns=[n for n in table.schema_arrow.names if n not in skip])
            .to_pandas()
            .to_numpy()
        )
        for table in tables
    )


def open_columns(root: str) -> int:
    """The manifest read and the codec built, the garbage collector paused as the loader
    pauses it (`open_split`): a full collection that falls here walks every object the
    process holds (100+ CPU-ms with torch loaded), which is the process's cost, not the
    code's."""
    gc.disable()
    try:
        return len(Columns.from_manifest(read_manifest(root)[0]).codec.columns)
    finally:
        gc.enable()


def decode_all(root: str) -> Callable[[], int]:
    """A step that encodes every train row group (read here, once) by a fresh codec."""
    columns = Columns.from_manifest(read_manifest(root)[0])
    tables = [
        parquet.read_row_group(group, columns=columns.codec.names)
        for parquet in map(pq.ParquetFile, shard_files(root))
        for group in range(parquet.num_row_groups)
    ]

    def step() -> int:
        codec = FeatureCodec(columns.codec.columns)
        return sum(len(codec.encode(table)) for table in tables)

    return step


def loader_epoch(root: str, batch_size: int, remainder: str) -> int:
    config = LoaderConfig(batch_size=batch_size, remainder=remainder)
    stream = ShardStream(root, "train", config, seed=0)
    return sum(int((batch["weight"] > 0).sum()) for batch in stream.iterate(rank_world=(0, 1)))


def summary(values: list[float], digits: int = 1) -> str:
    low, middle, high = min(values), statistics.median(values), max(values)
    return f"{middle:9,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", help="a version made by benchmarks/wide_case.py")
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--remainder", choices=["drop", "pad"], default="drop")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    files, decode = shard_files(args.root), decode_all(args.root)
    runs: dict[str, list[tuple[int, float, float]]] = {}
    steps = {
        "open": lambda: open_columns(args.root),
        "decode": decode,
        "loader": lambda: loader_epoch(args.root, args.batch_size, args.remainder),
        "direct": lambda: direct_rows(files),
    }
    for step in steps.values():  # warm: imports, page cache
        step()
    for _ in range(args.rounds):
        for name, step in steps.items():
            runs.setdefault(name, []).append(timed(step))
    for name in ("open", "decode"):
        print(f"  {name:8} CPU-ms {summary([cpu * 1e3 for _, _, cpu in runs[name]])}")
    for name in ("loader", "direct"):
        rates = [(rows / wall, rows / cpu) for rows, wall, cpu in runs[name]]
        print(
            f"  {name:8} rows/s {summary([r for r, _ in rates])}"
            f"  rows/CPU-s {summary([c for _, c in rates])}"
        )
    pairs = list(zip(runs["loader"], runs["direct"], strict=True))
    wall = [d[1] / lo[1] * lo[0] / d[0] for lo, d in pairs]  # loader rows/s over direct's
    cpu = [d[2] / lo[2] * lo[0] / d[0] for lo, d in pairs]
    print(
        f"  loader / direct, a round each: rows/s {summary(wall, 2)}  rows/CPU-s {summary(cpu, 2)}"
    )


if __name__ == "__main__":
    main()
