"""Loader benchmark: ballast's StreamLoader against what a user would pick instead, in one run.

Data: `preprocessing.synthetic.tabular` raw files (64 float32 features per row, 10 classes)
resharded by `run_reshard` into shards of 65,536 rows in row groups of 8,192
(reused from `--work-dir` when present; `--dataset ROOT` reads an existing
version instead). Rows per second over one epoch (start-up included), 1024-row
batches, one process unless a worker count is named:

- raw pyarrow `ParquetFile.iter_batches` to numpy over the shards in order (the
  ceiling: no shuffle, no class mapping, no tensors);
- ballast `StreamLoader` with 0 and 2 DataLoader workers (defaults: read-ahead 2 row
  groups and 2 batches), and 0 workers with no read-ahead or no batch ahead;
- a plain torch `DataLoader(shuffle=True)` over a map-style dataset holding the
  pyarrow tables in memory (the read of every table counts as its start-up);
- LitData 0.2.76 `StreamingDataset` + `ParquetLoader`, in its own virtual
  environment (benchmarks/RESULTS.md M13) as a subprocess, when `--litdata-python` exists;
  its decode share per rank beside ballast's (benchmarks/litdata_share.py). Mosaic
  Streaming is left out: it reads no Parquet, and needs the CUDA torch build (M13).

Peers stop after `--peer-rows` rows. Rows per CPU-second (this process and its
finished children) is printed beside rows/s: on a shared machine it moves less.
Also: time to the first batch, fresh and after `load_state_dict` at mid-epoch,
for the real dataset and for a synthetic manifest of `--num-shards` (1e5)
entries, each a symlink to one of 4 real 20-row shard files (a distinct file
the reader must open); the stall of a training loop (an MLP step per batch:
1 - in-memory loop time / loader loop time, and the loader's own data-wait
fraction) over a whole epoch, its first batches and a steady stretch; and
(benchmarks/loader_scale.py) rows decoded and served per rank at `--ranks` (1, 2,
4) ranks, S3 bytes per rank with `--s3`, and shuffle quality against a uniform
shuffle; and the tabular case (benchmarks/tabular_case.py: 20 scalar columns and 2
categories with nulls filled, through the feature codec, against a fixed-size-list
column of the same width). Timings on a shared 2-core machine are noisy.

    .venv/bin/python benchmarks/loader_bench.py --rows 1000000 --work-dir /tmp/loader-bench
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
import os
import resource
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, Dataset

import preprocessing.contract.manifest as contract
from benchmarks.litdata_share import share_report as litdata_share
from benchmarks.loader_scale import on_s3, quality_report, share_report, start_up_report
from benchmarks.tabular_case import tabular_report
from benchmarks.verify_cost import verify_report
from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import run_reshard
from preprocessing.synthetic.tabular import SampleSpec, write_sample
from training.config import LoaderConfig
from training.data.loader import ShardStream, StreamLoader
from training.data.readahead import ReadConfig
from training.data.wait import interval

BATCH, NUM_FEATURES, NUM_CLASSES = 1024, 64, 10
COLUMNS = ["id", "label", "features"]
DEFAULT_READ = ReadConfig()


@dataclass
class Result:
    """One reader's pass: rows, seconds in all, seconds to the first batch, CPU seconds."""

    name: str
    rows: int
    seconds: float
    first_batch_s: float
    cpu_s: float = 0.0

    @property
    def rows_per_cpu_s(self) -> float:
        return self.rows / self.cpu_s if self.cpu_s else 0.0

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


def timed_pass(
    name: str, batches: Iterable[Any], size: Callable[[Any], int], limit: int, started: float
) -> Result:
    """Consume `batches` (up to `limit` rows), timing from `started`."""
    rows, first = 0, 0.0
    for batch in batches:
        rows += size(batch)
        first = first or time.perf_counter() - started
        if rows >= limit:
            break
    return Result(name, rows, time.perf_counter() - started, first)


def prepare_dataset(work_dir: Path, num_rows: int) -> str:
    """Raw sample + reshard into a committed version (both reused when already there)."""
    raw = work_dir / f"raw-{num_rows}"
    if not (raw / "_DONE").exists():
        spec = SampleSpec(
            num_rows=num_rows,
            num_files=16,
            num_classes=NUM_CLASSES,
            num_features=NUM_FEATURES,
            class_ratio=5.0,
            seed=0,
        )
        write_sample(raw, spec)
        (raw / "_DONE").touch()
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(raw)], id_column="id"),
        output_root=str(work_dir / f"dataset-{num_rows}"),
        target_shard_rows=65_536,
        rows_per_row_group=8_192,
        holdout_fraction=0.0,
        num_workers=2,
    )
    return run_reshard(config).manifest_uri


