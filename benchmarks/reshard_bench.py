"""Reshard benchmark: ballast against what a user would pick instead, side by side in one run.

Generates about `--gb` GB of skewed raw Parquet (zipf file sizes, 16 long-tailed classes
with the largest 50x the smallest, 3 sources; columns id, uid, label, source and a
fixed_size_list<float32>[64] `features`; with `ballast-newest` among the tools, a `seen`
timestamp too, for every tool), once per size and seed (a `_GENERATED.json`
marker skips regeneration), then rewrites it into about `--shards` balanced files with:

- ballast `run_reshard` in each shuffle mode (uniform class mix, as many output rows as
  input rows, holdout 0, 2 Dask workers), and `stratified` with a group and duplicates
  rule (`ballast-groups`) or a time holdout by `seen` (`ballast-newest`);
- pyarrow `dataset.write_dataset(max_rows_per_file=..., max_rows_per_group=...)`;
- DuckDB `COPY (SELECT * FROM read_parquet(...)) TO ...`, plain and `ORDER BY random()`;
- Dask `read_parquet(...).repartition(npartitions=S).to_parquet(..., schema=...)`;
- Polars (in memory and streaming) and Daft's native runner: random key -> sort -> about S
  files of equal row counts (`benchmarks/reshard_peers.py`, the `peers` extra: a run
  without it skips them with one line);
- `floor`: the single-pass floor of any reshard (benchmarks/RESULTS.md M17): every input
  row group decoded once and encoded once with ballast's writer settings, on 2 processes,
  nothing written;
- `floor-two-pass`: the floor of an exchange under a memory budget (RESULTS.md M32):
  every row group decoded once, its rows written once to a local Arrow IPC file and read
  back, encoded once and written as a shard by ballast's shard writer (page checksums,
  sha256), on 2 processes, nothing routed or reordered (`benchmarks/floors.py`);
- `floor-shuffle`: the two-pass floor with a global shuffle: each row sent to a random
  shard in pass 1 and each shard put in a random order in pass 2 (one `take` each), and
  nothing else.

The floors report their CPU seconds, and ballast `stratified` its ratios of wall time
and CPU seconds to each.

Every tool runs in its own subprocess, writing to a fresh directory; the parent samples
the RSS of that subprocess and all its descendants every 50 ms and reports the peak of
their sum (shared pages count once per process), of the driver alone and of the largest
single descendant (for ballast: a Dask worker). All writers use zstd and row groups of
`--row-group-rows`. Timings on a shared machine are noisy: compare within one run only,
and use `--repeat` (tools run round robin; the table keeps each tool's fastest run).

    .venv/bin/python benchmarks/reshard_bench.py --gb 2 --work-dir /tmp/bench
    .venv/bin/python benchmarks/reshard_bench.py --gb 0.25 --scale-check --work-dir /tmp/bench

`--scale-check` runs only ballast `stratified` at `--gb` and 4x `--gb` with the same rows
per shard, to show that per-worker memory does not grow with the input.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python benchmarks/NAME.py` puts benchmarks/ first on sys.path, `python -m benchmarks.NAME`
# the working directory: either way the repository root goes first, for `benchmarks.*` and
# for ballast itself in a clone without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import importlib.util
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.floors import (
    floor_checks,
    format_floor_ratios,
    run_floor,
    run_shuffle_floor,
    run_two_pass_floor,
)
from benchmarks.reshard_peers import PEERS as OPTIONAL_PEERS
from benchmarks.reshard_peers import run_peer
from preprocessing.synthetic.tabular import class_probabilities, file_sizes

MARKER = "_GENERATED.json"
NUM_FEATURES = 64
UID_CHARS = 32
BYTES_PER_ROW = NUM_FEATURES * 4 + 8 + 8 + UID_CHARS + 4  # as stored, roughly (snappy)
SAMPLE_INTERVAL_S = 0.05
GB = 1e9
BALLAST_MODES = ("stratified", "global", "block", "none")
TOOLS = (
    *(f"ballast-{mode}" for mode in BALLAST_MODES),
    "ballast-groups",
    "ballast-newest",
    "ballast-same_split",
    "ballast-drop",
    "pyarrow-write_dataset",
    "duckdb-copy",
    "duckdb-order-random",
    "dask-repartition",
    *OPTIONAL_PEERS,
    "floor",
    "floor-two-pass",
    "floor-shuffle",
)
# The peers a tool needs beyond ballast's own install (the `bench` extra); every run also
# needs psutil, to sample memory. The `peers` extra's tools (OPTIONAL_PEERS) are skipped
# where their package is missing instead (skip_optional_peers).
PEERS = {"duckdb-copy": "duckdb", "duckdb-order-random": "duckdb"}
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("uid", pa.string()),
        ("label", pa.int64()),
        ("source", pa.string()),
        ("features", pa.list_(pa.float32(), NUM_FEATURES)),
    ]
)


@dataclass(frozen=True)
class RawSpec:
    """Shape of the generated raw data; the marker file stores it."""

    num_rows: int
    num_files: int = 64
    num_classes: int = 16
    num_sources: int = 3
    class_ratio: float = 50.0
    row_group_rows: int = 131_072
    seed: int = 0
    time_column: bool = False  # a `seen` timestamp column too (for `ballast-newest`)


# ---------------------------------------------------------------- data generation


def raw_chunk(
    rng: np.random.Generator, first_id: int, num_rows: int, source: int, spec: RawSpec
) -> pa.Table:
    """`num_rows` rows of one source: long-tailed labels, class-dependent features."""
    labels = rng.choice(
        spec.num_classes, size=num_rows, p=class_probabilities(spec.num_classes, spec.class_ratio)
    )
    means = (
        np.random.default_rng(spec.seed + 1)
        .normal(0, 1.1, (spec.num_classes, NUM_FEATURES))
        .astype(np.float32)
    )
    features = rng.standard_normal((num_rows, NUM_FEATURES), dtype=np.float32)
    features += means[labels] + np.float32(0.3 * source)
    table = pa.table(
        [
            pa.array(np.arange(first_id, first_id + num_rows), pa.int64()),
            uid_array(rng, num_rows),
            pa.array(labels, pa.int64()),
            pa.DictionaryArray.from_arrays(np.zeros(num_rows, np.int32), [f"source-{source}"]).cast(
                pa.string()
            ),
            pa.FixedSizeListArray.from_arrays(features.reshape(-1), NUM_FEATURES),
        ],
        schema=SCHEMA,
    )
    return table.append_column("seen", seen_array(rng, num_rows)) if spec.time_column else table


def seen_array(rng: np.random.Generator, num_rows: int) -> pa.Array:
    """Timestamps over 30 days to the second (UTC), a row's time drawn alone: every file
    holds thousands of distinct times, so its time counts coarsen (plan/time_cut.py)."""
    seconds = 1_709_251_200 + rng.integers(0, 30 * 86_400, num_rows)
    return pa.array(seconds * 1_000_000, pa.int64()).cast(pa.timestamp("us", tz="UTC"))


def raw_schema(spec: RawSpec) -> pa.Schema:
    if spec.time_column:
        return SCHEMA.append(pa.field("seen", pa.timestamp("us", tz="UTC")))
    return SCHEMA


def uid_array(rng: np.random.Generator, num_rows: int) -> pa.Array:
    """Random 32-hex-digit strings, built straight from buffers (no Python objects)."""
    digits = np.frombuffer(b"0123456789abcdef", np.uint8)
    chars = digits[rng.integers(0, 16, num_rows * UID_CHARS, dtype=np.uint8)]
    offsets = np.arange(0, (num_rows + 1) * UID_CHARS, UID_CHARS, dtype=np.int32)
    return pa.StringArray.from_buffers(num_rows, pa.py_buffer(offsets), pa.py_buffer(chars))


def write_raw_file(path: Path, index: int, first_id: int, num_rows: int, spec: RawSpec) -> None:
    """One raw file, written one row group at a time (memory bounded by a row group)."""
    rng = np.random.default_rng([spec.seed, index])
    with pq.ParquetWriter(path, raw_schema(spec)) as writer:
        for start in range(0, num_rows, spec.row_group_rows):
            size = min(spec.row_group_rows, num_rows - start)
            chunk = raw_chunk(rng, first_id + start, size, index % spec.num_sources, spec)
            writer.write_table(chunk, row_group_size=spec.row_group_rows)


def ensure_raw(directory: Path, spec: RawSpec) -> Path:
    """Generate the raw files unless the marker says this exact spec is already there."""
    marker = directory / MARKER
    if marker.exists() and json.loads(marker.read_text()) == marker_of(spec):
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    start, first_id = time.perf_counter(), 0
    for index, num_rows in enumerate(file_sizes(spec.num_rows, spec.num_files)):
        write_raw_file(directory / f"raw-{index:03d}.parquet", index, first_id, int(num_rows), spec)
        first_id += int(num_rows)
    marker.write_text(json.dumps(marker_of(spec)))
    print(
        f"generated {spec.num_rows:,} rows, {dir_bytes(directory) / GB:.2f} GB in "
        f"{time.perf_counter() - start:.0f} s: {directory}",
        flush=True,
    )
    return directory


def marker_of(spec: RawSpec) -> dict[str, Any]:
    """The spec as its marker holds it (without `time_column` when unset: the inputs
    generated before it existed are still the same)."""
    fields = asdict(spec)
    return fields if spec.time_column else {k: v for k, v in fields.items() if k != "time_column"}


def dir_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*.parquet"))


# ---------------------------------------------------------------- the tools (child side)


def ballast_config(mode: str, job: dict[str, Any]) -> Any:
    """The ReshardConfig of a job in one shuffle mode (kill_bench.py runs it too);
    `groups`: `stratified` with `group_column: uid` (a 32-character string, distinct per
    row: the most a group hash costs) and `duplicates: same_split` (the 64-float vector
    hashed too, for the manifest's duplicate counts: by the exchange, which reads it
    anyway; the scan skips it, RESULTS.md M78); `newest`: `stratified`
    with `holdout_by: newest` by the `seen` timestamps (the input made with them);
    `same_split` and `drop`: `stratified` with that `duplicates` rule alone (`drop`'s cost
    beside `same_split`'s: the pairs each scan writes, the reduce, the drop lists read)."""
    from preprocessing.config import DatasetSpec, MixConfig, ReshardConfig

    splits = {
        "groups": {"group_column": "uid", "duplicates": "same_split"},
        "newest": {"holdout_by": "newest", "holdout_column": "seen"},
        "same_split": {"duplicates": "same_split"},
        "drop": {"duplicates": "drop"},
    }.get(mode, {})
    return ReshardConfig(
        dataset=DatasetSpec(inputs=[job["input"]], id_column=job.get("id_column", "id"), **splits),
        output_root=job["output"],
        mix=MixConfig(class_weighting="uniform"),
        shuffle=mode if mode in BALLAST_MODES else "stratified",
        num_output_rows=job["num_rows"],
        target_shard_rows=job["shard_rows"],
        rows_per_row_group=job["row_group_rows"],
        holdout_fraction=job["holdout_fraction"],
        num_workers=2,
        single_pass_bytes=job.get("single_pass_bytes"),
    )


def run_ballast(mode: str, job: dict[str, Any]) -> dict[str, Any]:
    """ballast reshard in one shuffle mode; returns its manifest's stage timings too."""
    from preprocessing.driver.reshard import run_reshard

    config = ballast_config(mode, job)
    start = time.perf_counter()
    result = run_reshard(config)
    return {"wall_s": time.perf_counter() - start, "timings_s": result.manifest.timings_s}


def run_pyarrow(job: dict[str, Any]) -> dict[str, Any]:
    """pyarrow's balanced copy: the same rows in files of at most `shard_rows` rows."""
    import pyarrow.dataset as ds

    start = time.perf_counter()
    ds.write_dataset(
        ds.dataset(job["input"], format="parquet"),
        job["output"],
        format="parquet",
        file_options=ds.ParquetFileFormat().make_write_options(compression="zstd"),
        max_rows_per_file=job["shard_rows"],
        max_rows_per_group=min(job["row_group_rows"], job["shard_rows"]),
        existing_data_behavior="overwrite_or_ignore",
    )
    return {"wall_s": time.perf_counter() - start}


def run_duckdb(job: dict[str, Any], order_random: bool) -> dict[str, Any]:
    """DuckDB COPY of every row into one zstd Parquet file, optionally ORDER BY random()."""
    import duckdb

    order = " ORDER BY random()" if order_random else ""
    Path(job["output"]).mkdir(parents=True)
    query = (
        f"COPY (SELECT * FROM read_parquet('{job['input']}/*.parquet'){order}) "
        f"TO '{job['output']}/data.parquet' "
        f"(FORMAT parquet, COMPRESSION zstd, ROW_GROUP_SIZE {job['row_group_rows']})"
    )
    start = time.perf_counter()
    duckdb.connect().execute(query)
    return {"wall_s": time.perf_counter() - start}


def run_dask(job: dict[str, Any]) -> dict[str, Any]:
    """Dask DataFrame repartition (default threaded scheduler); schema= is required
    for the fixed_size_list column (docs/architecture.md M10)."""
    import dask.dataframe as dd

    schema = pq.read_schema(next(Path(job["input"]).glob("*.parquet"))).remove_metadata()
    start = time.perf_counter()
    frame = dd.read_parquet(f"{job['input']}/*.parquet")
    frame.repartition(npartitions=job["num_shards"]).to_parquet(
        job["output"],
        schema=schema,
        compression="zstd",
        write_index=False,
        row_group_size=job["row_group_rows"],
    )
    return {"wall_s": time.perf_counter() - start}


def run_child(job_path: str) -> None:
    """Child process entry: run one tool on one job and write its result next to the job."""
    job = json.loads(Path(job_path).read_text())
    tool = job["tool"]
    if tool.startswith("ballast-"):
        result = run_ballast(tool.removeprefix("ballast-"), job)
    elif tool == "pyarrow-write_dataset":
        result = run_pyarrow(job)
    elif tool.startswith("duckdb-"):
        result = run_duckdb(job, order_random=tool == "duckdb-order-random")
    elif tool == "floor":
        result = run_floor(job)
    elif tool == "floor-two-pass":
        result = run_two_pass_floor(job)
    elif tool == "floor-shuffle":
        result = run_shuffle_floor(job)
    elif tool in OPTIONAL_PEERS:
        result = run_peer(tool, job)
    else:
        result = run_dask(job)
    Path(job["result"]).write_text(json.dumps(result))


# ---------------------------------------------------------------- measuring (parent side)


@dataclass
class MemoryPeaks:
    """Peak RSS in bytes: sum over the process tree, the driver alone, any one descendant;
    and CPU seconds of the tree (each process's last sample: a loaded machine stretches
    wall times, much less CPU times)."""

    total: int = 0
    driver: int = 0
    descendant: int = 0
    cpu: dict[int, float] = field(default_factory=dict)

    @property
    def cpu_s(self) -> float:
        return sum(self.cpu.values())

    def sample(self, root: Any) -> None:
        import psutil

        try:
            processes = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        sizes = {}
        for process in processes:
            try:
                sizes[process.pid] = process.memory_info().rss
                times = process.cpu_times()
                self.cpu[process.pid] = times.user + times.system
            except psutil.NoSuchProcess:
                continue
        self.total = max(self.total, sum(sizes.values()))
        self.driver = max(self.driver, sizes.get(root.pid, 0))
        others = [rss for pid, rss in sizes.items() if pid != root.pid]
        self.descendant = max(self.descendant, *others, 0)


def measure(job: dict[str, Any], scratch: Path) -> tuple[dict[str, Any], MemoryPeaks]:
    """Run one job in a child process, sampling its process tree's memory until it exits."""
    import psutil

    job_path = scratch / f"{job['tool']}.job.json"
    job_path.write_text(json.dumps(job))
    child = subprocess.Popen([sys.executable, __file__, "--child", str(job_path)])
    root, peaks = psutil.Process(child.pid), MemoryPeaks()
    while child.poll() is None:
        peaks.sample(root)
        time.sleep(SAMPLE_INTERVAL_S)
    if child.returncode != 0:
        return {"error": f"exit status {child.returncode}"}, peaks
    return json.loads(Path(job["result"]).read_text()), peaks


def output_stats(output: Path, expected_type: pa.DataType) -> dict[str, Any]:
    """Files, rows per file and whether the feature column kept its type, from footers
    (ballast's holdout files, present only with --holdout-fraction > 0, are left out)."""
    files = sorted(
        p
        for p in output.rglob("*.parquet")
        if "_staging" not in p.parts and not p.name.startswith("holdout-")
    )
    rows = [pq.ParquetFile(path).metadata.num_rows for path in files]
    kept = all(
        pq.read_schema(path).field("features").type.equals(expected_type) for path in files[:1]
    )
    return {
        "num_files": len(files),
        "min_rows": min(rows, default=0),
        "max_rows": max(rows, default=0),
        "rows_out": sum(rows),
        "schema_kept": kept,
    }


def run_tool(
    tool: str,
    raw: Path,
    work_dir: Path,
    base_job: dict[str, Any],
    keep: bool,
    schema: pa.Schema = SCHEMA,
) -> dict[str, Any]:
    """Measure one tool end to end: fresh output directory, result, memory, output stats."""
    output = work_dir / "out" / tool
    shutil.rmtree(output, ignore_errors=True)
    with tempfile.TemporaryDirectory(dir=work_dir) as scratch:
        job = {
            **base_job,
            "tool": tool,
            "input": str(raw),
            "output": str(output),
            "result": f"{scratch}/{tool}.result.json",
        }
        result, peaks = measure(job, Path(scratch))
    row = {
        "tool": tool,
        **result,
        "peak_total": peaks.total,
        "peak_driver": peaks.driver,
        "peak_worker": peaks.descendant,
        "tree_cpu_s": peaks.cpu_s,
    }
    if tool == "floor":  # writes nothing
        return row
    if "error" not in result:
        row.update(output_stats(output, schema.field("features").type))
    if not keep:
        shutil.rmtree(output, ignore_errors=True)
    return row


# ---------------------------------------------------------------- reporting


def format_table(rows: list[dict[str, Any]]) -> str:
    """One line per tool; ratios are to the pyarrow copy's wall time."""
    baseline = next(
        (r["wall_s"] for r in rows if r["tool"] == "pyarrow-write_dataset" and "wall_s" in r), None
    )
    header = (
        f"{'tool':<22} {'wall s':>7} {'CPU s':>6} {'x pyarrow':>9} {'RSS sum GB':>10} "
        f"{'driver GB':>9} {'1 proc GB':>9} {'files':>5} {'rows/file min..max':>19} "
        f"{'rows out':>10} schema"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        if "error" in row:
            lines.append(f"{row['tool']:<22} FAILED: {row['error']}")
            continue
        ratio = f"{row['wall_s'] / baseline:.2f}" if baseline else "-"
        if row["tool"] == "floor":  # writes nothing
            lines.append(
                f"{row['tool']:<22} {row['wall_s']:>7.1f} {row['tree_cpu_s']:>6.1f} "
                f"{ratio:>9} {row['peak_total'] / GB:>10.2f}   (decode + encode "
                f"{row['cpu_s']:.1f} CPU-s)"
            )
            continue
        span = f"{row['min_rows']:,}..{row['max_rows']:,}"
        lines.append(
            f"{row['tool']:<22} {row['wall_s']:>7.1f} {row['tree_cpu_s']:>6.1f} {ratio:>9} "
            f"{row['peak_total'] / GB:>10.2f} "
            f"{row['peak_driver'] / GB:>9.2f} {row['peak_worker'] / GB:>9.2f} "
            f"{row['num_files']:>5} {span:>19} {row['rows_out']:>10,} "
            f"{'kept' if row['schema_kept'] else 'CHANGED'}"
            + (f"  (stage + write {row['cpu_s']:.1f} CPU-s)" if "cpu_s" in row else "")
        )
    return "\n".join(lines)


def format_targets(rows: list[dict[str, Any]]) -> str:
    """Whether ballast meets the targets of this benchmark."""
    wall = {row["tool"]: row.get("wall_s") for row in rows}
    peak = {row["tool"]: row.get("peak_total") for row in rows}
    stratified, copy = wall.get("ballast-stratified"), wall.get("pyarrow-write_dataset")
    shuffled = wall.get("duckdb-order-random")
    workers = max(
        (r["peak_worker"] for r in rows if r["tool"].startswith("ballast-") and "error" not in r),
        default=None,
    )
    checks = []
    if stratified and copy:
        checks.append(
            (
                "stratified <= 1.2x pyarrow copy",
                stratified <= 1.2 * copy,
                f"{stratified / copy:.2f}x",
            )
        )
    if stratified:
        checks += floor_checks(rows)
    if stratified and shuffled:
        memory = peak["ballast-stratified"] / peak["duckdb-order-random"]
        checks.append(
            (
                "stratified <= 0.75x DuckDB ORDER BY random()",
                stratified <= 0.75 * shuffled,
                f"{stratified / shuffled:.2f}x ({stratified:.1f} s vs {shuffled:.1f} s)",
            )
        )
        checks.append(
            ("stratified RSS < 1/3 of DuckDB ORDER BY random()", memory < 1 / 3, f"{memory:.2f}x")
        )
    # Without worker processes (a small input runs on threads in the driver) the bound is
    # the whole process's, checked against the driver's peak instead of passing vacuously.
    if workers == 0:
        ran = [r for r in rows if r["tool"].startswith("ballast-") and "error" not in r]
        driver = max(r["peak_driver"] for r in ran)
        name = "peak RSS of the driver, on threads (no worker processes), <= 1 GB"
        checks.append((name, driver <= GB, f"{driver / GB:.2f} GB"))
    elif workers is not None:
        checks.append(
            (
                "peak RSS per Dask worker <= 1 GB (all ballast modes)",
                workers <= GB,
                f"{workers / GB:.2f} GB",
            )
        )
    return "\n".join(
        f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}" for name, ok, detail in checks
    )


def format_stage_timings(rows: list[dict[str, Any]]) -> str:
    """The manifest's stage timings; `other_s` is the rest of the wall time (cluster start
    and stop, listing, manifest and commit)."""
    lines = []
    for row in (row for row in rows if "timings_s" in row):
        stages = {**row["timings_s"], "other_s": row["wall_s"] - sum(row["timings_s"].values())}
        lines.append(f"{row['tool']:<22} " + "  ".join(f"{k}={v:.1f}" for k, v in stages.items()))
    return "ballast stage timings (manifest timings_s):\n" + "\n".join(lines)


# ---------------------------------------------------------------- driver


def prepare(gb: float, args: argparse.Namespace) -> tuple[Path, RawSpec]:
    files = getattr(args, "raw_files", 64)  # scale_bench and kill_bench share this
    timed = "ballast-newest" in getattr(args, "tools", [])  # then every tool reads `seen` too
    spec = RawSpec(
        num_rows=int(gb * GB / BYTES_PER_ROW),
        num_files=files,
        seed=args.seed,
        row_group_rows=args.raw_row_group_rows,
        time_column=timed,
    )
    name = f"raw-{gb:g}gb-seed{args.seed}" + (f"-{files}files" if files != 64 else "")
    name += "-seen" if timed else ""
    raw = ensure_raw(Path(args.work_dir) / name, spec)
    for path in raw.glob("*.parquet"):  # into the page cache, as for every tool after this
        with path.open("rb") as handle:
            while handle.read(1 << 24):
                pass
    print(
        f"input: {spec.num_rows:,} rows in {spec.num_files} files, {dir_bytes(raw) / GB:.2f} GB",
        flush=True,
    )
    return raw, spec


def with_resent(raw: Path, count: int) -> Path:
    """A sibling of `raw` holding its files and the first `count` of them once more under
    names listed after them (hard links: no bytes copied), as re-sent exports: the rows
    `duplicates: drop` leaves out."""
    if not count:
        return raw
    resent = raw.with_name(f"{raw.name}-resent{count}")
    if not (resent / MARKER).exists():
        shutil.rmtree(resent, ignore_errors=True)
        resent.mkdir(parents=True)
        files = sorted(raw.glob("*.parquet"))
        for path in files:
            (resent / path.name).hardlink_to(path)
        for path in files[:count]:
            (resent / f"resent-{path.name}").hardlink_to(path)
        (resent / MARKER).write_text((raw / MARKER).read_text())
    print(f"input with {count} files re-sent: {dir_bytes(resent) / GB:.2f} GB", flush=True)
    return resent


def base_job(num_rows: int, shard_rows: int, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "num_rows": num_rows,
        "shard_rows": shard_rows,
        "num_shards": -(-num_rows // shard_rows),
        "row_group_rows": args.row_group_rows,
        "holdout_fraction": args.holdout_fraction,
        "single_pass_bytes": args.single_pass_bytes,
        # A re-sent file repeats its ids: only `drop`, which checks ids on the rows it
        # keeps, takes them (--resent-ids); else ballast derives ids from (file, row).
        **(
            {"id_column": None}
            if getattr(args, "resent_files", 0) and not getattr(args, "resent_ids", False)
            else {}
        ),
    }


def warm_up(tools: list[str], args: argparse.Namespace) -> None:
    """Run each tool once, unmeasured, on a tiny input, so that no measured run pays for
    first imports or a cold page cache on its own."""
    timed = "ballast-newest" in tools
    spec = RawSpec(
        num_rows=20_000,
        seed=args.seed,
        row_group_rows=args.raw_row_group_rows,
        time_column=timed,
    )
    raw = ensure_raw(Path(args.work_dir) / ("raw-warmup-seen" if timed else "raw-warmup"), spec)
    job = base_job(spec.num_rows, -(-spec.num_rows // args.shards), args)
    print("warming up ...", flush=True)
    for tool in tools:
        run_tool(tool, raw, Path(args.work_dir), job, keep=False)


def best_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest successful run of a tool, with the highest memory peaks of all its runs."""
    done = [run for run in runs if "error" not in run]
    if not done:
        return runs[0]
    peaks = {
        key: max(run[key] for run in done) for key in ("peak_total", "peak_driver", "peak_worker")
    }
    peaks["tree_cpu_s"] = min(run["tree_cpu_s"] for run in done)
    return {**min(done, key=lambda run: run["wall_s"]), **peaks}


def compare(args: argparse.Namespace) -> None:
    """All tools on the same input, then the table and the targets."""
    raw, spec = prepare(args.gb, args)
    raw = with_resent(raw, args.resent_files)
    if args.warm_up:
        warm_up(args.tools, args)
    job = base_job(spec.num_rows, -(-spec.num_rows // args.shards), args)
    runs: dict[str, list[dict[str, Any]]] = {tool: [] for tool in args.tools}
    for repeat in range(args.repeat):  # round robin, so load drifts hit every tool alike
        for tool in args.tools:
            print(f"running {tool} ({repeat + 1}/{args.repeat}) ...", flush=True)
            runs[tool].append(run_tool(tool, raw, Path(args.work_dir), job, args.keep_outputs))
    rows = [best_of(tool_runs) for tool_runs in runs.values()]
    print(
        f"\n{spec.num_rows:,} rows, {dir_bytes(raw) / GB:.2f} GB in, "
        f"{job['num_shards']} shards of <= {job['shard_rows']:,} rows"
    )
    print(format_table(rows))
    for tool, tool_runs in runs.items():  # the table keeps the fastest; the spread is here
        walls = [round(run["wall_s"], 1) if "wall_s" in run else None for run in tool_runs]
        cpus = [round(run["tree_cpu_s"], 1) if "tree_cpu_s" in run else None for run in tool_runs]
        print(f"    {tool} wall s of every run: {walls}, CPU s: {cpus}")
    print("", format_targets(rows), sep="\n")
    print(format_floor_ratios(rows), format_stage_timings(rows), sep="\n\n")


def scale_check(args: argparse.Namespace) -> None:
    """ballast `stratified` at N and 4N GB with the same shard size: per-worker peak RSS."""
    rows, shard_rows = [], None
    for gb in (args.gb, 4 * args.gb):
        raw, spec = prepare(gb, args)
        warm_up(["ballast-stratified"], args)
        shard_rows = shard_rows or -(-spec.num_rows // args.shards)
        job = base_job(spec.num_rows, shard_rows, args)
        row = run_tool("ballast-stratified", raw, Path(args.work_dir), job, args.keep_outputs)
        rows.append({**row, "tool": f"stratified@{gb:g}GB"})
    print("\nscale check (same rows per shard):")
    print(format_table(rows), format_stage_timings(rows), sep="\n\n")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--gb",
        type=float,
        default=2.0,
        help="raw input size, GB (generated once per size and seed under "
        "--work-dir; 2 is the issues' benchmark size)",
    )
    parser.add_argument("--work-dir", default="/tmp/ballast-bench")
    parser.add_argument("--shards", type=int, default=24, help="output files to aim for")
    # Issue 34's second shape: 1.7 GB in 300 zipf-sized files (a long tail of small ones).
    parser.add_argument(
        "--files", dest="raw_files", type=int, default=64, help="raw input files (zipf sizes)"
    )
    parser.add_argument(
        "--resent-files",
        type=int,
        default=0,
        help="the first N raw files listed once more under new names (re-sent exports)",
    )
    parser.add_argument(
        "--resent-ids",
        action="store_true",
        help="keep the `id` column with --resent-files (ballast-drop only: the copies repeat it)",
    )
    parser.add_argument("--row-group-rows", type=int, default=8_192, help="output row groups")
    parser.add_argument("--raw-row-group-rows", type=int, default=131_072)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--holdout-fraction",
        type=float,
        default=0.0,
        help="ballast's holdout (0: none; every shuffle mode works with an empty holdout split)",
    )
    parser.add_argument(
        "--tools",
        nargs="+",
        choices=TOOLS,
        default=list(TOOLS),
        help="tools to run (default: all); `floor` and `floor-two-pass` are "
        "the single- and two-pass floors described above",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs per tool; the table shows the fastest, the highest peaks",
    )
    parser.add_argument(
        "--single-pass-bytes",
        type=int,
        default=None,
        help="ballast's `single_pass_bytes` (default: unset, the host's share; 0 stages)",
    )
    parser.add_argument("--scale-check", action="store_true")
    parser.add_argument("--keep-outputs", action="store_true")
    # The suite's smallest-size run checks that every tool runs, not how fast: no warm-up.
    parser.add_argument("--no-warm-up", dest="warm_up", action="store_false")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args()


def missing_peers(tools: list[str]) -> list[str]:
    """The packages `tools` and the memory sampler need that are not installed."""
    needed = {"psutil", *(PEERS[tool] for tool in tools if tool in PEERS)}
    return sorted(name for name in needed if importlib.util.find_spec(name) is None)


def skip_optional_peers(tools: list[str]) -> list[str]:
    """`tools` less the `peers` extra's whose package is missing, said in one line."""
    missing = {t for t in tools if t in OPTIONAL_PEERS and not installed(OPTIONAL_PEERS[t])}
    if missing:
        packages = ", ".join(sorted({OPTIONAL_PEERS[tool] for tool in missing}))
        print(
            f"reshard_bench: skipping {', '.join(sorted(missing))}: {packages} not installed "
            "(the `peers` extra: pip install -c constraints.txt -e '.[peers]')",
            flush=True,
        )
    return [tool for tool in tools if tool not in missing]


def installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def main() -> None:
    args = parse_args()
    if not args.child and not args.scale_check:
        args.tools = skip_optional_peers(args.tools)
    missing = missing_peers(["ballast-stratified"] if args.scale_check else args.tools)
    if missing and not args.child:
        raise SystemExit(
            f"reshard_bench: {', '.join(missing)} not installed: install the "
            "`bench` extra (pip install -c constraints.txt -e '.[bench]'), or "
            "leave those tools out with --tools"
        )
    if args.child:
        run_child(args.child)
    elif args.scale_check:
        scale_check(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
