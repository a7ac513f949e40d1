"""What the scan record (preprocessing/scan/scan_record.py) costs: its bytes, and the time to
store it (encode, atomic write with fsync) and to load it (one read, decode), against the
scan it saves a rerun that took over a dead attempt.

Writes `--files` files of the synthetic sample (`--rows` rows in all), scans them in this
process (`scan_file`, one after another: the cluster's scan stage is that work spread over
its workers), then times `store_scans` and `load_scans` on a local directory, best of
`--repeat`, and the store's peak allocation (tracemalloc: the record is streamed, one
scan's lines at a time, so this stays near one scan's encoding whatever the count of
files). `--synthetic N` also times N scans made from those (their files renamed: N
input files of one schema). `--sketches K` gives every scan K string columns with full
distinct-value sketches (4,096 hashes and 100 values each), the largest profiles a scan
holds; the sample's own feature column (a fixed-size list) has none. The pickle of the
same scans, what Dask ships from the workers, is printed for scale.

    .venv/bin/python benchmarks/scan_record_bench.py --files 64 --synthetic 10000
    .venv/bin/python benchmarks/scan_record_bench.py --files 64 --synthetic 10000 --sketches 2
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python benchmarks/NAME.py` puts benchmarks/ first on sys.path, `python -m benchmarks.NAME`
# the working directory: either way the repository root goes first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import dataclasses
import os
import pickle
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np

from preprocessing.config import DatasetSpec
from preprocessing.plan.distinct import SKETCH_SIZE
from preprocessing.scan.feature_stats import ColumnProfile
from preprocessing.scan.inputs import FileScan, scan_file
from preprocessing.scan.scan_record import SCANS_NAME, load_scans, store_scans
from preprocessing.storage.sources import list_inputs
from preprocessing.synthetic.tabular import SampleSpec, write_sample

VERSION = "0123456789abcdef"


def best_s(step: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """The fastest of `repeat` runs of `step`, and its last result."""
    times, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = step()
        times.append(time.perf_counter() - started)
    return min(times), result


def with_sketches(scans: list[FileScan], count: int, seed: int = 0) -> list[FileScan]:
    """`scans`, each with `count` string columns of full sketches added to its profiles."""
    rng = np.random.default_rng(seed)
    added = []
    for scan in scans:
        profiles = dict(scan.profiles)
        for column in range(count):
            hashes = np.unique(rng.integers(0, 2**64 - 1, SKETCH_SIZE, dtype=np.uint64))
            values = {f"value-{column}-{k}" for k in range(100)}
            profiles[f"text_{column}"] = ColumnProfile(
                "string", "category", count=10_000, values=values, hashes=hashes
            )
        added.append(dataclasses.replace(scan, profiles=profiles))
    return added


def renamed(scans: list[FileScan], count: int) -> list[FileScan]:
    """`count` scans cycling through `scans`, each of its own file."""
    made = []
    for index in range(count):
        scan = scans[index % len(scans)]
        name = f"part-{index:07d}.parquet"
        file = dataclasses.replace(scan.file, uri=f"/data/raw/{name}", relative_path=name)
        made.append(dataclasses.replace(scan, file=file))
    return made


def report(label: str, scans: list[FileScan], directory: str, repeat: int) -> dict[str, float]:
    """Print and return the record's bytes and its store and load times for `scans`."""
    files = [scan.file for scan in scans]
    store_s, _ = best_s(lambda: store_scans(directory, VERSION, scans), repeat)
    load_s, loaded = best_s(lambda: load_scans(directory, VERSION, files), repeat)
    assert loaded is not None and len(loaded) == len(scans)
    size = os.path.getsize(os.path.join(directory, SCANS_NAME))
    pickled = len(pickle.dumps(scans, protocol=pickle.HIGHEST_PROTOCOL))
    store_peak = traced_peak(lambda: store_scans(directory, VERSION, scans))
    print(
        f"scan record of {label}: {size / 1e6:.2f} MB ({size / len(scans):,.0f} B a file; "
        f"pickle {pickled / 1e6:.2f} MB), store {store_s:.3f} s, load {load_s:.3f} s; "
        f"store's peak allocation {store_peak / 1e6:.2f} MB"
    )
    return {"bytes": size, "store_s": store_s, "load_s": load_s, "store_peak": store_peak}


def traced_peak(step: Callable[[], Any]) -> int:
    """The most bytes `step` held allocated at once beyond what was allocated before it
    (tracemalloc: Python objects and numpy arrays), in a run of its own as tracing slows it."""
    tracemalloc.start()
    try:
        step()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--rows", type=int, default=640_000)
    parser.add_argument("--synthetic", type=int, default=0, help="also N renamed scans")
    parser.add_argument("--sketches", type=int, default=0, help="string columns per scan")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="scan-record-") as work:
        write_sample(f"{work}/raw", SampleSpec(num_rows=args.rows, num_files=args.files))
        spec = DatasetSpec(inputs=[f"{work}/raw"])
        started = time.perf_counter()
        scans = [scan_file(f, spec, 0, 0.1, 100_000) for f in list_inputs(spec)]
        scan_s = time.perf_counter() - started
        print(f"scan of {len(scans)} files ({args.rows:,} rows), one process: {scan_s:.2f} s")
        scans = with_sketches(scans, args.sketches)
        sketched = f", {args.sketches} sketched string columns each" if args.sketches else ""
        report(f"{len(scans)} files{sketched}", scans, f"{work}/a", args.repeat)
        if args.synthetic:
            many = renamed(scans, args.synthetic)
            report(f"{len(many):,} files{sketched}", many, f"{work}/b", args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
