"""The dataframe engines users pick for a shuffle-and-reshard, as peers in
`benchmarks/reshard_bench.py` (the `peers` extra: pip install -c constraints.txt -e '.[peers]').

Each one shuffles every row by sorting on a random key, the way these engines' users do it,
and writes about `num_shards` zstd files of equal row counts:

- `polars-sort`: `scan_parquet` -> random key -> sort, collected by the in-memory engine,
  then written as `num_shards` slices of `shard_rows` rows;
- `polars-streaming-sort`: the same plan sunk by the streaming engine into files of at most
  `shard_rows` rows (`PartitionBy(max_rows_per_file=...)`); Polars 2.1 runs this sort as
  a streaming node, not an in-memory fallback (`show_graph(engine="streaming")` marks it
  "potentially memory-intensive");
- `daft-sort`: Daft's native runner, `read_parquet` -> random key -> sort -> `write_parquet`
  partitioned by the key's top bits (a hive `shard=N/` directory per shard): the native
  runner ignores `into_partitions`, and its own splitting by target file size gave 24 files
  of 1,182..21,825 rows where 6,764 were due (0.05 GB input).

The random key is a seeded hash of the row index in Polars (a random number column is not
an expression there) and `random_int` in Daft.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

# Daft's shard number is the random key's top bits: keys span num_shards * 2**SHARD_BITS.
SHARD_BITS = 40
PEERS = {"polars-sort": "polars", "polars-streaming-sort": "polars", "daft-sort": "daft"}


def run_polars(job: dict[str, Any], streaming: bool) -> dict[str, Any]:
    """Polars: random key, sort, write; in memory or with the streaming engine."""
    import polars as pl

    start = time.perf_counter()
    shuffled = (
        pl.scan_parquet(f"{job['input']}/*.parquet")
        .with_row_index("_key")
        .with_columns(pl.col("_key").hash(seed=0))
        .sort("_key")
        .drop("_key")
    )
    options = {"compression": "zstd", "row_group_size": job["row_group_rows"]}
    if streaming:
        target = pl.PartitionBy(job["output"], max_rows_per_file=job["shard_rows"])
        shuffled.sink_parquet(target, engine="streaming", mkdir=True, **options)
    else:
        frame = shuffled.collect(engine="in-memory")
        Path(job["output"]).mkdir(parents=True)
        for index, offset in enumerate(range(0, frame.height, job["shard_rows"])):
            shard = frame.slice(offset, job["shard_rows"])
            shard.write_parquet(f"{job['output']}/part-{index:05d}.parquet", **options)
    return {"wall_s": time.perf_counter() - start}


def run_daft(job: dict[str, Any]) -> dict[str, Any]:
    """Daft's native runner: random key, sort, write one hive partition per shard."""
    import daft

    daft.set_runner_native()
    daft.set_execution_config(parquet_target_row_group_size=row_group_bytes(job))
    span = 2**SHARD_BITS
    start = time.perf_counter()
    frame = (
        daft.read_parquet(f"{job['input']}/*.parquet")
        .with_column("_key", daft.functions.random_int(0, job["num_shards"] * span - 1, seed=0))
        .sort("_key")
        .with_column("shard", daft.col("_key") // span)
        .exclude("_key")
    )
    frame.write_parquet(job["output"], compression="zstd", partition_cols=["shard"])
    return {"wall_s": time.perf_counter() - start}


def row_group_bytes(job: dict[str, Any]) -> int:
    """Daft sizes row groups in bytes: `row_group_rows` rows at the input's uncompressed
    bytes per row (from the first file's footer)."""
    meta = pq.ParquetFile(next(Path(job["input"]).glob("*.parquet"))).metadata
    size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
    return max(1, size // max(1, meta.num_rows)) * job["row_group_rows"]


def run_peer(tool: str, job: dict[str, Any]) -> dict[str, Any]:
    """Child side: run one of this module's tools on one job."""
    if tool == "daft-sort":
        return run_daft(job)
    return run_polars(job, streaming=tool == "polars-streaming-sort")
