"""Every engine's common call on a root's Delta table, as a user without ballast writes it:
deltalake, Polars' own reader, Polars through pyarrow and Daft, each as a Polars frame, and
the check that each holds exactly the manifest's rows per split and class."""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Callable

import daft
import polars as pl
import pyarrow.parquet as pq
from deltalake import DeltaTable
from fsspec.core import url_to_fs

from preprocessing.contract.manifest import Manifest, read_manifest, shard_uri
from preprocessing.versions.table import SPLIT_COLUMN


def _s3_options() -> dict[str, str]:
    """What a user passes for an S3 endpoint of plain HTTP (MinIO, moto); {} on disk."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    return {"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true"} if endpoint else {}


def _daft(root: str) -> pl.DataFrame:
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if root.startswith("s3://") and endpoint:
        s3 = daft.io.S3Config(
            endpoint_url=endpoint,
            key_id=os.environ["AWS_ACCESS_KEY_ID"],
            access_key=os.environ["AWS_SECRET_ACCESS_KEY"],
            region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
            use_ssl=not endpoint.startswith("http://"),
        )
        config = daft.io.IOConfig(s3=s3)
        return pl.from_arrow(daft.read_deltalake(root, io_config=config).to_arrow())
    return pl.from_arrow(daft.read_deltalake(root).to_arrow())


def readers(root: str) -> dict[str, Callable[[], pl.DataFrame]]:
    """Each engine's read of the table at `root`, by name."""
    options = _s3_options() if root.startswith("s3://") else {}
    return {
        "deltalake": lambda: pl.from_arrow(
            DeltaTable(root, storage_options=options).to_pyarrow_table()
        ),
        "polars": lambda: pl.scan_delta(root, storage_options=options or None).collect(),
        "polars+pyarrow": lambda: pl.scan_delta(
            root, use_pyarrow=True, storage_options=options or None
        ).collect(),
        "daft": lambda: _daft(root),
    }


def expected_counts(manifest: Manifest) -> dict[str, Counter[str]]:
    """Per split, the manifest's rows of each class (its shards' class counts summed)."""
    return {
        name: sum((Counter(e.class_counts) for e in split.shards), Counter())
        for name, split in manifest.splits.items()
    }


def counted(frame: pl.DataFrame, label: str) -> dict[str, Counter[str]]:
    """Per split, the frame's rows of each class, each split filtered as a user would."""
    out: dict[str, Counter[str]] = {}
    for split in frame[SPLIT_COLUMN].unique().to_list():
        rows = frame.filter(pl.col(SPLIT_COLUMN) == split)[label]
        out[str(split)] = Counter(map(str, rows.to_list()))
    return out


def _vector_sizes(manifest: Manifest) -> dict[str, int]:
    """The manifest's fixed-size list columns and their sizes."""
    found = (
        (item["name"], re.fullmatch(r"fixed_size_list<.*>\[(\d+)\]", item["type"]))
        for item in manifest.arrow_schema
    )
    return {name: int(match[1]) for name, match in found if match}


def check_every_reader(root: str) -> None:
    """Every engine reads exactly the current manifest's rows per split and class, the
    feature columns with the manifest's widths, and every shard file's columns are the
    table's (Polars' reading of both), so no reader has a cast to make."""
    manifest, location = read_manifest(root)
    expected = expected_counts(manifest)
    for name, read in readers(root).items():
        frame = read()
        assert counted(frame, manifest.label_column) == expected, name
        for column, size in _vector_sizes(manifest).items():
            assert frame[column].list.len().unique().to_list() == [size], (name, column)
    table = pl.scan_delta(root, storage_options=_s3_options() or None).collect_schema()
    declared = {k: v for k, v in table.items() if k != SPLIT_COLUMN}
    for split in manifest.splits.values():
        for entry in split.shards:
            fs, path = url_to_fs(shard_uri(location, entry))
            with fs.open(path, "rb") as handle:
                stored = pl.Schema(pl.from_arrow(pq.read_schema(handle).empty_table()).schema)
            assert dict(stored) == declared, (entry.path, stored, declared)
