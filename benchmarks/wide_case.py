"""The loader benchmark's wide case: 5,000 scalar feature columns, loader against pyarrow.

One version of `num_rows` rows of `num_columns` float64 columns (standard normal, no
nulls, standardized by the reshard as usual), resharded by `run_reshard` into shards of
8,192 rows in row groups of 2,048. Read twice over the train split, best of `repeat`:

- pyarrow: for each shard, `pq.read_table(shard, columns=<features>)` and the features
  to one numpy matrix (`np.stack` of each column's `to_numpy()`): what a user would write,
  with no shuffle, no standardization and no tensors (one rank's share at one rank);
- the training loader (one rank, 0 workers, default read-ahead, 1024-row batches).

Rows per CPU-second (this process, every thread) are printed beside rows/s: on a shared
machine they move less.

The target (issue 38): the loader serves at least 0.8x pyarrow's rows per second.

    .venv/bin/python benchmarks/wide_case.py --rows 16384 --work-dir /tmp/wide-bench
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import read_manifest, shard_uri
from preprocessing.driver.reshard import run_reshard
from training.config import LoaderConfig
from training.data.loader import ShardStream

BATCH, NUM_FILES = 1024, 4


def write_raw(raw: Path, num_rows: int, num_columns: int) -> None:
    """`NUM_FILES` raw files: ids, 4 classes, `num_columns` float64 features."""
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    per_file = num_rows // NUM_FILES
    for index in range(NUM_FILES):
        values = rng.normal(size=(num_columns, per_file))
        columns = {
            "id": pa.array(np.arange(index * per_file, (index + 1) * per_file)),
            "label": pa.array(rng.integers(0, 4, per_file)),
            **{f"x{k}": pa.array(values[k]) for k in range(num_columns)},
        }
        pq.write_table(pa.table(columns), raw / f"part-{index}.parquet")


def prepare(work: Path, num_rows: int, num_columns: int) -> str:
    """A committed wide version (reused from `work` when there)."""
    raw = work / f"wide-raw-{num_rows}x{num_columns}"
    if not raw.exists():
        write_raw(raw, num_rows, num_columns)
    config = ReshardConfig(
        dataset=DatasetSpec(
            inputs=[str(raw)],
            id_column="id",
            source_column=None,
            feature_columns=[f"x{k}" for k in range(num_columns)],
        ),
        output_root=str(work / f"wide-{num_rows}x{num_columns}"),
        target_shard_rows=8_192,
        rows_per_row_group=2_048,
        holdout_fraction=0.0,
        num_workers=2,
    )
    return run_reshard(config).manifest_uri


def pyarrow_rows(root: str) -> int:
    """pq.read_table of every train shard plus its features as one matrix; the rows."""
    manifest, location = read_manifest(root)
    names, rows = manifest.feature_columns, 0
    for entry in manifest.split("train").shards:
        table = pq.read_table(shard_uri(location, entry), columns=names)
        rows += len(np.stack([column.to_numpy() for column in table.columns], axis=1))
    return rows


def loader_rows(root: str, batch_size: int = BATCH) -> int:
    """One epoch of the training loader over the train split; the rows."""
    stream = ShardStream(root, "train", LoaderConfig(batch_size=batch_size), seed=0)
    return sum(len(batch["label"]) for batch in stream.iterate(rank_world=(0, 1)))


def rates(read: Callable[[str], int], root: str) -> tuple[float, float]:
    """Rows per second and per CPU-second (this process, all threads) of `read`."""
    started, cpu = time.perf_counter(), time.process_time()
    rows = read(root)
    seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    return rows / max(seconds, 1e-9), rows / max(cpu_s, 1e-9)


def wide_report(
    work: Path, num_rows: int, num_columns: int, repeat: int, batch_size: int = BATCH
) -> float:
    """Print both readers' rows/s and rows/CPU-s (best of `repeat`, alternating); the
    loader's share of pyarrow's rows/s."""
    root = prepare(work, num_rows, num_columns)
    plain, ours = (0.0, 0.0), (0.0, 0.0)
    for _ in range(repeat):
        plain = max(plain, rates(pyarrow_rows, root))
        ours = max(ours, rates(lambda uri: loader_rows(uri, batch_size), root))
    print(f"wide case, {num_rows:,} rows x {num_columns:,} float64 feature columns:")
    for name, (per_s, per_cpu_s) in (
        ("pyarrow read_table + to numpy", plain),
        ("training loader", ours),
    ):
        print(f"  {name:30} {per_s:8,.0f} rows/s {per_cpu_s:8,.0f} rows/CPU-s")
    print(
        f"  loader / pyarrow: {ours[0] / plain[0]:.2f}x rows/s, "
        f"{ours[1] / plain[1]:.2f}x rows/CPU-s"
    )
    return ours[0] / plain[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=16_384)
    parser.add_argument("--columns", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=BATCH)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/wide-bench"))
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    wide_report(args.work_dir, args.rows, args.columns, args.repeat, args.batch_size)


if __name__ == "__main__":
    main()
