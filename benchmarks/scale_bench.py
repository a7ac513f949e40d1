"""Scale benchmark of the exchange: many pieces, bookkeeping at PB shapes, sizes, S3 requests.

- `pieces` (a): 5,000 Parquet files of 2,000 small rows (id, label of 16 long-tailed
  classes, source of 3, 4 float32 features) resharded, stratified, into 2,000 shards of
  5,000 rows, against pyarrow `write_dataset` on the same input: wall and CPU seconds,
  driver and per-worker peak RSS (`--pieces-peers`: the other tools of
  `reshard_bench.py` on the same input). Target: within 2.5x pyarrow's time, driver
  under 1 GB.
  Measured (2 cores, quiet host, `--repeat 2`): 2.64x (16.9 s against 6.4 s; 31.9
  against 11.6 CPU-s), missed; driver 0.17 GB, met (benchmarks/RESULTS.md M18, M31).
- `bookkeeping` (b): the driver's work without row data, at `--bookkeeping` shapes
  (pieces x shards, default 1e5 x 1e4 and 1e6 x 1e5): synthetic scans (one piece per
  file, 4 of 16 classes per piece, train and holdout), the plan, the exchange layout, and
  every task's descriptor of every round made and pickled as `run_in_waves` would send
  it, with results standing in for the tasks'. Peak RSS and seconds per phase. Target
  at 1e6 x 1e5: under 2 GB and 120 s. Measured (load 6-7): 1.81-1.82 GB, 66-78 s, met
  (quiet host: 1.79 GB, 38 s); 1e5 x 1e4: 0.29 GB, 7.6 s (benchmarks/RESULTS.md M28).
- `sizes` (c): ballast stratified at each of `--sizes` (default 1, 4 and 16 GB) with the
  same rows per shard: seconds and CPU-s per GB, worker and driver RSS and the disk used at
  peak, printed per size as it ends. Target: seconds per GB and worker RSS flat within 15%.
  A new size needs about 3.2x its bytes of free disk (input, staged objects, shards: 3.2x
  measured at 2 GB) and the inputs of the sizes before stay, so `--sizes 1 2 4 8 16` needs
  about 66 GB on an empty work directory; a size that does not fit is skipped, said so.
  Measured (quiet host): 11.1, 9.3 and 10.2 s/GB at 1, 4 and 8 GB, worker RSS 0.74, 0.73
  and 0.75 GB, met; at load 10-30: 1 and 2 GB worker RSS 0.64 and 0.59 GB (RESULTS.md M32).
- `s3` (d): a reshard from S3 to S3 on moto's server, every request counted
  (`tests/preprocessing/s3_requests.py`): requests per GB, median bytes per request,
  multipart uploads (objects of 2 x `upload_part_bytes` and more; none at the default
  64 MiB on this data), and the bound 2 (P + S) F R + 64 (P pieces, S shards, F fan-in,
  R read rounds).

Each case prints its figures and [PASS] / [FAIL] lines. The machine may be shared: compare
within one run, use `--repeat` for (a) (best against best, as `reshard_bench.py` does), and
see the CPU seconds, which load stretches far less than wall time.

    .venv/bin/python benchmarks/scale_bench.py --cases pieces bookkeeping sizes s3
    .venv/bin/python benchmarks/scale_bench.py --cases bookkeeping --bookkeeping 100000x10000
    .venv/bin/python benchmarks/scale_bench.py --cases sizes --sizes 1 2 4 8 16 \
        --work-dir /tmp/ballast-bench
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python benchmarks/NAME.py` puts benchmarks/ first on sys.path, `python -m benchmarks.NAME`
# the working directory: either way the repository root goes first, for `benchmarks.*` and
# for ballast itself in a clone without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import pickle
import shutil
import statistics
import time
from itertools import pairwise
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.plan_bench import DiskSampler, RssSampler
from benchmarks.reshard_bench import (
    GB,
    TOOLS,
    base_job,
    best_of,
    dir_bytes,
    format_table,
    prepare,
    run_tool,
    skip_optional_peers,
    warm_up,
)
from preprocessing.synthetic.tabular import class_probabilities

SMALL_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("label", pa.int64()),
        ("source", pa.string()),
        ("features", pa.list_(pa.float32(), 4)),
    ]
)
NUM_CLASSES, NUM_SOURCES = 16, 3
MARKER = "_GENERATED.json"


# ---------------------------------------------------------------- (a) many pieces


def ensure_small_files(directory: Path, num_files: int, rows_per_file: int, seed: int) -> Path:
    """`num_files` files of `rows_per_file` rows, one source each (marker: skip if there)."""
    spec = {"num_files": num_files, "rows_per_file": rows_per_file, "seed": seed}
    marker = directory / MARKER
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    probabilities = class_probabilities(NUM_CLASSES, 50.0)
    for index in range(num_files):
        labels = rng.choice(NUM_CLASSES, rows_per_file, p=probabilities)
        features = rng.standard_normal((rows_per_file, 4), dtype=np.float32)
        table = pa.table(
            [
                pa.array(np.arange(index * rows_per_file, (index + 1) * rows_per_file)),
                pa.array(labels),
                pa.array([f"source-{index % NUM_SOURCES}"] * rows_per_file),
                pa.FixedSizeListArray.from_arrays(pa.array(features.reshape(-1)), 4),
            ],
            schema=SMALL_SCHEMA,
        )
        pq.write_table(table, directory / f"part-{index:05d}.parquet")
    marker.write_text(json.dumps(spec))
    return directory


def case_pieces(args: argparse.Namespace) -> None:
    raw = ensure_small_files(
        Path(args.work_dir) / "raw-pieces", args.files, args.rows_per_file, args.seed
    )
    num_rows = args.files * args.rows_per_file
    job = {
        "num_rows": num_rows,
        "shard_rows": args.shard_rows,
        "num_shards": -(-num_rows // args.shard_rows),
        "row_group_rows": 8_192,
        "holdout_fraction": 0.0,
    }
    print(
        f"(a) {args.files:,} files x {args.rows_per_file:,} rows, "
        f"{dir_bytes(raw) / GB:.3f} GB, into {job['num_shards']:,} shards",
        flush=True,
    )
    tools = ("ballast-stratified", "pyarrow-write_dataset", *args.pieces_peers)
    runs: dict[str, list[dict[str, Any]]] = {tool: [] for tool in tools}
    for _ in range(args.repeat):  # round robin, so load drifts hit both tools alike
        for tool in tools:
            runs[tool].append(
                run_tool(tool, raw, Path(args.work_dir), job, keep=False, schema=SMALL_SCHEMA)
            )
    rows = [best_of(runs[tool]) for tool in tools]
    print(format_table(rows))
    for tool in tools:
        print(f"    {tool} wall s of every run: {[run.get('wall_s') for run in runs[tool]]}")
    ballast, copy = rows[:2]
    if "error" not in ballast:
        report(
            "(a) ballast within 2.5x pyarrow write_dataset",
            ballast["wall_s"] <= 2.5 * copy["wall_s"],
            f"{ballast['wall_s'] / copy['wall_s']:.2f}x",
        )
        check = pieces_memory_check(ballast, rows)
        if check:
            report(*check)
        else:  # on threads, and no Polars beside it: a figure, not a verdict
            print(f"    ballast peak RSS on threads: {ballast['peak_total'] / GB:.2f} GB")
        print(f"    ballast stages: {ballast['timings_s']}")


def pieces_memory_check(
    ballast: dict[str, Any], rows: list[dict[str, Any]]
) -> tuple[str, bool, str] | None:
    """On worker processes the driver holds only bookkeeping: under 1 GB. On threads (a
    small input: no worker process) it holds the rows too, so the bound is the issue's:
    at most Polars streaming's peak, when it ran beside (None when it did not)."""
    if ballast["peak_worker"]:
        driver = ballast["peak_driver"]
        return "(a) driver RSS under 1 GB", driver < GB, f"{driver / GB:.2f} GB"
    polars = [r for r in rows if r["tool"] == "polars-streaming-sort" and "error" not in r]
    if not polars:
        return None
    peak, bound = ballast["peak_total"], polars[0]["peak_total"]
    name = "(a) peak RSS on threads <= Polars streaming's"
    return name, peak <= bound, f"{peak / GB:.2f} GB vs {bound / GB:.2f} GB"


