"""The Delta Lake table of an output root: the current version, for any engine.

    <root>/_delta_log/00000000000000000000.json ...   table version n: one ballast version

The output root is also a Delta Lake table whose newest version holds the shards of the
version `_CURRENT` names, so Polars (its own reader too), DuckDB, Spark, Ray, Daft or
`deltalake` read it without ballast. Its add actions reference the shard files where the
versions keep them (`v-<id>/split=train/train-00000.parquet`; a chain's child lists its
ancestors' `v-<parent>/...`), never a copy, and carry the split as the partition value
`split` (`train`, `holdout`, `validation`), which is no column of the shards: their bytes
are a ballast version's alone. The split is also the shards' directory (manifest format 3), the only
place hive-style readers such as Polars' own look for it, and the shards store vectors as
Delta's array (a list), so every file holds exactly the table's types. A version of an
older format is published as it is: its files lie flat, which Polars' own reader reads
with `split` null (docs/data-path.md). Every table commit records the ballast version it
holds in its commit info (`ballast.version_id`).

`publish_current` moves the table to `_CURRENT`; every commit and rollback calls it after
`_CURRENT` moved, so the table never holds a version `_CURRENT` did not name, and a rerun
finishes a publication a crash cut off (docs/reliability.md, "The table of a root").
Local and S3 roots are published; other stores keep their manifests and `_CURRENT` (a
limit, named in a warning). On S3 `deltalake` takes the same `AWS_*` environment as s3fs;
plain HTTP is allowed where the endpoint is `http://` (MinIO, moto). `DeltaTable.history`
and `is_deltatable` hold the GIL through their requests in deltalake 1.6 (delta-rs issue
4402 fixed two such calls, not these): a publisher waits on no other thread of its
process, so the head's ballast version is read from its commit file instead.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Schema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions
from fsspec.core import url_to_fs

from preprocessing.contract.manifest import (
    PARTITION_KEY,
    Manifest,
    is_local,
    manifest_uri,
    read_current_version,
    read_manifest,
    shard_uri,
)
from preprocessing.toolbox.faults import PermanentError

log = logging.getLogger(__name__)

SPLIT_COLUMN = PARTITION_KEY
VERSION_KEY = "ballast.version_id"  # in each table commit's commit info
# A rollback reads older versions' shards and the table's history maps table versions to
# ballast's: VACUUM and log clean-up must keep both (the default keeps 7 and 30 days).
_KEEP = "interval 36500 days"
CONFIGURATION = {"delta.deletedFileRetentionDuration": _KEEP, "delta.logRetentionDuration": _KEEP}
PUBLISH_TRIES = 8
PUBLISHED_SCHEMES = ("s3", "s3a")  # besides local disk


class TableError(PermanentError, RuntimeError):
    """The table of a root cannot be brought in step with its `_CURRENT`."""


class UnpublishableSchema(TableError):
    """The shards' schema has no Delta Lake form (a type it lacks, names equal but for case)."""


@dataclass(frozen=True)
class Head:
    """The table's newest version as read, and the ballast version it holds."""

    table: DeltaTable
    version_id: str | None


def table_uri(root: str) -> str | None:
    """The URI `deltalake` opens for `root`'s table (an absolute path on local disk);
    None where it is not published."""
    fs, path = url_to_fs(root.rstrip("/"))
    if is_local(fs):
        return os.path.abspath(path)
    return root.rstrip("/") if urlsplit(root).scheme in PUBLISHED_SCHEMES else None


