"""Incremental benchmark: a nightly run that adds 10% new files, appended (`mode:
incremental`) against a full reshard of the same inputs.

Uses the raw data of benchmarks/reshard_bench.py (`--gb` GB of zipf-sized Parquet files,
16 long-tailed classes, a fixed_size_list<float32>[64] feature), generated once, as the
base; `--new-fraction` more rows in new files (ids after the base's, the same shape) are
the night's delta. The input directory holds hard links, so the base files keep their
size and mtime when the new ones join them. Steps, all on one local Dask cluster of 2
single-threaded workers (start-up and first imports paid once, by a warm-up run):

1. the base version: `mode: incremental` on an empty root (a full reshard);
2. the night: the new files linked in, `mode: incremental` again (a child); each repeat
   withdraws the child and points `_CURRENT` back at the base first;
3. a full reshard (`mode: full`) of the same inputs into an empty root, per repeat.

The ratio is the fastest incremental run over the fastest full reshard (target <= 0.15).
Timings on a shared machine are noisy: compare within one run only.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/incremental_bench.py --gb 2 --work-dir /tmp/bench
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
import shutil
import time
from typing import Any

from distributed import Client

from benchmarks.reshard_bench import GB, RawSpec, dir_bytes, ensure_raw, prepare, write_raw_file
from preprocessing.config import DatasetSpec, MixConfig, ReshardConfig
from preprocessing.contract.commit import swap_current
from preprocessing.contract.manifest import Manifest
from preprocessing.driver.cluster import local_cluster
from preprocessing.driver.reshard import ReshardResult, run_reshard
from preprocessing.synthetic.tabular import file_sizes
from preprocessing.versions.chain_commit import withdraw_version


def linked_inputs(raw: Path, directory: Path) -> Path:
    """A fresh directory of hard links to the raw files (same inode: same size, mtime)."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for path in sorted(raw.glob("*.parquet")):
        os.link(path, directory / path.name)
    return directory


def new_files(directory: Path, spec: RawSpec, fraction: float) -> list[Path]:
    """The night's files: `fraction` of the base's rows in `fraction` of its file count,
    ids after the base's, written once (a marker keeps them)."""
    marker = directory / "_NEW.json"
    num_rows, num_files = int(spec.num_rows * fraction), max(1, round(spec.num_files * fraction))
    key = {"base": spec.num_rows, "seed": spec.seed, "rows": num_rows, "files": num_files}
    if not (marker.exists() and json.loads(marker.read_text()) == key):
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        first_id = spec.num_rows
        for index, rows in enumerate(file_sizes(num_rows, num_files)):
            write_raw_file(
                directory / f"new-{index:03d}.parquet", 10_000 + index, first_id, int(rows), spec
            )
            first_id += int(rows)
        marker.write_text(json.dumps(key))
    return sorted(directory.glob("*.parquet"))


def config_for(
    inputs: Path, root: Path, mode: str, shard_rows: int, args: argparse.Namespace
) -> ReshardConfig:
    return ReshardConfig(
        dataset=DatasetSpec(inputs=[str(inputs)], id_column="id"),
        output_root=str(root),
        mix=MixConfig(class_weighting="uniform"),
        target_shard_rows=shard_rows,
        rows_per_row_group=args.row_group_rows,
        holdout_fraction=args.holdout_fraction,
        num_workers=2,
        mode=mode,
    )


def timed(config: ReshardConfig, client: Client) -> tuple[float, ReshardResult]:
    start = time.perf_counter()
    result = run_reshard(config, client)
    return time.perf_counter() - start, result


def back_to(root: Path, base: Manifest, child: Manifest) -> None:
    """Undo a night: the child withdrawn, `_CURRENT` on the base again."""
    swap_current(str(root), base.version_id, expected=child.version_id)
    withdraw_version(str(root), child)


def night(
    inputs: Path,
    root: Path,
    added: list[Path],
    base: Manifest,
    shard_rows: int,
    client: Client,
    args: argparse.Namespace,
) -> tuple[list[float], ReshardResult]:
    """Link the new files in and append them, `args.repeat` times from the same base."""
    for path in added:
        os.link(path, inputs / path.name)
    times, result = [], None
    for repeat in range(args.repeat):
        if result is not None:
            back_to(root, base, result.manifest)
        seconds, result = timed(config_for(inputs, root, "incremental", shard_rows, args), client)
        assert result.manifest.parent_version == base.version_id, result.how
        times.append(seconds)
        print(f"incremental run {repeat + 1}: {seconds:.1f} s ({result.how})", flush=True)
    assert result is not None
    return times, result


