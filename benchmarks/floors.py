"""The floors of a reshard that `reshard_bench.py` measures ballast against, child side.

- `floor` (single pass, benchmarks/RESULTS.md M17): every input row group decoded once
  and encoded once with ballast's shard writer settings (`parquet_options`, page
  checksums); nothing is staged, shuffled or written. No reshard can cost less.
- `floor-two-pass` (RESULTS.md M32): what any exchange that keeps memory bounded must do
  at least, once per row and with nothing else: pass 1 decodes every row group and
  writes its rows once to a local Arrow IPC file; pass 2 reads each file back
  (memory-mapped), encodes it once through ballast's shard writer (`write_shard`: the same
  settings, the shard file written, its sha256 taken) into the output directory. Rows
  are neither routed nor reordered, and each row group is one shard.

Both run FLOOR_PROCESSES processes at a time, the cores ballast's two Dask workers use,
and return their wall time and the CPU seconds their work took (`cpu_s`).
"""

from __future__ import annotations

import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

FLOOR_PROCESSES = 2
LABEL, SOURCE = "label", "source"  # ballast's label and source columns on this input


def row_groups(input_dir: str) -> list[tuple[str, int]]:
    """(file, row group) of every row group of the input, in file order."""
    return [
        (str(path), group)
        for path in sorted(Path(input_dir).glob("*.parquet"))
        for group in range(pq.ParquetFile(path).num_row_groups)
    ]


def encode_row_group(path: str, group: int, row_group_rows: int) -> float:
    """Decode one row group and encode it in memory as a ballast shard is encoded; CPU-s."""
    from preprocessing.contract.shards import parquet_options

    start = time.process_time()
    table = pq.ParquetFile(path).read_row_group(group)
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(
        sink, table.schema, **parquet_options(table.schema, [LABEL, SOURCE])
    ) as writer:
        writer.write_table(table, row_group_size=row_group_rows)
    return time.process_time() - start


def stage_row_group(path: str, group: int, staged: str) -> float:
    """Pass 1 of the two-pass floor: decode one row group, write it to an IPC file; CPU-s."""
    start = time.process_time()
    table = pq.ParquetFile(path).read_row_group(group)
    with pa.OSFile(staged, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return time.process_time() - start


def write_staged(staged: str, shard: str, row_group_rows: int) -> float:
    """Pass 2: read one IPC file back (mapped) and write it as a ballast shard; CPU-s."""
    from preprocessing.contract.shards import write_shard

    start = time.process_time()
    with pa.memory_map(staged) as source:
        table = pa.ipc.open_stream(source).read_all()
        write_shard(shard, table, row_group_rows, LABEL, SOURCE)
    return time.process_time() - start


def run_floor(job: dict[str, Any]) -> dict[str, Any]:
    """The single-pass floor: every row group decoded and encoded once."""
    groups = row_groups(job["input"])
    start = time.perf_counter()
    with ProcessPoolExecutor(FLOOR_PROCESSES) as pool:
        cpu = sum(
            pool.map(
                encode_row_group,
                [path for path, _ in groups],
                [group for _, group in groups],
                [job["row_group_rows"]] * len(groups),
            )
        )
    return {"wall_s": time.perf_counter() - start, "cpu_s": cpu}


def run_two_pass_floor(job: dict[str, Any]) -> dict[str, Any]:
    """The two-pass floor: stage every row group once, then write each as one shard (the
    staged files go in `<output>/_staging`, the shards in `<output>`)."""
    groups = row_groups(job["input"])
    staging = Path(job["output"]) / "_staging"
    staging.mkdir(parents=True)
    staged = [str(staging / f"part-{index:05d}.arrow") for index in range(len(groups))]
    shards = [f"{job['output']}/shard-{index:05d}.parquet" for index in range(len(groups))]
    start = time.perf_counter()
    with ProcessPoolExecutor(FLOOR_PROCESSES) as pool:  # one pool: both passes, as ballast's
        cpu = sum(
            pool.map(
                stage_row_group,
                [path for path, _ in groups],
                [group for _, group in groups],
                staged,
            )
        )
        staged_s = time.perf_counter() - start
        cpu += sum(pool.map(write_staged, staged, shards, [job["row_group_rows"]] * len(groups)))
    return {"wall_s": time.perf_counter() - start, "cpu_s": cpu, "stage_s": staged_s}