def storage_options(uri: str) -> dict[str, str]:
    """What `deltalake` needs beyond the `AWS_*` environment at `uri`: plain HTTP where the
    S3 endpoint that boto and s3fs use is `http://` (object_store refuses it otherwise)."""
    if urlsplit(uri).scheme not in PUBLISHED_SCHEMES:
        return {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL", "")
    return {"AWS_ALLOW_HTTP": "true"} if endpoint.startswith("http://") else {}


def publish_current(root: str) -> int | None:
    """Make the table's newest version hold the version `_CURRENT` names, committing a
    table version if it holds another; the table version, None if nothing to publish."""
    uri = table_uri(root)
    if uri is None:
        log.warning(
            "%s: no Delta Lake table is published on this store (local and s3:// roots "
            "only); read the version through its manifest or `ballast files`",
            root,
        )
        return None
    for _ in range(PUBLISH_TRIES):
        head = read_head(uri)  # before `_CURRENT`: see the module docstring of why
        current = read_current_version(root)
        if current is None:
            return None
        if head is not None and head.version_id == current:
            return head.table.version()
        try:
            return _commit(uri, read_manifest(manifest_uri(root, current))[0], head)
        except CommitFailedError:  # another process committed that table version first
            continue
        except UnpublishableSchema as error:
            # The table is a view for other engines; the version is committed and current
            # whatever it can hold, so its schema never fails a run (docs/reliability.md).
            log.warning("%s; read the version through its manifest or `ballast files`", error)
            return None
    raise TableError(
        f"{uri}: the table's newest version still differs from _CURRENT after "
        f"{PUBLISH_TRIES} tries; rerun, or see docs/reliability.md"
    )


def read_head(uri: str) -> Head | None:
    """The table at `uri` as it is now, or None if there is none yet."""
    try:
        table = DeltaTable(uri, storage_options=storage_options(uri))
    except TableNotFoundError:
        return None
    return Head(table, committed_version_id(uri, table.version()))


def committed_version_id(uri: str, table_version: int) -> str | None:
    """The ballast version that table version `table_version` records in its commit info."""
    fs, log_dir = url_to_fs(f"{uri}/_delta_log")
    fs.invalidate_cache(log_dir)  # s3fs answers from listings it made before this commit
    commit = fs.cat_file(f"{log_dir}/{table_version:020d}.json").decode()
    for line in commit.splitlines():
        found = json.loads(line).get("commitInfo", {}).get(VERSION_KEY)
        if found is not None:
            return found if isinstance(found, str) else None
    return None


def table_files(manifest: Manifest, uri: str) -> dict[str, tuple[str, int, int]]:
    """Each shard of `manifest` by its path relative to the table root: split, bytes, rows."""
    location = manifest_uri(uri, manifest.version_id)
    return {
        shard_uri(location, entry).removeprefix(f"{uri}/"): (split, entry.num_bytes, entry.num_rows)
        for split, entries in manifest.splits.items()
        for entry in entries.shards
    }


def _commit(uri: str, manifest: Manifest, head: Head | None) -> int:
    """Commit the table version holding `manifest`'s shards on top of `head`."""
    files = table_files(manifest, uri)
    schema = _schema(uri, next(iter(files)))
    properties = CommitProperties(
        custom_metadata={VERSION_KEY: manifest.version_id}, max_commit_retries=0
    )
    if head is None:
        try:
            create_table_with_add_actions(
                uri,
                schema,
                _adds(files, set(files)),
                storage_options=storage_options(uri),
                mode="error",
                partition_by=[SPLIT_COLUMN],
                configuration=CONFIGURATION,
                commit_properties=properties,
            )
        except DeltaError as error:  # another process created it first
            raise CommitFailedError(str(error)) from error
        return 0
    present = _present(head.table)
    actions: list[AddAction | RemoveAction] = [
        *_adds(files, set(files) - set(present)),
        *_removes(present, set(files)),
    ]
    head.table.create_write_transaction(
        actions,
        mode="append",
        schema=schema,
        partition_by=[SPLIT_COLUMN],
        commit_properties=properties,
    )
    return head.table.version() + 1


def _schema(uri: str, first: str) -> Schema:
    """The shards' columns (from a footer) and the `split` partition column."""
    fs, path = url_to_fs(f"{uri}/{first}")
    columns = pq.read_schema(path, filesystem=fs).remove_metadata()
    for column in columns:  # Delta Lake has no float16 or time type, say
        try:
            Schema.from_arrow(pa.schema([column]))
        except Exception as error:  # deltalake raises a bare Exception for a schema error
            raise UnpublishableSchema(
                f"{uri}/{first}: column {column.name!r} of type {column.type} has no Delta "
                f"Lake type; the version is committed and current, but the table at {uri} "
                f"still holds the version before it"
            ) from error
    try:
        return Schema.from_arrow(columns.append(pa.field(SPLIT_COLUMN, pa.string())))
    except Exception as error:  # Delta Lake's column names are case-insensitive, say
        raise UnpublishableSchema(
            f"{uri}/{first}: the columns have no Delta Lake schema ({error}); the version is "
            f"committed and current, but the table at {uri} still holds the version before "
            f"it"
        ) from error


def _adds(files: dict[str, tuple[str, int, int]], paths: set[str]) -> list[AddAction]:
    now_ms = int(time.time() * 1000)
    return [
        AddAction(path, size, {SPLIT_COLUMN: split}, now_ms, True, json.dumps({"numRecords": rows}))
        for path, (split, size, rows) in files.items()
        if path in paths
    ]


def _present(table: DeltaTable) -> dict[str, tuple[str, int]]:
    """The table's files now: path -> (split, bytes)."""
    actions = pa.table(table.get_add_actions(flatten=True))
    return dict(
        zip(
            actions.column("path").to_pylist(),
            zip(
                actions.column(f"partition.{SPLIT_COLUMN}").to_pylist(),
                actions.column("size_bytes").to_pylist(),
                strict=True,
            ),
            strict=True,
        )
    )


def _removes(present: dict[str, tuple[str, int]], keep: set[str]) -> list[RemoveAction]:
    now_ms = int(time.time() * 1000)
    return [
        RemoveAction(path, True, now_ms, size, {SPLIT_COLUMN: split})
        for path, (split, size) in present.items()
        if path not in keep
    ]