def cpu_seconds() -> float:
    """User + system CPU of this process and of its children that have been waited for."""
    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(u.ru_utime + u.ru_stime for u in usage)


def train_shards(root: str) -> list[str]:
    manifest, location = contract.read_manifest(root)
    return [contract.shard_uri(location, entry) for entry in manifest.split("train").shards]


def bench_raw(paths: list[str]) -> Result:
    """The ceiling: pyarrow decode of the same columns to numpy, shard after shard."""

    def batches() -> Iterable[tuple[pa.RecordBatch, np.ndarray, np.ndarray]]:
        for path in paths:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH, columns=COLUMNS):
                batch.column("features").values.to_numpy().reshape(-1, NUM_FEATURES)
                yield batch, batch.column("label").to_numpy(), batch.column("id").to_numpy()

    started = time.perf_counter()
    return timed_pass(
        "pyarrow iter_batches (ceiling)", batches(), lambda b: len(b[1]), 2**62, started
    )


def make_loader(
    root: str,
    num_workers: int,
    depth: int = DEFAULT_READ.prefetch_row_groups,
    batches: int = DEFAULT_READ.prefetch_batches,
) -> StreamLoader:
    read = ReadConfig(prefetch_row_groups=depth, prefetch_batches=batches)
    stream = ShardStream(root, "train", LoaderConfig(batch_size=BATCH), seed=0, read=read)
    return StreamLoader(stream, num_workers=num_workers)


def bench_ballast(
    root: str,
    num_workers: int,
    depth: int = DEFAULT_READ.prefetch_row_groups,
    batches: int = DEFAULT_READ.prefetch_batches,
) -> Result:
    started = time.perf_counter()
    loader = make_loader(root, num_workers, depth, batches)
    name = f"ballast StreamLoader, {num_workers} workers, read-ahead {depth}+{batches} batches"
    return timed_pass(name, loader, lambda b: len(b["id"]), 2**62, started)


class TableDataset(Dataset):
    """What a user writes first: the shards as in-memory arrays, one row per __getitem__."""

    def __init__(self, paths: list[str]) -> None:
        table = pa.concat_tables(pq.read_table(path, columns=COLUMNS) for path in paths)
        features = table.column("features").combine_chunks().values.to_numpy()
        self.features, self.label, self.id = (
            features.reshape(-1, NUM_FEATURES),
            *(table.column(name).to_numpy() for name in ("label", "id")),
        )

    def __len__(self) -> int:
        return len(self.id)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {
            "features": torch.from_numpy(self.features[index]),
            "label": int(self.label[index]),
            "id": int(self.id[index]),
        }


def bench_map_style(paths: list[str], num_workers: int, limit: int) -> Result:
    started = time.perf_counter()
    loader = DataLoader(
        TableDataset(paths), batch_size=BATCH, shuffle=True, num_workers=num_workers
    )
    name = f"torch DataLoader, map-style pyarrow tables, {num_workers} workers"
    return timed_pass(name, loader, lambda b: len(b["id"]), limit, started)


LITDATA_SCRIPT = """
import json, sys, time
from litdata import StreamingDataLoader, StreamingDataset, index_parquet_dataset
from litdata.streaming.item_loader import ParquetLoader
source, cache, (limit, batch), started = *sys.argv[1:3], map(int, sys.argv[3:]), time.perf_counter()
index_parquet_dataset(source)
dataset = StreamingDataset(source, item_loader=ParquetLoader(), cache_dir=cache, shuffle=True)
rows, first = 0, 0.0
for item in StreamingDataLoader(dataset, batch_size=batch, num_workers=0):
    rows += len(item["id"])
    first = first or time.perf_counter() - started
    if rows >= limit:
        break
print(json.dumps({"rows": rows, "seconds": time.perf_counter() - started, "first": first}))
"""


def bench_litdata(python: str, paths: list[str], limit: int) -> Result | str:
    """LitData in its own environment; returns why not when it cannot run."""
    if not Path(python).exists():
        return f"skipped: {python} not found (see benchmarks/RESULTS.md M13)"
    with tempfile.TemporaryDirectory() as scratch:
        (source := Path(scratch) / "shards").mkdir()
        for path in paths:
            os.symlink(path, source / Path(path).name)
        done = subprocess.run(
            [python, "-c", LITDATA_SCRIPT, str(source), f"{scratch}/cache", str(limit), str(BATCH)],
            capture_output=True,
            text=True,
        )
    if done.returncode != 0:
        return f"failed: {done.stderr.strip().splitlines()[-1:]}"
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return Result(
        "LitData StreamingDataset + ParquetLoader, 0 workers",
        figures["rows"],
        figures["seconds"],
        figures["first"],
    )