def full(
    inputs: Path, work: Path, shard_rows: int, client: Client, args: argparse.Namespace
) -> tuple[list[float], ReshardResult]:
    times, result = [], None
    for repeat in range(args.repeat):
        shutil.rmtree(work / "full", ignore_errors=True)
        seconds, result = timed(config_for(inputs, work / "full", "full", shard_rows, args), client)
        times.append(seconds)
        print(f"full reshard {repeat + 1}: {seconds:.1f} s", flush=True)
    assert result is not None
    return times, result


def warm_up(work: Path, client: Client, args: argparse.Namespace) -> None:
    """A tiny base and night, unmeasured: workers import everything once."""
    spec = RawSpec(num_rows=20_000, seed=args.seed, row_group_rows=args.raw_row_group_rows)
    inputs = linked_inputs(ensure_raw(work / "raw-warmup", spec), work / "warm" / "inputs")
    shutil.rmtree(work / "warm" / "out", ignore_errors=True)
    run_reshard(config_for(inputs, work / "warm" / "out", "incremental", 5_000, args), client)
    for path in new_files(work / "warm" / "new", spec, 0.1):
        os.link(path, inputs / path.name)
    run_reshard(config_for(inputs, work / "warm" / "out", "incremental", 5_000, args), client)


def report(
    base_s: float, nights: list[float], fulls: list[float], child: Manifest, flat: Manifest
) -> dict[str, Any]:
    own = child.deltas[-1]
    listed = sum(record.num_bytes for record in child.inputs)
    figures = {
        "base_s": round(base_s, 2),
        "incremental_s": [round(t, 2) for t in nights],
        "full_s": [round(t, 2) for t in fulls],
        "ratio": round(min(nights) / min(fulls), 3),
        "files_read": own.num_files,
        "files_skipped": len(child.inputs) - own.num_files,
        "gb_read": round(own.num_bytes / GB, 3),
        "gb_skipped": round((listed - own.num_bytes) / GB, 3),
        "rows_added": own.added_rows(),
        "train_rows": child.split("train").num_rows,
        "train_rows_full": flat.split("train").num_rows,
        "shards_reused": sum(e.version is not None for e in child.split("train").shards),
        "incremental_stages_s": child.timings_s,
        "full_stages_s": flat.timings_s,
    }
    print(json.dumps(figures, indent=1))
    verdict = "meets" if figures["ratio"] <= 0.15 else "misses"
    print(f"incremental / full = {figures['ratio']:.3f} ({verdict} the 0.15 target)")
    return figures


def main() -> None:
    args = parse_args()
    work = Path(args.work_dir)
    raw, spec = prepare(args.gb, args)
    added = new_files(work / f"new-{args.gb:g}gb-seed{args.seed}", spec, args.new_fraction)
    print(
        f"night: {len(added)} new files, {sum(p.stat().st_size for p in added) / GB:.3f} GB; "
        f"base {dir_bytes(raw) / GB:.2f} GB",
        flush=True,
    )
    shard_rows = -(-spec.num_rows // args.shards)
    with local_cluster(2) as cluster, Client(cluster) as client:
        warm_up(work, client, args)
        inputs = linked_inputs(raw, work / "inc" / "inputs")
        shutil.rmtree(work / "inc" / "out", ignore_errors=True)
        base_s, base = timed(
            config_for(inputs, work / "inc" / "out", "incremental", shard_rows, args), client
        )
        print(f"base version: {base_s:.1f} s", flush=True)
        nights, child = night(
            inputs, work / "inc" / "out", added, base.manifest, shard_rows, client, args
        )
        fulls, flat = full(inputs, work / "inc", shard_rows, client, args)
    figures = report(base_s, nights, fulls, child.manifest, flat.manifest)
    if args.out:
        Path(args.out).write_text(json.dumps({"gb": args.gb, **figures}, indent=1))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=2.0, help="base raw input size, GB")
    parser.add_argument(
        "--new-fraction",
        type=float,
        default=0.1,
        help="the night's new rows (and files) as a fraction of the base's",
    )
    parser.add_argument("--work-dir", default="/tmp/ballast-bench")
    parser.add_argument("--shards", type=int, default=24, help="base output files to aim for")
    parser.add_argument("--row-group-rows", type=int, default=8_192, help="output row groups")
    parser.add_argument("--raw-row-group-rows", type=int, default=131_072)
    parser.add_argument("--holdout-fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each; the fastest counts")
    parser.add_argument("--out", help="also write the figures to this JSON file")
    return parser.parse_args()


if __name__ == "__main__":
    main()