# ---------------------------------------------------------------- (b) bookkeeping


def synthetic_scans(
    num_pieces: int, rows_per_piece: int, piece_bytes: int, strata_per_piece: int, seed: int
) -> list[Any]:
    """What a scan of `num_pieces` single-piece files would return: each file's counts
    its own small table, as they arrive from the workers."""
    from preprocessing.plan.counts import COUNT_DTYPE, Counts
    from preprocessing.scan.inputs import FileScan, InputFile

    rng = np.random.default_rng(seed)
    first = rng.integers(0, NUM_CLASSES, num_pieces)
    held = max(1, rows_per_piece // 10 // strata_per_piece)
    template = np.zeros(2 * strata_per_piece, dtype=COUNT_DTYPE)
    template["split"] = [0, 1] * strata_per_piece  # train, holdout
    template["label"] = np.repeat(np.arange(strata_per_piece), 2)
    template["num_rows"] = [rows_per_piece // strata_per_piece - held, held] * strata_per_piece
    scans = []
    for piece in range(num_pieces):
        labels = tuple(int(first[piece] + step) % NUM_CLASSES for step in range(strata_per_piece))
        counts = Counts(template.tobytes(), labels, (f"source-{piece % NUM_SOURCES}",))
        uri = f"s3://bucket/raw/part-{piece:07d}.parquet"
        scans.append(
            FileScan(
                InputFile(uri, "s3://bucket/raw", uri[19:], piece_bytes, "tag"),
                None,
                [rows_per_piece],
                counts,
            )
        )
    return scans


def case_bookkeeping(args: argparse.Namespace) -> None:
    for shape in args.bookkeeping:
        num_pieces, num_shards = (int(float(part)) for part in shape.split("x"))
        print(f"\n(b) bookkeeping at {num_pieces:,} pieces x {num_shards:,} shards", flush=True)
        start = time.perf_counter()
        with RssSampler() as sampler:
            bookkeeping(num_pieces, num_shards, args, sampler)
        wall = time.perf_counter() - start
        peak = max_rss_bytes()
        print(f"    whole: {wall:.1f} s, process peak RSS {peak / GB:.2f} GB")
        if num_pieces >= 1_000_000:
            report(
                "(b) under 2 GB and 120 s at 1e6 x 1e5",
                peak < 2 * GB and wall < 120,
                f"{peak / GB:.2f} GB, {wall:.0f} s",
            )


def bookkeeping(
    num_pieces: int, num_shards: int, args: argparse.Namespace, sampler: RssSampler
) -> None:
    """Plan, layout and every descriptor of every round, as the driver makes them."""
    from preprocessing.config import DatasetSpec, ReshardConfig
    from preprocessing.driver import reshard
    from preprocessing.exchange import tasks as exchange

    rows_per_piece = 10_000
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=["s3://bucket/raw"], id_column="id"),
        output_root="s3://bucket/out",
        target_shard_rows=num_pieces * rows_per_piece // num_shards,
    )
    with sampler.phase("synthetic scans"):
        scans = synthetic_scans(num_pieces, rows_per_piece, args.piece_mb << 20, 4, args.seed)
    with sampler.phase("plan (count records, plan both splits)"):
        plans, pieces = reshard._plan(scans, config)
    with sampler.phase("exchange layout"):
        destinations = exchange.destinations_for(plans, SMALL_SCHEMA)
        layout = exchange.exchange_layout(scans, plans, pieces, config, threads=2)
        staging = exchange.Staging(
            "s3://bucket/out/_staging/0123456789abcdef", layout, destinations.schema
        )
    print(
        f"    {layout.num_map_tasks:,} map tasks, {destinations.count:,} destinations, "
        f"fan-in {layout.fan_in}, {layout.num_read_rounds} read rounds, tasks per round "
        f"{[r.num_objects for r in layout.rounds]}; shared once per worker: plans "
        f"{sum_pickled([destinations]) / 1e6:.1f} MB, layout "
        f"{sum_pickled([staging]) / 1e6:.1f} MB",
        flush=True,
    )
    with sampler.phase("map descriptors"):
        first_rows = exchange.piece_rows(scans, pieces)[0]
        sent = [
            sum_pickled(
                exchange.map_task(scans, plans, pieces, first_rows, staging, task)
                for task in range(layout.num_map_tasks)
            )
        ]
    for index in range(1, len(layout.rounds)):
        with sampler.phase(f"merge round {index} descriptors"):
            sent.append(
                sum_pickled((index, task) for task in range(layout.rounds[index].num_objects))
            )
    with sampler.phase("write descriptors"):
        shards = exchange.shard_jobs(plans, lambda name: f"s3://bucket/out/v-0123/{name}")
        sent.append(
            sum_pickled(
                (first, shards[first:stop])
                for first, stop in pairwise(layout.write_bounds.tolist())
            )
        )
    print(f"    descriptor bytes sent per round: {[f'{b / 1e6:.0f} MB' for b in sent]}")


