"""The floors of a reshard that `reshard_bench.py` measures ballast against: how each runs
(child side) and ballast's ratios to them (parent side).

- `floor` (single pass, benchmarks/RESULTS.md M17): every input row group decoded once
  and encoded once with ballast's shard writer settings (`parquet_options`, page
  checksums); nothing is staged, shuffled or written. No reshard can cost less.
- `floor-two-pass` (RESULTS.md M32): what any exchange that keeps memory bounded must do
  at least, once per row and with nothing else: pass 1 decodes every row group and
  writes its rows once to a local Arrow IPC file; pass 2 reads each file back
  (memory-mapped), encodes it once through ballast's shard writer (`write_shard`: the same
  settings, the shard file written, its sha256 taken) into the output directory. Rows
  are neither routed nor reordered, and each row group is one shard.
- `floor-shuffle`: the two-pass floor with a global shuffle, the least a reshard's
  exchange does: pass 1 sends each row of a row group to one of the job's shards at random
  and writes the row group's rows grouped by shard (one `take`) to a local Arrow IPC file;
  pass 2 gathers one shard's rows from every staged file (memory-mapped), puts them in a
  random order (one `take`) and writes the shard as the two-pass floor does. Nothing is
  scanned, counted, sampled or checksummed; a process holds one row group or one shard
  (its RSS also counts the staged pages it maps).

Each runs FLOOR_PROCESSES processes at a time, the cores ballast's two Dask workers use,
and returns its wall time and the CPU seconds its work took (`cpu_s`). None removes its
staged files inside its timing, where ballast removes its staging before it returns.
"""

from __future__ import annotations

import time
import zlib
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
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


def staging_layout(
    job: dict[str, Any], num_shards: int | None
) -> tuple[list[tuple[str, int]], list[str], list[str]]:
    """A two-pass floor's row groups, its staged file per row group (in `<output>/_staging`,
    made here) and its shard files in `<output>`: `num_shards`, or one per row group."""
    groups = row_groups(job["input"])
    staging = Path(job["output"]) / "_staging"
    staging.mkdir(parents=True)
    staged = [str(staging / f"part-{index:05d}.arrow") for index in range(len(groups))]
    count = len(groups) if num_shards is None else num_shards
    shards = [f"{job['output']}/shard-{index:05d}.parquet" for index in range(count)]
    return groups, staged, shards


def run_two_pass_floor(job: dict[str, Any]) -> dict[str, Any]:
    """The two-pass floor: stage every row group once, then write each as one shard (the
    staged files go in `<output>/_staging`, the shards in `<output>`)."""
    groups, staged, shards = staging_layout(job, None)
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


