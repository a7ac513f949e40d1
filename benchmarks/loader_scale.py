"""Loader at scale, for benchmarks/loader_bench.py: start-up at 1e5 shards, decode share
per rank, shuffle quality.

Start-up: time to the first batch, fresh and after `load_state_dict` at mid-epoch,
for the real dataset and for a synthetic manifest of `--num-shards` entries, each a
hard link to one of 4 real 20-row shard files (a distinct file the reader must open).

Decode share: W = 1, 2, 4 ranks as processes on one host, no process group (each
process reads RANK / WORLD_SIZE; nothing but the loader runs, so its decode work
is measured alone). Each rank streams one epoch with the default settings
(`StreamLoader`, 0 workers) and reports rows served, rows decoded (its stream's
`rows_decoded`), rows/s, and with `--s3` the bytes it read from a moto S3 server
(every range request of s3fs counted in that process).

Shuffle quality, from the epoch plans alone (no decode; a row is its row group and
its row in the file, as the loader reads it): ballast's order with the default
window and with a window of 1 row group, against a uniform shuffle of the whole
split, over E epochs of full batches: the mean share of a batch's rows from its
largest row group; the re-meet rate (of the pairs in one batch in epoch e, the
fraction in one batch in epoch e + 1); and distinct batch-mates (of all the
batch-mates of 2,000 sampled rows over the E epochs, the fraction that are
distinct), the co-occurrence measure of the target.

    .venv/bin/python benchmarks/loader_scale.py rank DATASET RANK WORLD   (one rank, JSON)
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python benchmarks/NAME.py` puts benchmarks/ first on sys.path, `python -m benchmarks.NAME`
# the working directory: either way the repository root goes first, for `benchmarks.*` and
# for ballast itself in a clone without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import json
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

import preprocessing.contract.manifest as contract
from preprocessing.contract.shards import write_shard
from preprocessing.synthetic.tabular import SampleSpec, sample_table
from preprocessing.versions.attempt import VersionAttempt
from training.config import LoaderConfig
from training.data.loader import ShardStream, StreamLoader
from training.data.partition import EpochPlan
from training.data.shards import Layout

BATCH, TRACKED_ROWS, NUM_FEATURES, NUM_CLASSES = 1024, 2000, 64, 10


def default_loader(root: str) -> StreamLoader:
    """The loader with every default setting, in this process (0 workers)."""
    return StreamLoader(
        ShardStream(root, "train", LoaderConfig(batch_size=BATCH), seed=0), num_workers=0
    )


def synthetic_manifest(work_dir: Path, num_shards: int, rows_per_shard: int = 20) -> str:
    """A committed version of `num_shards` entries, links to 4 real shard files (written and
    committed as every version writer does: preprocessing/contract/shards.py)."""
    root = work_dir / f"many-{num_shards}"
    if not (root / "_CURRENT").exists():
        spec = SampleSpec(num_features=NUM_FEATURES, num_classes=NUM_CLASSES)
        rng = np.random.default_rng(0)
        tables = [sample_table(rng, k * rows_per_shard, rows_per_shard, 0, spec) for k in range(4)]
        with VersionAttempt(str(root), "many") as attempt:
            real = [
                write_shard(
                    attempt.shard_uri(f"real-{k}.parquet"), table, rows_per_shard, "label", "source"
                )
                for k, table in enumerate(tables)
            ]
            entries = [link_entry(attempt, index, real[index % 4]) for index in range(num_shards)]
            # The rows' schema, as every writer records it (a stored vector reads back as a list).
            attempt.commit(many_manifest(tables[0].schema, entries))
    return str(root)


def link_entry(
    attempt: VersionAttempt, index: int, real: contract.ShardEntry
) -> contract.ShardEntry:
    """Shard `index` of the split: a hard link (in the attempt's staging) to a real file,
    published as one more, and its manifest entry."""
    name = contract.shard_name("train", index)
    target = attempt.shard_uri(name)
    os.makedirs(os.path.dirname(target), exist_ok=True)  # the split's directory (format 3)
    os.link(attempt.shard_uri(real.path), target)
    return replace(real, path=name)


def many_manifest(schema: pa.Schema, entries: list[contract.ShardEntry]) -> contract.Manifest:
    num_rows = sum(entry.num_rows for entry in entries)
    return contract.Manifest(
        version_id="many",
        label_column="label",
        source_column="source",
        id_column="id",
        feature_columns=["features"],
        classes=list(range(NUM_CLASSES)),
        sources=["source-0"],
        arrow_schema=[{"name": f.name, "type": str(f.type)} for f in schema],
        splits={"train": contract.SplitEntry(num_rows, entries)},
        seed=0,
        config={},
        input_fingerprint="synthetic",
        input_class_counts={},
        input_source_counts={},
    )


def first_batch_s(root: str, position: int | None = None) -> float:
    """Seconds to build a stream and loader (resumed at `position`) and get one batch."""
    started = time.perf_counter()
    loader = default_loader(root)
    if position is not None:
        loader.load_state_dict({"epoch": 0, "samples_consumed": position})
    next(iter(loader))
    return time.perf_counter() - started


def start_up(root: str) -> tuple[float, float]:
    """(first batch, first batch after resuming at mid-epoch) in seconds."""
    num_rows = contract.read_manifest(root)[0].split("train").num_rows
    return first_batch_s(root), first_batch_s(root, num_rows // 2 // BATCH * BATCH)


def start_up_report(root: str, num_shards: int, work: Path) -> float:
    """Print first-batch and resume times; returns the worst of them at `num_shards`."""
    real_first, real_resume = start_up(root)
    many = synthetic_manifest(work, num_shards)
    started = time.perf_counter()
    contract.read_manifest(many)
    manifest_s = time.perf_counter() - started
    many_first, many_resume = start_up(many)
    num_real = len(contract.read_manifest(root)[0].split("train").shards)
    print(
        f"\nstart-up, {num_real} shards: first batch {real_first:.2f}s, "
        f"resume at mid-epoch {real_resume:.2f}s"
    )
    print(
        f"start-up, {num_shards:,} shards (manifest read {manifest_s:.2f}s): first batch "
        f"{many_first:.2f}s, resume at mid-epoch {many_resume:.2f}s"
    )
    return max(many_first, many_resume)


def rank_pass(dataset: str) -> dict[str, float]:
    """One epoch of this process's rank (RANK / WORLD_SIZE) with the default settings."""
    read_bytes = count_s3_reads()
    started = time.perf_counter()
    loader = default_loader(dataset)
    served = sum(int(batch["weight"].sum()) for batch in loader)
    stream = loader.stream
    seconds = time.perf_counter() - started
    return {
        "rows": stream.num_rows,
        "served": served,
        "decoded": stream.rows_decoded,
        "seconds": seconds,
        "s3_bytes": read_bytes(),
    }


def count_s3_reads() -> Any:
    """Count the bytes of every range request s3fs makes in this process; returns a reader."""
    try:
        from s3fs.core import S3File
    except ImportError:
        return lambda: 0
    total = [0]
    fetch = S3File._fetch_range

    def counted(self: Any, start: int, end: int) -> Any:
        total[0] += end - start
        return fetch(self, start, end)

    S3File._fetch_range = counted
    return lambda: total[0]


def decode_share(dataset: str, world_size: int) -> list[dict[str, float]]:
    """Every rank of a `world_size` job at once, each its own process."""
    ranks = [
        subprocess.Popen(
            [sys.executable, __file__, "rank", dataset, str(rank), str(world_size)],
            stdout=subprocess.PIPE,
            text=True,
            env=os.environ | {"PYTHONPATH": os.getcwd()},
        )
        for rank in range(world_size)
    ]
    outputs = [rank.communicate()[0] for rank in ranks]
    if any(rank.returncode for rank in ranks):
        raise RuntimeError(f"a rank of the {world_size}-rank pass failed")
    return [json.loads(output.strip().splitlines()[-1]) for output in outputs]


def share_report(dataset: str, worlds: list[int]) -> float:
    """Print per-rank figures for each world size; returns the worst excess of rows decoded
    over 1/W of the split (as a fraction of the split)."""
    print(
        f"\n{'ranks':>5} {'rank':>4} {'served':>9} {'decoded':>9} {'decoded/split':>13} "
        f"{'decoded/served':>14} {'rows/s':>9} {'S3 MB':>7}"
    )
    worst = -1.0
    for world in worlds:
        for rank, r in enumerate(decode_share(dataset, world)):
            share = r["decoded"] / r["rows"]
            worst = max(worst, share - 1 / world)
            print(
                f"{world:5d} {rank:4d} {int(r['served']):9d} {int(r['decoded']):9d} "
                f"{share:13.3f} {r['decoded'] / r['served']:14.3f} "
                f"{r['served'] / r['seconds']:9,.0f} {r['s3_bytes'] / 2**20:7.1f}"
            )
    return worst


def batch_of_rows(layout: Layout, config: LoaderConfig, seed: int, epoch: int) -> np.ndarray:
    """For every row of the split (row groups' rows in layout order), the index of the full
    batch of epoch `epoch` at one rank that holds it, or -1 (the dropped remainder)."""
    plan = EpochPlan(layout, seed, epoch, config)
    first_row = np.cumsum(layout.group_rows) - layout.group_rows
    batch_of = np.full(plan.num_rows, -1, np.int64)
    for unit in range(plan.num_rows // config.batch_size):
        slots, rows = plan.locate(plan.unit_positions(unit))
        batch_of[first_row[plan.order[slots]] + rows] = unit
    return batch_of


def uniform_batches(num_rows: int, epoch: int) -> np.ndarray:
    batch_of = np.full(num_rows, -1, np.int64)
    order, full = np.random.default_rng([99, epoch]).permutation(num_rows), num_rows // BATCH
    batch_of[order[: full * BATCH]] = np.arange(full * BATCH) // BATCH
    return batch_of


def quality(epochs: list[np.ndarray], group_of: np.ndarray) -> dict[str, float]:
    """Top row-group share, re-meet rate and distinct batch-mates of an order's epochs."""
    tracked = np.random.default_rng(7).choice(len(group_of), TRACKED_ROWS, replace=False)
    tracked = tracked[np.all([batch_of[tracked] >= 0 for batch_of in epochs], axis=0)]
    mates = [batch_mates(batch_of, tracked) for batch_of in epochs]
    remeet = [
        np.mean(later[mates_now] == later[tracked][:, None])
        for mates_now, later in zip(mates, epochs[1:], strict=False)
    ]
    pairs = np.concatenate([tracked[:, None] * len(group_of) + m for m in mates], axis=None)
    return {
        "top_group_share": top_group_share(epochs[0], group_of),
        # Of one epoch no pair can meet again: not a rate (NaN, printed as "-").
        "remeet_rate": float(np.mean(remeet)) if remeet else float("nan"),
        "distinct_mates": len(np.unique(pairs)) / len(pairs),
    }


def batch_mates(batch_of: np.ndarray, tracked: np.ndarray) -> np.ndarray:
    """[tracked, BATCH - 1] the other rows of each tracked row's batch (all in one)."""
    order = np.argsort(batch_of, kind="stable")
    members = order[int(np.sum(batch_of < 0)) :].reshape(-1, BATCH)[batch_of[tracked]]
    keep = members != tracked[:, None]
    return members[keep].reshape(len(tracked), BATCH - 1)


def top_group_share(batch_of: np.ndarray, group_of: np.ndarray) -> float:
    """Mean over batches of the share of a batch's rows from its largest row group."""
    inside = batch_of >= 0
    num_groups = int(group_of.max()) + 1
    keys, counts = np.unique(batch_of[inside] * num_groups + group_of[inside], return_counts=True)
    largest = np.zeros(int(batch_of.max()) + 1)
    np.maximum.at(largest, keys // num_groups, counts)
    return float(np.mean(largest / BATCH))


def percent(value: float) -> str:
    """`value` as a percentage, or "-" where it is not a number."""
    return "-" if np.isnan(value) else f"{value:.2%}"


def quality_report(dataset: str, num_epochs: int) -> float:
    """Print the shuffle measures; returns ballast's distinct batch-mates over uniform's."""
    layout = ShardStream(dataset, "train", LoaderConfig(batch_size=BATCH), seed=0).layout
    group_of = np.repeat(np.arange(len(layout.group_rows)), layout.group_rows)
    default = LoaderConfig(batch_size=BATCH)
    orders = {
        "uniform shuffle of the split": lambda e: uniform_batches(len(group_of), e),
        f"ballast, window {default.shuffle_window_row_groups} row groups (default)": lambda e: (
            batch_of_rows(layout, default, 0, e)
        ),
        "ballast, window 1 row group": lambda e: batch_of_rows(
            layout, default.model_copy(update={"shuffle_window_row_groups": 1}), 0, e
        ),
    }
    print(
        f"\nshuffle quality over {num_epochs} epochs of {BATCH}-row batches: {'':10} "
        "top row group  re-meet  distinct mates"
    )
    figures = {
        name: quality([make(e) for e in range(num_epochs)], group_of)
        for name, make in orders.items()
    }
    for name, q in figures.items():
        print(
            f"  {name:58} {q['top_group_share']:8.1%} {percent(q['remeet_rate']):>9} "
            f"{q['distinct_mates']:12.2%}"
        )
    uniform, ours = list(figures.values())[:2]
    return ours["distinct_mates"] / uniform["distinct_mates"]


@contextmanager
def on_s3(dataset: str) -> Iterator[str]:
    """The dataset's version copied to a bucket of a moto S3 server on loopback; yields
    the copy's manifest URI."""
    import fsspec
    from moto.server import ThreadedMotoServer

    from preprocessing.contract.manifest import read_manifest

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    endpoint = f"http://127.0.0.1:{server._server.server_port}"
    settings = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        fs.mkdir("bench")
        version = Path(read_manifest(dataset)[1]).parent
        fs.put(f"{version}/", f"bench/{version.name}/", recursive=True)
        yield f"s3://bench/{version.name}/_MANIFEST.json"
    finally:
        server.stop()
        for name, value in saved.items():
            os.environ.pop(name, None) if value is None else os.environ.update({name: value})


if __name__ == "__main__" and sys.argv[1:2] == ["rank"]:
    os.environ.update({"RANK": sys.argv[3], "WORLD_SIZE": sys.argv[4]})
    print(json.dumps(rank_pass(sys.argv[2])))