def sum_pickled(arguments: Any) -> int:
    return sum(len(pickle.dumps(item, protocol=5)) for item in arguments)


def max_rss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---------------------------------------------------------------- (c) sizes


# Input, staged objects and shards are each about the input's size on disk, plus room; the
# inputs of the sizes before stay (they are reused by the next run), so a run of every
# size needs the sum of its inputs plus twice the largest (`disk_needed`).
DISK_PER_INPUT_BYTE = 3.2


def disk_needed(sizes: list[float], made: set[float]) -> float:
    """GB of free disk a run of `sizes` needs, the inputs of `made` already on disk."""
    return sum(gb for gb in sizes if gb not in made) + (DISK_PER_INPUT_BYTE - 1) * max(
        sizes, default=0
    )


def case_sizes(args: argparse.Namespace) -> None:
    rows: list[dict[str, Any]] = []
    shard_rows = None
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    made = {
        gb
        for gb in args.sizes
        if Path(args.work_dir, f"raw-{gb:g}gb-seed{args.seed}", MARKER).exists()
    }
    print(
        f"(c) sizes {args.sizes} GB: about {disk_needed(args.sizes, made):.0f} GB of free disk "
        f"needed, {shutil.disk_usage(args.work_dir).free / GB:.0f} GB free",
        flush=True,
    )
    for gb in args.sizes:
        free = shutil.disk_usage(args.work_dir).free  # the work directory's filesystem
        needed = (DISK_PER_INPUT_BYTE - (gb in made)) * gb
        if free < needed * GB:
            print(
                f"[SKIP] (c) {gb:g} GB: needs about {needed:.1f} GB of free disk "
                f"({'staging, shards' if gb in made else 'input, staging, shards'}), "
                f"{free / GB:.1f} GB free",
                flush=True,
            )
            continue
        with DiskSampler(args.work_dir) as disk:
            raw, spec = prepare(gb, args)
            warm_up(["ballast-stratified"], args)
            shard_rows = shard_rows or -(-spec.num_rows // args.shards)
            row = run_tool(
                "ballast-stratified",
                raw,
                Path(args.work_dir),
                base_job(spec.num_rows, shard_rows, args),
                keep=False,
            )
        rows.append({**row, "tool": f"stratified@{gb:g}GB", "gb": dir_bytes(raw) / GB})
        print_size(rows[-1], (disk.peak - disk.start) / GB)
    print(format_table(rows))
    if len(rows) < 2 or any("error" in row for row in rows):
        return
    first, largest = rows[0], rows[-1]
    growth = (largest["wall_s"] / largest["gb"]) / (first["wall_s"] / first["gb"])
    report(
        f"(c) seconds per GB flat within 15% ({first['tool']} -> {largest['tool']})",
        all(r["wall_s"] / r["gb"] <= 1.15 * first["wall_s"] / first["gb"] for r in rows),
        f"{growth:.2f}x",
    )
    report(
        "(c) per-worker RSS flat within 15%",
        all(r["peak_worker"] <= 1.15 * first["peak_worker"] for r in rows),
        f"{largest['peak_worker'] / first['peak_worker']:.2f}x",
    )


def print_size(row: dict[str, Any], disk_gb: float) -> None:
    """One size's figures, as soon as it has run (a 16 GB run takes a while)."""
    if "error" in row:
        print(f"    {row['tool']}: FAILED: {row['error']}", flush=True)
        return
    print(
        f"    {row['tool']}: {row['wall_s']:.1f} s, {row['wall_s'] / row['gb']:.1f} s/GB, "
        f"{row['tree_cpu_s'] / row['gb']:.1f} CPU-s/GB, worker RSS "
        f"{row['peak_worker'] / GB:.2f} GB, driver {row['peak_driver'] / GB:.2f} GB, disk "
        f"used at peak {disk_gb:.1f} GB ({disk_gb / row['gb']:.1f}x the input, its "
        f"generation included when new); stages {row.get('timings_s')}",
        flush=True,
    )


# ---------------------------------------------------------------- (d) S3 requests


def case_s3(args: argparse.Namespace) -> None:
    import fsspec

    from preprocessing.config import DatasetSpec, MixConfig, ReshardConfig
    from preprocessing.driver.reshard import run_reshard
    from tests.preprocessing.s3_requests import counted_s3

    raw, spec = prepare(args.s3_gb, args)
    num_bytes = dir_bytes(raw)
    for task_mb in args.s3_task_mb:
        with counted_s3() as log:
            fs = fsspec.filesystem("s3")
            bucket = f"bench-{task_mb}"  # moto's buckets outlive its server in this process
            fs.mkdir(bucket)
            fs.put(f"{raw}/", f"{bucket}/raw/", recursive=True)
            log.clear()
            config = ReshardConfig(
                dataset=DatasetSpec(inputs=[f"s3://{bucket}/raw/*.parquet"], id_column="id"),
                output_root=f"s3://{bucket}/out",
                mix=MixConfig(class_weighting="uniform"),
                target_shard_rows=-(-spec.num_rows // args.shards),
                holdout_fraction=0.0,
                exchange_task_bytes=task_mb << 20,
                num_workers=2,
            )
            start = time.perf_counter()
            manifest = run_reshard(config).manifest
            wall = time.perf_counter() - start
        s3_report(log.requests, raw, manifest, config, num_bytes, wall)


def s3_report(
    requests: list[Any], raw: Path, manifest: Any, config: Any, num_bytes: int, wall: float
) -> None:
    """Requests per GB, per stage, the median bytes, and the bound of the issue."""
    from preprocessing.driver import reshard
    from preprocessing.exchange import tasks as exchange
    from preprocessing.scan.across_files import check_schemas
    from preprocessing.scan.inputs import scan_file
    from preprocessing.storage.sources import list_inputs

    local = config.model_copy(
        update={"dataset": config.dataset.model_copy(update={"inputs": [str(raw)]})}
    )
    scans = check_schemas(
        [
            scan_file(file, local.dataset, local.seed, local.holdout_fraction, local.max_piece_rows)
            for file in list_inputs(local.dataset)
        ]
    )
    plans, pieces = reshard._plan(scans, local)
    layout = exchange.exchange_layout(scans, plans, pieces, local, threads=2)
    shards = sum(len(split.shards) for split in manifest.splits.values())
    bound = 2 * (len(pieces) + shards) * layout.fan_in * layout.num_read_rounds + 64
    staging = [r for r in requests if "/_staging/" in r.path]
    multipart = sum("uploads" in r.query for r in requests)
    median = statistics.median(r.bytes_moved for r in requests)
    staged = statistics.median(r.bytes_moved for r in staging)
    print(
        f"\n(d) S3 -> S3 on moto, {num_bytes / GB:.2f} GB, task "
        f"{config.exchange_task_bytes >> 20} MiB: {len(pieces)} pieces, {shards} shards, "
        f"{layout.num_map_tasks} map tasks, fan-in {layout.fan_in}, "
        f"{layout.num_read_rounds} read rounds, {wall:.0f} s"
    )
    print(
        f"    {len(requests):,} requests ({len(requests) / (num_bytes / GB):,.0f} per GB), "
        f"{len(staging):,} on staging; median {median:,.0f} bytes per request, staging "
        f"median {staged:,.0f}; multipart starts {multipart}"
    )
    report(
        "(d) requests <= 2 (P + S) F R + 64",
        len(requests) <= bound,
        f"{len(requests):,} <= {bound:,}",
    )


def report(name: str, ok: bool, detail: str) -> None:
    print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cases",
        nargs="+",
        default=["pieces", "bookkeeping", "sizes", "s3"],
        choices=["pieces", "bookkeeping", "sizes", "s3"],
    )
    parser.add_argument("--work-dir", default="/tmp/ballast-bench")
    parser.add_argument("--files", type=int, default=5_000, help="(a) input files")
    parser.add_argument("--rows-per-file", type=int, default=2_000, help="(a)")
    parser.add_argument("--shard-rows", type=int, default=5_000, help="(a) rows per shard")
    parser.add_argument(
        "--pieces-peers",
        nargs="*",
        default=[],
        choices=[tool for tool in TOOLS if not tool.startswith(("ballast", "pyarrow"))],
        help="(a) more tools beside ballast and pyarrow (reshard_bench.py's; the `peers` "
        "extra's are skipped where missing)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="(a) runs of each tool, round "
        "robin; the table keeps each tool's fastest (the machine may be shared)",
    )
    parser.add_argument(
        "--bookkeeping", nargs="+", default=["1e5x1e4", "1e6x1e5"], help="(b) PIECESxSHARDS shapes"
    )
    parser.add_argument(
        "--piece-mb",
        type=int,
        default=64,
        help="(b) bytes per piece, MiB: 64 = one map task per piece",
    )
    parser.add_argument(
        "--sizes",
        type=float,
        nargs="+",
        default=[1.0, 4.0, 16.0],
        help="(c) input sizes, GB; one that does not fit the free disk is skipped, said so",
    )
    parser.add_argument("--s3-gb", type=float, default=0.25, help="(d) input size, GB")
    parser.add_argument(
        "--s3-task-mb",
        type=int,
        nargs="+",
        default=[64, 4],
        help="(d) exchange_task_bytes in MiB, one run each (small: rounds)",
    )
    parser.add_argument("--shards", type=int, default=24, help="(c, d) output shards")
    parser.add_argument("--row-group-rows", type=int, default=8_192)
    parser.add_argument("--raw-row-group-rows", type=int, default=131_072)
    parser.add_argument("--holdout-fraction", type=float, default=0.0)
    parser.add_argument("--keep-outputs", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    args.pieces_peers = skip_optional_peers(args.pieces_peers)
    cases = {
        "pieces": case_pieces,
        "bookkeeping": case_bookkeeping,
        "sizes": case_sizes,
        "s3": case_s3,
    }
    for name in args.cases:
        cases[name](args)


if __name__ == "__main__":
    main()