def stage_shuffled(path: str, group: int, staged: str, num_shards: int) -> tuple[float, list[int]]:
    """Pass 1 of the shuffle floor: decode one row group, send each row to a random shard,
    write the rows grouped by shard to an IPC file; CPU-s and each shard's [start, stop)
    bounds in the file."""
    start = time.process_time()
    table = pq.ParquetFile(path).read_row_group(group)
    rng = np.random.default_rng(zlib.crc32(f"{path}:{group}".encode()))
    # The smallest integer type that holds every shard: numpy's stable sort is a radix
    # sort on 8- and 16-bit keys.
    shard = rng.integers(0, num_shards, table.num_rows).astype(np.min_scalar_type(num_shards))
    order = np.argsort(shard, kind="stable")
    bounds = np.searchsorted(shard[order], np.arange(num_shards + 1)).tolist()
    taken = table.take(pa.array(order))
    with pa.OSFile(staged, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(taken, max_chunksize=max(taken.num_rows, 1))
    return time.process_time() - start, bounds


def write_shuffled(ranges: list[tuple[str, int, int]], shard: str, row_group_rows: int) -> float:
    """Pass 2: one shard's rows ((staged file, start, stop) each), read back mapped, in a
    random order, written as a ballast shard; CPU-s."""
    from preprocessing.contract.shards import write_shard

    start = time.process_time()
    with ExitStack() as maps:  # the batches point into the maps until the shard is written
        batches = [
            pa.ipc.open_file(maps.enter_context(pa.memory_map(staged))).get_batch(0)
            for staged, _, _ in ranges
        ]
        table = pa.Table.from_batches(
            [
                batch.slice(first, stop - first)
                for batch, (_, first, stop) in zip(batches, ranges, strict=True)
            ]
        )
        order = np.random.default_rng(zlib.crc32(shard.encode())).permutation(table.num_rows)
        write_shard(
            shard, table.take(pa.array(order)).combine_chunks(), row_group_rows, LABEL, SOURCE
        )
    return time.process_time() - start


def run_shuffle_floor(job: dict[str, Any]) -> dict[str, Any]:
    """The shuffle floor: every row group staged once with its rows grouped by random
    shard, then each of the job's shards gathered, shuffled and written."""
    groups, staged, shards = staging_layout(job, job["num_shards"])
    start = time.perf_counter()
    with ProcessPoolExecutor(FLOOR_PROCESSES) as pool:  # one pool: both passes, as ballast's
        first = list(
            pool.map(
                stage_shuffled,
                [path for path, _ in groups],
                [group for _, group in groups],
                staged,
                [len(shards)] * len(groups),
            )
        )
        staged_s = time.perf_counter() - start
        ranges = [
            [
                (path, bounds[shard], bounds[shard + 1])
                for path, (_, bounds) in zip(staged, first, strict=True)
            ]
            for shard in range(len(shards))
        ]
        cpu = sum(cpu_s for cpu_s, _ in first)
        cpu += sum(pool.map(write_shuffled, ranges, shards, [job["row_group_rows"]] * len(shards)))
    return {"wall_s": time.perf_counter() - start, "cpu_s": cpu, "stage_s": staged_s}


# The standing target against a floor (issue 34: at 8 GB, where start-up is amortised);
# the single-pass floor's 1.5x was retired with the exchange's floor decision.
FLOOR_TARGETS = {"floor-two-pass": 1.25}
FLOORS = ("floor", "floor-two-pass", "floor-shuffle")


def floor_checks(rows: list[dict[str, Any]]) -> list[tuple[str, bool, str]]:
    """ballast `stratified` against each floor with a target: its wall time to the
    floor's, and its process tree's CPU seconds to the floor's work CPU seconds."""
    ratios = floor_ratios(rows)
    return [
        (f"stratified {kind} <= {target}x {tool} (a target at 8 GB)", ratio <= target, detail)
        for tool, target in FLOOR_TARGETS.items()
        for kind, (ratio, detail) in ratios.get(tool, {}).items()
    ]


def floor_ratios(rows: list[dict[str, Any]]) -> dict[str, dict[str, tuple[float, str]]]:
    """Per floor measured: ballast `stratified`'s wall and CPU ratios to it, with the
    figures (the floor's CPU is its work's; its own tree CPU, pool start included, is in
    the table)."""
    by_tool = {row["tool"]: row for row in rows if "error" not in row}
    ballast, ratios = by_tool["ballast-stratified"], {}
    for tool in (tool for tool in FLOORS if tool in by_tool):
        floor = by_tool[tool]
        wall, cpu = ballast["wall_s"] / floor["wall_s"], ballast["tree_cpu_s"] / floor["cpu_s"]
        ratios[tool] = {
            "wall": (wall, f"{wall:.2f}x ({ballast['wall_s']:.1f} s vs {floor['wall_s']:.1f} s)"),
            "CPU-s": (cpu, f"{cpu:.2f}x ({ballast['tree_cpu_s']:.1f} vs {floor['cpu_s']:.1f})"),
        }
    return ratios


def format_floor_ratios(rows: list[dict[str, Any]]) -> str:
    """ballast `stratified`'s wall and CPU ratios to every floor measured."""
    if not any(row["tool"] == "ballast-stratified" and "error" not in row for row in rows):
        return ""
    return "\n".join(
        f"stratified / {tool}: wall {kinds['wall'][1]}, CPU {kinds['CPU-s'][1]}"
        for tool, kinds in floor_ratios(rows).items()
    )