def mlp_step() -> Callable[[dict[str, torch.Tensor]], None]:
    """One AdamW step of a 64-256-256-10 MLP on a batch."""
    model = torch.nn.Sequential(
        torch.nn.Linear(NUM_FEATURES, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, NUM_CLASSES),
    )
    optimizer = torch.optim.AdamW(model.parameters())

    def step(batch: dict[str, torch.Tensor]) -> None:
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(batch["features"]), batch["label"]).backward()
        optimizer.step()

    return step


def stall(
    root: str, num_workers: int, ahead: int, skip: int, num_batches: int | None
) -> tuple[float, float]:
    """After `skip` batches (trained, untimed), `num_batches` (None: the rest of the epoch):
    (1 - in-memory loop time / loader loop time, with the in-memory loop run just before
    and just after; the loader's data-wait fraction)."""
    loader = make_loader(root, num_workers, batches=ahead)
    count = num_batches or len(loader) - skip
    step, fixed = mlp_step(), next(iter(make_loader(root, 0)))

    def in_memory() -> float:
        started = time.perf_counter()
        for _ in range(count):
            step(fixed)
        return time.perf_counter() - started

    before, batches = in_memory(), iter(loader)
    for _ in range(skip):
        step(next(batches))
    started, waited = time.perf_counter(), loader.metrics()
    for _ in range(count):
        step(next(batches))
    with_loader = time.perf_counter() - started
    wait_fraction = interval(waited, loader.metrics())["data_wait_fraction"]
    return 1 - (before + in_memory()) / 2 / with_loader, wait_fraction


def report(results: list[Result], skipped: list[str]) -> None:
    raw = results[0]
    print(
        f"\n{'reader':62} {'rows':>9} {'rows/s':>10} {'vs raw':>7} {'1st batch':>9} "
        f"{'rows/cpu-s':>10} {'vs raw':>7}"
    )
    for r in results:
        print(
            f"{r.name:62} {r.rows:9d} {r.rows_per_s:10,.0f} {r.rows_per_s / raw.rows_per_s:7.0%} "
            f"{r.first_batch_s:8.2f}s {r.rows_per_cpu_s:10,.0f} "
            f"{r.rows_per_cpu_s / raw.rows_per_cpu_s:7.0%}"
        )
    for line in skipped:
        print(f"  {line}")


def compare_readers(root: str, paths: list[str], args: argparse.Namespace) -> list[Result | str]:
    """Every reader `--repeat` times, round robin; each keeps its fastest pass. CPU time
    counts this process and its finished children (DataLoader workers, LitData)."""
    readers: list[Callable[[], Result | str]] = [
        lambda: bench_raw(paths),
        lambda: bench_ballast(root, 0),
        lambda: bench_ballast(root, 2),
        lambda: bench_ballast(root, 0, depth=0, batches=0),
        lambda: bench_ballast(root, 0, batches=0),
        lambda: bench_map_style(paths, 0, args.peer_rows),
        lambda: bench_litdata(args.litdata_python, paths, args.peer_rows),
    ]
    best: dict[int, Result | str] = {}
    for _ in range(args.repeat):
        for index, reader in enumerate(readers):
            cpu = cpu_seconds()
            result, kept = reader(), best.get(index)
            if isinstance(result, Result):
                result.cpu_s = cpu_seconds() - cpu
            if not isinstance(kept, Result) or (
                isinstance(result, Result) and result.rows_per_s > kept.rows_per_s
            ):
                best[index] = result
    return [best[index] for index in range(len(readers))]


