"""A tiny version writer, run as its own process by the commit tests.

    python version_writer.py ROOT VERSION_ID [--hold] [--heartbeat-s S] [--start-at T]

Writes two small shards through the real path (`preprocessing.contract.shards`, then
`VersionAttempt.commit` with the `_CURRENT` it saw at start) and prints `committed` or
`already committed`.
`--hold`: take the attempt, print `holding <staging uri>`, and sleep until killed.
`--start-at`: wait for this unix time first, so racing writers start together.
The rows depend on the version id only, so every attempt of one version writes the same
bytes, as a reshard does. BALLAST_KILL_AT (preprocessing.contract.manifest) kills it mid-commit.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

import pyarrow as pa

from preprocessing.contract.manifest import (
    Manifest,
    ShardEntry,
    SplitEntry,
    read_current_version,
    shard_name,
)
from preprocessing.contract.shards import write_shard
from preprocessing.versions.attempt import VersionAttempt

NUM_SHARDS, ROWS_PER_SHARD = 2, 50


def shard_table(version_id: str, index: int) -> pa.Table:
    first = int(hashlib.sha256(version_id.encode()).hexdigest()[:6], 16) + index * ROWS_PER_SHARD
    return pa.table(
        {
            "id": pa.array(range(first, first + ROWS_PER_SHARD), pa.int64()),
            "label": pa.array([i % 2 for i in range(ROWS_PER_SHARD)], pa.int64()),
            "x": pa.array([float(i) for i in range(ROWS_PER_SHARD)], pa.float32()),
        }
    )


def write_test_shard(uri: str, version_id: str, index: int) -> ShardEntry:
    """Shard `index` of version `version_id`, written at `uri`; its manifest entry."""
    return write_shard(uri, shard_table(version_id, index), ROWS_PER_SHARD, "label")


def manifest_of(version_id: str, entries: list[ShardEntry]) -> Manifest:
    return Manifest(
        version_id=version_id,
        label_column="label",
        source_column="",
        id_column="id",
        feature_columns=["x"],
        classes=[0, 1],
        sources=[],
        arrow_schema=[{"name": f.name, "type": str(f.type)} for f in shard_table("", 0).schema],
        splits={"train": SplitEntry(NUM_SHARDS * ROWS_PER_SHARD, entries)},
        seed=0,
        config={},
        input_fingerprint=version_id,
        input_class_counts={},
        input_source_counts={},
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("version_id")
    parser.add_argument("--hold", action="store_true")
    parser.add_argument("--heartbeat-s", type=float, default=10.0)
    parser.add_argument("--start-at", type=float, default=0.0)
    args = parser.parse_args()
    time.sleep(max(0.0, args.start_at - time.time()))
    previous = read_current_version(args.root)
    with VersionAttempt(args.root, args.version_id, heartbeat_s=args.heartbeat_s) as attempt:
        if args.hold:
            print(f"holding {attempt.uri}", flush=True)
            time.sleep(3600)
        entries = [
            write_test_shard(attempt.shard_uri(shard_name("train", index)), args.version_id, index)
            for index in range(NUM_SHARDS)
        ]
        commit = attempt.commit(manifest_of(args.version_id, entries), expected=previous)
    print("committed" if commit.written else "already committed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
