"""The scan's cost of `group_column` and `duplicates: same_split`, one file at a time.

For each setting (none; `group_column` alone; with `duplicates: same_split` too) it scans
each of the `--files` largest raw files of a `reshard_bench.py` input in a fresh process
(`scan_file`, as a Dask worker does) and prints its CPU seconds and peak RSS, then the
parts of the added work, timed alone in one process on the same files: decoding the
columns a scan reads for the content without a group (the 64-float vector), hashing the
rows and tallying their keys, and what the exchange adds under a group (its map tasks
decode every column anyway, and hash and tally the content of the rows they read:
`exchange_content_tally`; the scan then reads the group column alone, RESULTS.md M78).
`reshard_bench.py --tools ballast-stratified ballast-groups` gives the whole run's
figures.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/split_key_cost.py /tmp/bench/raw-2gb-seed0
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import resource
import subprocess
import time
from collections.abc import Callable

import pyarrow.parquet as pq

from preprocessing.config import DatasetSpec
from preprocessing.plan.key_tally import exchange_content_tally, tally_keys
from preprocessing.plan.split_keys import key_hashes
from preprocessing.plan.validation_split import splits_of
from preprocessing.scan.inputs import scan_file
from preprocessing.storage.sources import STREAM_BUFFER_BYTES, list_inputs

SETTINGS = {
    "none": {},
    "group": {"group_column": "uid"},
    "group+same_split": {"group_column": "uid", "duplicates": "same_split"},
}
HOLDOUT = 0.1
PIECE_ROWS = 131_072


def spec_of(raw: str, setting: str) -> DatasetSpec:
    return DatasetSpec(inputs=[raw], id_column="id", **SETTINGS[setting])


def scan_alone(raw: str, name: str, setting: str) -> dict[str, float]:
    """Child side: one file's scan, its CPU seconds and the process's peak RSS (GB)."""
    spec = spec_of(raw, setting)
    file = next(f for f in list_inputs(spec) if f.relative_path == name)
    start = time.process_time()
    scan_file(file, spec, 0, HOLDOUT, PIECE_ROWS)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    return {"cpu_s": time.process_time() - start, "peak_gb": peak}


def fastest(work: Callable[[], object], repeat: int) -> float:
    """The least CPU seconds of `repeat` runs of `work`."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best


def parts(raw: str, names: list[str], repeat: int) -> dict[str, float]:
    """CPU seconds of the added work's parts over `names`: decode, hash, tally, and the
    exchange's hash and tally of the content (under a group)."""
    spec = spec_of(raw, "group+same_split")
    paths = [str(Path(raw) / name) for name in names]

    def read(columns: list[str]) -> list:  # as the scan reads: one thread, paged
        files = [
            pq.ParquetFile(p, buffer_size=STREAM_BUFFER_BYTES, pre_buffer=False) for p in paths
        ]
        return [b for f in files for b in f.iter_batches(columns=columns, use_threads=False)]

    batches = read(["uid", "label", "features"])
    keys = [key_hashes(batch, spec) for batch in batches]
    splits = [splits_of(k, spec, "f", 0, len(k["group"]), 0, HOLDOUT) for k in keys]
    return {
        "decode vector": fastest(lambda: read(["features"]), repeat),
        "decode uid": fastest(lambda: read(["uid"]), repeat),
        "hash": fastest(lambda: [key_hashes(batch, spec) for batch in batches], repeat),
        "tally": fastest(
            lambda: [tally_keys(k, s) for k, s in zip(keys, splits, strict=True)], repeat
        ),
        "exchange tally": fastest(
            lambda: [
                exchange_content_tally(b, spec, s) for b, s in zip(batches, splits, strict=True)
            ],
            repeat,
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("raw", help="a reshard_bench.py input directory (raw-<gb>gb-seed<n>)")
    parser.add_argument("--files", type=int, default=4, help="the largest files scanned")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(scan_alone(args.raw, *args.child[1:])))
        return
    files = sorted(Path(args.raw).glob("*.parquet"), key=lambda p: -p.stat().st_size)
    names = [path.name for path in files[: args.files]]
    for setting in SETTINGS:
        cpu, peak = 0.0, 0.0
        for name in names:
            runs = [child(args.raw, name, setting) for _ in range(args.repeat)]
            cpu += min(run["cpu_s"] for run in runs)
            peak = max(peak, *(run["peak_gb"] for run in runs))
        print(f"scan, {setting:<17} {cpu:6.2f} CPU s   peak {peak:.2f} GB", flush=True)
    for part, seconds in parts(args.raw, names, args.repeat).items():
        print(f"  {part:<14} {seconds:6.2f} CPU s")


def child(raw: str, name: str, setting: str) -> dict[str, float]:
    command = [sys.executable, __file__, raw, "--child", "scan", name, setting]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


if __name__ == "__main__":
    main()