def median_stall(
    root: str, num_workers: int, ahead: int, skip: int, num_batches: int | None, repeat: int
) -> tuple[float, float]:
    """The run of median stall among `repeat` runs."""
    runs = sorted(stall(root, num_workers, ahead, skip, num_batches) for _ in range(repeat))
    return runs[len(runs) // 2]


def readers_section(root: str, paths: list[str], args: argparse.Namespace) -> list[Result]:
    bench_raw(paths)  # warm the page cache, so no reader pays for the first disk read
    found = compare_readers(root, paths, args)
    results = [r for r in found if isinstance(r, Result)]
    skipped = [
        "Mosaic Streaming: skipped (needs its own environment with the CUDA torch "
        "build and torchvision, and MDS shards: benchmarks/RESULTS.md M13)"
    ]
    report(results, skipped + [f"LitData: {r}" for r in found if isinstance(r, str)])
    return results


def stall_section(root: str, args: argparse.Namespace) -> float:
    """Print the stalls: with the defaults over a whole epoch (the target's figure), its
    first batches (after the first one; every window opens then) and a steady stretch
    from the middle; then other settings over the first batches. Returns the epoch's."""
    first, steady = (1, args.stall_batches), args.steady_after
    steady = 8 * LoaderConfig().num_partitions if steady is None else steady
    ahead = DEFAULT_READ.prefetch_batches
    runs = {
        "defaults, whole epoch": (0, ahead, 0, None),
        f"defaults, batches 1-{args.stall_batches}": (0, ahead, *first),
        f"defaults, {args.stall_batches} batches after {steady}": (
            0,
            ahead,
            steady,
            args.stall_batches,
        ),
        "no batch ahead, whole epoch": (0, 0, 0, None),
        "1 worker, first batches": (1, ahead, *first),
    }
    stalls = {name: median_stall(root, *run, args.repeat) for name, run in runs.items()}
    for name, (fraction, waited) in stalls.items():
        print(
            f"training-loop stall, {name}: {fraction:.1%} (loader's data-wait fraction "
            f"{waited:.1%})"
        )
    return stalls["defaults, whole epoch"][0]


def scale_section(root: str, args: argparse.Namespace) -> tuple[float, float]:
    """Decode share per rank (on moto S3 with --s3) and shuffle quality: (worst excess of
    rows decoded over 1/W of the split, distinct batch-mates relative to uniform)."""
    worlds = [int(w) for w in args.ranks.split(",")]
    if args.s3:
        with on_s3(root) as remote:
            excess = share_report(remote, worlds)
    else:
        excess = share_report(root, worlds)
    litdata_share(args.litdata_python, train_shards(root), worlds)
    return excess, quality_report(root, args.quality_epochs)


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.torch_threads)
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    root = args.dataset or prepare_dataset(work, args.rows)
    parts, checks = args.parts.split(","), []
    if "readers" in parts:
        results = readers_section(root, train_shards(root), args)
        ratio, cpu_ratio = (
            getattr(results[1], k) / getattr(results[0], k)
            for k in ("rows_per_s", "rows_per_cpu_s")
        )
        checks.append(
            (
                ">= 90% of raw decode rate per process",
                ratio >= 0.9,
                f"{ratio:.0%} of "
                f"rows/s, {cpu_ratio:.0%} of rows per CPU-second (defaults, 0 workers)",
            )
        )
    if "startup" in parts:
        worst = start_up_report(root, args.num_shards, work)
        checks.append(
            (
                f"first batch and resume < 5 s at {args.num_shards:,} shards",
                worst < 5,
                f"worst {worst:.2f}s",
            )
        )
    if "stall" in parts:
        fraction = stall_section(root, args)
        checks.append(("stall <= 5%", fraction <= 0.05, f"{fraction:.1%} (defaults, whole epoch)"))
    if "scale" in parts:
        excess, distinct = scale_section(root, args)
        checks.append(
            (
                "rows decoded per rank <= (1/W + 0.05) x split",
                excess <= 0.05,
                f"worst 1/W + {excess:.3f}",
            )
        )
        checks.append(
            (
                "distinct batch-mates within 10% of uniform",
                distinct >= 0.9,
                f"{distinct:.1%} of uniform's",
            )
        )
    if "tabular" in parts:
        share = tabular_report(work, args.tabular_rows, args.repeat)
        checks.append(
            (
                "codec costs <= 10% of rows/s (tabular case)",
                share >= 0.9,
                f"{share:.0%} of the fixed-size-list path's rows/s",
            )
        )
    verify_report(root, args)  # only with --verify
    print("\ntargets:")
    for label, ok, detail in checks:
        print(f"  [{'ok' if ok else 'MISSED'}] {label}: {detail}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="Raw rows to generate.")
    parser.add_argument("--dataset", help="An existing dataset root or manifest to read instead.")
    parser.add_argument("--work-dir", default="/tmp/ballast-loader-bench")
    parser.add_argument(
        "--parts", default="readers,startup,stall,scale,tabular", help="Sections to run."
    )
    parser.add_argument("--num-shards", type=int, default=100_000)
    parser.add_argument("--peer-rows", type=int, default=300_000)
    parser.add_argument("--tabular-rows", type=int, default=400_000, help="Tabular case rows.")
    parser.add_argument("--stall-batches", type=int, default=300)
    parser.add_argument(
        "--steady-after",
        type=int,
        default=None,
        help="Batches before the steady stretch of the stall section "
        "(default: 8 x num_partitions; lower it for a tiny --rows).",
    )
    parser.add_argument("--repeat", type=int, default=3, help="Passes per reader (best kept).")
    parser.add_argument("--torch-threads", type=int, default=1, help="Threads of the MLP step.")
    parser.add_argument("--litdata-python", default="/tmp/litdata-venv/bin/python")
    parser.add_argument("--ranks", default="1,2,4", help="World sizes of the decode-share pass.")
    parser.add_argument("--quality-epochs", type=int, default=4)
    parser.add_argument("--s3", action="store_true", help="Decode-share pass on moto S3.")
    parser.add_argument("--verify", help="read.verify modes to compare, e.g. size,sha256")
    return parser.parse_args()


if __name__ == "__main__":
    main()
