"""The wide case: 5,000 scalar feature columns, the scan and the loader against pyarrow.

One version of `num_rows` rows of `num_columns` float64 (or `--dtype float32`) columns in
`--files` raw files (standard normal, no nulls, standardized by the reshard as usual),
resharded by `run_reshard` into shards of 8,192 rows in row groups of 2,048.

The scan (issue 58): `scan_file` of every raw file and `feature_state` (the profiles
merged, the codec built), in this process, against pyarrow reading the same files whole
(`pq.read_table`), best of `repeat`; and the scan stage of the reshard that made the
version (its manifest's `scan_s`, on its Dask workers).

The loader: read twice over the train split, best of `repeat`:

- pyarrow: for each shard, `pq.read_table(shard, columns=<features>)` and the features
  to one numpy matrix (`np.stack` of each column's `to_numpy()`): what a user would write,
  with no shuffle, no standardization and no tensors (one rank's share at one rank);
- pyarrow's direct reader: `pq.ParquetFile(shard).read(columns=...)`, the feature names
  from the file's schema and the shard paths given (no manifest read), to one matrix by
  `to_pandas().to_numpy()`: the fastest of a user's idioms measured here; the target is
  judged against the faster of the two;
- the training loader (one rank, 0 workers, default read-ahead, 1024-row batches), from
  its construction: the first batch's cost included. Its rows are the rows it serves: at
  3,000 rows and batch 1,024 it reads all 3,000 and serves 2,048 (`remainder: drop` leaves
  the partial batch out); `--batch-size 1000` serves every row read.

Rows per CPU-second (this process, every thread) are printed beside rows/s: on a shared
machine they move less.

The targets (issues 38, 58): the loader serves at least 0.8x pyarrow's rows per second;
the scan costs at most 2x pyarrow's whole read.

    .venv/bin/python benchmarks/wide_case.py --rows 16384 --work-dir /tmp/wide-bench
    .venv/bin/python benchmarks/wide_case.py --rows 3000 --files 3 --dtype float32 \
        --work-dir /tmp/wide-bench
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import read_manifest, shard_uri
from preprocessing.driver.reshard import run_reshard
from preprocessing.scan.across_files import feature_state
from preprocessing.scan.inputs import scan_file
from preprocessing.storage.sources import list_inputs
from training.config import LoaderConfig
from training.data.loader import ShardStream

BATCH, NUM_FILES = 1024, 4


@dataclass(frozen=True)
class Shape:
    """The wide input: rows, feature columns, their type, raw files."""

    rows: int
    columns: int
    dtype: str = "float64"
    files: int = NUM_FILES

    @property
    def name(self) -> str:
        kind = "" if self.dtype == "float64" else f"-{self.dtype}"
        parts = "" if self.files == NUM_FILES else f"-{self.files}files"
        return f"{self.rows}x{self.columns}{kind}{parts}"


def write_raw(raw: Path, shape: Shape) -> None:
    """`shape.files` raw files: ids, 4 classes, `shape.columns` features of its type."""
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    per_file = shape.rows // shape.files
    for index in range(shape.files):
        values = rng.normal(size=(shape.columns, per_file)).astype(shape.dtype)
        columns = {
            "id": pa.array(np.arange(index * per_file, (index + 1) * per_file)),
            "label": pa.array(rng.integers(0, 4, per_file)),
            **{f"x{k}": pa.array(values[k]) for k in range(shape.columns)},
        }
        pq.write_table(pa.table(columns), raw / f"part-{index}.parquet")


def prepare(work: Path, shape: Shape) -> tuple[ReshardConfig, str]:
    """The reshard's config and a committed wide version (reused from `work` when
    there: then the reshard does not run again)."""
    raw = work / f"wide-raw-{shape.name}"
    if not raw.exists():
        write_raw(raw, shape)
    config = ReshardConfig(
        dataset=DatasetSpec(
            inputs=[str(raw)],
            id_column="id",
            source_column=None,
            feature_columns=[f"x{k}" for k in range(shape.columns)],
        ),
        output_root=str(work / f"wide-{shape.name}"),
        target_shard_rows=8_192,
        rows_per_row_group=2_048,
        holdout_fraction=0.0,
        num_workers=2,
    )
    return config, run_reshard(config).manifest_uri


def pyarrow_whole(config: ReshardConfig) -> int:
    """pq.read_table of every raw file, every column; the rows."""
    return sum(pq.read_table(file.uri).num_rows for file in list_inputs(config.dataset))


def scan_rows(config: ReshardConfig) -> int:
    """The reshard's scan of every raw file, in this process, and the codec built from
    the profiles; the rows."""
    settings = (config.dataset, config.seed, config.holdout_fraction, config.max_piece_rows)
    scans = [scan_file(file, *settings) for file in list_inputs(config.dataset)]
    feature_state(scans, config.dataset)
    return sum(sum(scan.piece_rows) for scan in scans)


def pyarrow_rows(root: str) -> int:
    """pq.read_table of every train shard plus its features as one matrix; the rows."""
    manifest, location = read_manifest(root)
    names, rows = manifest.feature_columns, 0
    for entry in manifest.split("train").shards:
        table = pq.read_table(shard_uri(location, entry), columns=names)
        rows += len(np.stack([column.to_numpy() for column in table.columns], axis=1))
    return rows


def train_files(root: str) -> list[str]:
    """The train split's shard files, as a user holding the version's path lists them."""
    manifest, location = read_manifest(root)
    return [shard_uri(location, entry) for entry in manifest.split("train").shards]


def pyarrow_file_rows(files: list[str], skip: tuple[str, ...] = ("id", "label", "source")) -> int:
    """Each shard through `pq.ParquetFile(...).read` of every column but `skip` (named from
    the file's own schema: no manifest read) and `to_pandas().to_numpy()`; the rows. This
    is pyarrow's direct reader (`pq.read_table` goes through the datasets layer, which
    costs a third more CPU on 5,000 columns) and its own conversion to one 2-D block
    (column-major: no transpose, where `np.stack` of the columns writes across rows)."""
    rows = 0
    for file in files:
        parquet = pq.ParquetFile(file)
        names = [name for name in parquet.schema_arrow.names if name not in skip]
        rows += len(parquet.read(columns=names).to_pandas().to_numpy())
    return rows


def loader_rows(root: str, batch_size: int = BATCH, remainder: str = "drop") -> int:
    """One epoch of the training loader over the train split; the real rows (`pad`'s
    weight-0 repeats are not counted)."""
    config = LoaderConfig(batch_size=batch_size, remainder=remainder)
    stream = ShardStream(root, "train", config, seed=0)
    return sum(int((batch["weight"] > 0).sum()) for batch in stream.iterate(rank_world=(0, 1)))


def rates(read: Callable[[str], int], root: str) -> tuple[float, float]:
    """Rows per second and per CPU-second (this process, all threads) of `read`."""
    started, cpu = time.perf_counter(), time.process_time()
    rows = read(root)
    seconds, cpu_s = time.perf_counter() - started, time.process_time() - cpu
    return rows / max(seconds, 1e-9), rows / max(cpu_s, 1e-9)


def seconds(step: Callable[[], object]) -> tuple[float, float]:
    """Wall and CPU seconds (this process, every thread) of `step()`."""
    started, cpu = time.perf_counter(), time.process_time()
    step()
    return time.perf_counter() - started, time.process_time() - cpu


def scan_report(config: ReshardConfig, root: str, repeat: int) -> float:
    """Print the scan's seconds beside pyarrow's whole read of the raw files (best of
    `repeat`, alternating), and the reshard's scan stage; the scan's cost over pyarrow's."""
    plain, ours = (float("inf"),) * 2, (float("inf"),) * 2
    for _ in range(repeat):
        plain = min(plain, seconds(lambda: pyarrow_whole(config)))
        ours = min(ours, seconds(lambda: scan_rows(config)))
    stage = read_manifest(root)[0].timings_s.get("scan_s", float("nan"))
    for name, (wall, cpu) in (("pyarrow read_table (raw)", plain), ("scan (in process)", ours)):
        print(f"  {name:30} {wall:8.3f} s {cpu:8.3f} CPU-s")
    print(f"  {'reshard scan stage (Dask)':30} {stage:8.3f} s")
    print(f"  scan / pyarrow: {ours[0] / plain[0]:.2f}x seconds, {ours[1] / plain[1]:.2f}x CPU-s")
    return ours[0] / plain[0]


