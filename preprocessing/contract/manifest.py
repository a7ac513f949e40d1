"""The dataset version contract: names, the manifest, and reading `_CURRENT`.

Part of `preprocessing/contract/`, the one room of `preprocessing/` that `training/` and
`tracking/` may import (docs/architecture.md): standard library, fsspec and orjson only (its lineage
records and storage primitives, `contract/lineage.py` and `storage/objects.py`, are reached
through it). Under an output root:

    <root>/v-<version_id>/split=train/train-00000.parquet ...   training split (holdout: held out)
    <root>/v-<version_id>/_MANIFEST.json              written last = the commit
    <root>/v-<child_id>/...                           a chain's child: the new shards only
    <root>/_CURRENT                                   newest committed version id
    <root>/_staging/<version_id>/<attempt>/           one run's scratch (versions/attempt.py)

Readers open a version only through `read_manifest`, never by listing files. A manifest
is untrusted input: its version id must match its directory, shard paths must be plain
file names, digests hex, and `_CURRENT` a version id; all checked before any read. Writers
commit only through `commit_version` (preprocessing/contract/commit.py).
A chain's child (preprocessing/versions/incremental.py) lists its parent's shards without copying
them: each such entry names by `version` the ancestor whose directory holds it, a version
id checked against the manifest's own lineage, never a path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from preprocessing.contract.documents import document_json, read_document
from preprocessing.contract.fields import manifest_problem
from preprocessing.contract.lineage import Delta, InputRecord, lineage_problem

# The storage primitives training/ and the rooms reach through the contract (its API).
from preprocessing.storage.objects import file_lock as file_lock
from preprocessing.storage.objects import file_sha256 as file_sha256
from preprocessing.storage.objects import is_local as is_local
from preprocessing.storage.objects import write_atomically as write_atomically
from preprocessing.toolbox.faults import PermanentError

# 3: shards under `split=<name>/` and vectors stored as Delta Lake's list (shard_name,
# contract/shards.py), so engines read the root's Delta table natively (versions/table.py);
# 2: shards flat in the version directory; 1: no input listing and no lineage.
FORMAT_VERSION = 3
READABLE_FORMATS = (1, 2, 3)
PARTITION_KEY = "split"  # the shards' directory `split=<name>/`: the table's partition column
MANIFEST_NAME = "_MANIFEST.json"
CURRENT_NAME = "_CURRENT"
# Names say splits: a version's shard names begin with their split's.
SPLIT_PREFIX = {
    "train": "train",
    "holdout": "holdout",
    "validation": "validation",
    "predictions": "part",
}
_VERSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
_FILE_NAME = r"(?!.*\.\.)[A-Za-z0-9_][A-Za-z0-9_.-]{0,254}"
# A file name, under its split's directory from format 3 on (hive style, as Delta writers do).
_SHARD_PATH = re.compile(rf"(?:{PARTITION_KEY}=[A-Za-z0-9_-]{{1,64}}/)?{_FILE_NAME}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class ManifestError(PermanentError, ValueError):
    """A manifest that is missing, unreadable, of an unknown format, or inconsistent."""


@dataclass(frozen=True)
class ShardEntry:
    """One committed shard file, `path` relative to the version directory. Every row group
    holds `rows_per_row_group` rows but the last: reads are planned without footers."""

    path: str
    num_rows: int
    num_bytes: int
    num_row_groups: int
    rows_per_row_group: int
    sha256: str
    class_counts: dict[str, int]
    source_counts: dict[str, int]
    version: str | None = None  # the ancestor whose directory holds it; None: this version

    def row_group_sizes(self) -> list[int]:
        full, last = divmod(self.num_rows, self.rows_per_row_group)
        return [self.rows_per_row_group] * full + ([last] if last else [])


@dataclass(frozen=True)
class SplitEntry:
    """The shards of one split (`train`, `holdout`, `validation`) in shard-index order."""

    num_rows: int
    shards: list[ShardEntry]


@dataclass(frozen=True)
class RejectedFile:
    """An input file left out of the version, with the reason a person can act on."""

    path: str
    reason: str


@dataclass(frozen=True)
class Manifest:
    """Everything a consumer needs to read a version, and everything needed to audit it."""

    version_id: str
    label_column: str
    source_column: str
    id_column: str
    feature_columns: list[str]
    classes: list[Any]
    sources: list[Any]
    arrow_schema: list[dict[str, str]]
    splits: dict[str, SplitEntry]
    seed: int
    config: dict[str, Any]
    input_fingerprint: str
    input_class_counts: dict[str, int]
    input_source_counts: dict[str, int]
    rejected: list[RejectedFile] = field(default_factory=list)
    # The feature codec's state and the record of nulls (preprocessing/contract/codec.py):
    # {"columns": [one ColumnSpec as a dict per feature column], "dropped_rows": {file: n}}.
    features: dict[str, Any] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    code_version: str = ""
    created_at: str = ""  # ISO 8601, stamped by commit_version when empty
    format_version: int = FORMAT_VERSION
    parent_version: str | None = None  # a chain's child: the version it appends to
    inputs: list[InputRecord] = field(default_factory=list)  # empty: not recorded
    deltas: list[Delta] = field(default_factory=list)  # the lineage, oldest first, this last
    # What this version's run kept of a killed attempt of it (preprocessing/driver/resume.py):
    # map_outputs, map_outputs_kept, shards, shards_kept; empty when it resumed nothing.
    resumed: dict[str, int] = field(default_factory=dict)
    # The route that made it (preprocessing/plan/route.py): route, held_decoded_bytes (the
    # estimate, in decoded bytes), budget_bytes, files_and_shards; either route makes the
    # same shards. Empty in versions made before routes.
    route: dict[str, int | str] = field(default_factory=dict)

    def to_json(self) -> str:
        return document_json(self)

    @classmethod
    def from_json(cls, text: str | bytes, origin: str) -> Manifest:
        raw = read_document(text)
        found = raw.get("format_version")
        if found not in READABLE_FORMATS:
            raise ManifestError(
                f"{origin}: manifest format_version {found!r} is not supported "
                f"(this ballast reads format_version {READABLE_FORMATS})"
            )
        raw["splits"] = {
            name: SplitEntry(split["num_rows"], [ShardEntry(**s) for s in split["shards"]])
            for name, split in raw["splits"].items()
        }
        raw["rejected"] = [RejectedFile(**r) for r in raw.get("rejected", [])]
        raw["inputs"] = [InputRecord(**r) for r in raw.get("inputs", [])]
        raw["deltas"] = [Delta(**d) for d in raw.get("deltas", [])]
        if problem := manifest_problem(manifest := cls(**raw)):
            raise ManifestError(f"{origin}: {problem}")
        return check_contents(manifest, origin)

    def split(self, name: str) -> SplitEntry:
        if name not in self.splits:
            raise ManifestError(
                f"version {self.version_id} has no split {name!r}: {list(self.splits)}"
            )
        return self.splits[name]

    def selection_split(self) -> str | None:
        """The split training validates on, so selects on (early stopping, checkpoint
        choice): `validation` when the version has rows there, else the holdout, as before
        a validation split existed (evaluation and promotion then judge the rows that chose
        the checkpoint); None with neither."""
        for name in ("validation", "holdout"):
            if name in self.splits and self.splits[name].num_rows:
                return name
        return None

    def lineage(self) -> list[Delta]:
        """The deltas oldest first, this version's own stamped with the manifest's time."""
        if not self.deltas:
            return []
        return [*self.deltas[:-1], replace(self.deltas[-1], created_at=self.created_at)]


def code_version() -> str:
    """The code that makes versions; part of every version id."""
    try:
        return f"ballast-{version('ballast')}-format{FORMAT_VERSION}"
    except PackageNotFoundError:
        return f"ballast-dev-format{FORMAT_VERSION}"


def check_version_id(value: Any, origin: str) -> str:
    """`value` if it is a version id (letters, digits, `_`, `-`; no dots or separators)."""
    if not isinstance(value, str) or not _VERSION_ID.fullmatch(value):
        raise ManifestError(
            f"{origin}: {value!r} is not a version id (letters, digits, '_' "
            f"and '-', at most 128, starting with a letter or digit)"
        )
    return value


def check_entry(entry: ShardEntry, origin: str) -> ShardEntry:
    """`entry` if its path is a plain file name (under `split=<name>/` or not), its sha256
    64 lowercase hex digits and its `version` (if any) a version id."""
    if not isinstance(entry.path, str) or not _SHARD_PATH.fullmatch(entry.path):
        raise ManifestError(
            f"{origin}: shard path {entry.path!r} is not a plain file name in the version "
            f"directory or its {PARTITION_KEY}=<name>/ (no other '/', '..', scheme or "
            f"absolute path)"
        )
    if not isinstance(entry.sha256, str) or not _SHA256.fullmatch(entry.sha256):
        raise ManifestError(
            f"{origin}: shard {entry.path!r} has sha256 {entry.sha256!r}, "
            f"not 64 lowercase hex digits"
        )
    if entry.version is not None:
        check_version_id(entry.version, f"{origin}: shard {entry.path!r} version")
    return entry


def check_manifest(manifest: Manifest, location: str) -> Manifest:
    """`manifest` (read from or bound for `location`) if its contents pass `check_contents`
    and its version id names its directory."""
    check_contents(manifest, location)
    if location.rsplit("/", 2)[-2:-1] != [f"v-{manifest.version_id}"]:
        raise ManifestError(
            f"{location}: manifest of version {manifest.version_id!r} is not "
            f"in its directory 'v-{manifest.version_id}'"
        )
    return manifest


def check_contents(manifest: Manifest, origin: str) -> Manifest:
    """`manifest` if its version id is one, every shard entry passes `check_entry` (and lies
    in its own split's directory, if any) and its lineage holds together
    (`lineage_problem`); a copy kept elsewhere, such as a run's artifact, is checked this
    far."""
    check_version_id(manifest.version_id, f"{origin}: version_id")
    entries = [entry for split in manifest.splits.values() for entry in split.shards]
    for entry in entries:
        check_entry(entry, origin)
    for name, split in manifest.splits.items():  # its directory is the partition engines read
        for entry in split.shards:
            if "/" in entry.path and entry.path.split("/")[0] != f"{PARTITION_KEY}={name}":
                raise ManifestError(f"{origin}: {name} shard {entry.path!r} is in another split")
    if problem := lineage_problem(
        manifest.version_id,
        manifest.parent_version,
        manifest.deltas,
        [(e.path, e.version) for e in entries],
    ):
        raise ManifestError(f"{origin}: {problem}")
    return manifest


def shard_name(split: str, index: int) -> str:
    """The path of shard `index` of `split` in its version directory: one place for the
    format. Under `split=<split>/`, where Polars' own Delta reader and every hive-style
    reader take the partition value from (format 3)."""
    return f"{PARTITION_KEY}={split}/{SPLIT_PREFIX[split]}-{index:05d}.parquet"


def shard_path(uri: str) -> str:
    """The manifest path of the shard at `uri`: its file name, under its split's directory
    where it has one (the inverse of joining a version directory and `shard_name`)."""
    parts = uri.rstrip("/").rsplit("/", 2)
    if len(parts) > 1 and parts[-2].startswith(f"{PARTITION_KEY}="):
        return f"{parts[-2]}/{parts[-1]}"
    return parts[-1]


def version_dir(root: str, version_id: str) -> str:
    return f"{root.rstrip('/')}/v-{check_version_id(version_id, root)}"


def manifest_uri(root: str, version_id: str) -> str:
    return f"{version_dir(root, version_id)}/{MANIFEST_NAME}"


def shard_uri(manifest_location: str, entry: ShardEntry) -> str:
    """Absolute URI of a shard, given the URI of the manifest that lists it: in the
    manifest's directory, or in the sibling directory of the ancestor its entry names."""
    directory = manifest_location.rsplit("/", 1)[0]
    check_entry(entry, manifest_location)
    if entry.version is not None:
        directory = f"{directory.rsplit('/', 1)[0]}/v-{entry.version}"
    return f"{directory}/{entry.path}"


def shard_directory(uri: str) -> str:
    """The version directory that holds the shard at `uri` (above its split's directory)."""
    return uri.rstrip("/")[: -len(shard_path(uri)) - 1]


def resolve_manifest_uri(uri: str) -> str:
    """Accept a manifest file, a version directory or an output root (read via `_CURRENT`)."""
    uri = uri.rstrip("/")
    if uri.endswith(MANIFEST_NAME):
        return uri
    fs, path = url_to_fs(uri)
    if fs.exists(f"{path}/{MANIFEST_NAME}"):
        return f"{uri}/{MANIFEST_NAME}"
    version_id = read_current_version(uri)
    if version_id is None:
        raise ManifestError(
            f"{uri}: no {MANIFEST_NAME} and no {CURRENT_NAME}; is this a ballast dataset?"
        )
    return manifest_uri(uri, version_id)


def read_manifest(uri: str) -> tuple[Manifest, str]:
    """Read and validate a manifest; returns it with the exact URI it was read from."""
    location = resolve_manifest_uri(uri)
    try:
        with fsspec.open(location, "rb") as handle:
            data = handle.read()
    except FileNotFoundError as error:
        raise ManifestError(f"{location}: manifest not found") from error
    try:  # ValueError: not UTF-8, not JSON, an integer of thousands of digits
        return check_manifest(
            Manifest.from_json(data.decode(), origin=location), location
        ), location
    except ManifestError:
        raise
    except (KeyError, TypeError, AttributeError, ValueError, RecursionError) as error:
        problem = "nested too deeply" if isinstance(error, RecursionError) else error
        raise ManifestError(f"{location}: malformed manifest ({problem})") from None


def read_current_version(root: str) -> str | None:
    """The committed version id `_CURRENT` points to, or None for an empty root."""
    fs, path = url_to_fs(root.rstrip("/"))
    pointer = f"{path}/{CURRENT_NAME}"
    if not fs.exists(pointer):
        return None
    return check_version_id(fs.cat_file(pointer).decode().strip(), f"{root}/{CURRENT_NAME}")