def wide_report(
    work: Path,
    shape: Shape,
    repeat: int,
    batch_size: int = BATCH,
    scan: bool = True,
    remainder: str = "drop",
) -> float:
    """Print the readers' rows/s and rows/CPU-s (best of `repeat`, alternating) and, with
    `scan`, the scan against pyarrow; the loader's share of pyarrow's faster rows/s."""
    config, root = prepare(work, shape)
    print(f"wide case, {shape.rows:,} rows x {shape.columns:,} {shape.dtype} feature columns:")
    if scan:
        scan_report(config, root, repeat)
    files = train_files(root)
    plain, direct, ours = (0.0, 0.0), (0.0, 0.0), (0.0, 0.0)
    for _ in range(repeat):
        plain = max(plain, rates(pyarrow_rows, root))
        direct = max(direct, rates(lambda _: pyarrow_file_rows(files), root))
        ours = max(ours, rates(lambda uri: loader_rows(uri, batch_size, remainder), root))
    for name, (per_s, per_cpu_s) in (
        ("pyarrow read_table + to numpy", plain),
        ("pyarrow ParquetFile + pandas", direct),
        ("training loader", ours),
    ):
        print(f"  {name:30} {per_s:8,.0f} rows/s {per_cpu_s:8,.0f} rows/CPU-s")
    for name, (per_s, per_cpu_s) in (("read_table", plain), ("ParquetFile", direct)):
        print(
            f"  loader / pyarrow {name}: {ours[0] / per_s:.2f}x rows/s, "
            f"{ours[1] / per_cpu_s:.2f}x rows/CPU-s"
        )
    return ours[0] / max(plain[0], direct[0])  # against the faster of pyarrow's two


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=16_384)
    parser.add_argument("--columns", type=int, default=5_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=BATCH)
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--files", type=int, default=NUM_FILES)
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/wide-bench"))
    parser.add_argument("--loader-only", action="store_true", help="leave the scan out")
    parser.add_argument(
        "--remainder",
        choices=["drop", "pad"],
        default="drop",
        help="loader.remainder: `pad` serves every row (the last batch padded, weight 0)",
    )
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    shape = Shape(args.rows, args.columns, args.dtype, args.files)
    wide_report(
        args.work_dir, shape, args.repeat, args.batch_size, not args.loader_only, args.remainder
    )


if __name__ == "__main__":
    main()
