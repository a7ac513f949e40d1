"""Reading raw files of any supported format as bounded record batches.

Parquet, CSV and JSON Lines are read through fsspec in batches, so no reader holds more
than one batch beyond what its caller keeps; a CSV file's text as the dataset's `CsvReading`
says (preprocessing/storage/csv_reading.py), which every reader takes. A file is cut into
pieces (row ranges): Parquet pieces follow row groups, split when a row group is larger than
`max_piece_rows`; CSV and JSON Lines pieces are fixed ranges of `max_piece_rows` rows.
`read_rows` returns one piece. `list_inputs` expands roots, directories and globs into a
sorted, fingerprinted listing, retried on transient errors.

Every read goes through `open_input`, which tells the store's errors from the
decoder's (preprocessing/toolbox/faults.py): a read that returns fewer bytes than the object
holds is `TruncatedRead`, and an error pyarrow raises on bytes read in full is
`CorruptInput`, the one permanent kind. An object of at most `WHOLE_READ_BYTES` is read
in one such checked request and decoded from memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq
from fsspec.core import url_to_fs

from preprocessing.config import DatasetSpec
from preprocessing.storage.csv_reading import CsvReading
from preprocessing.storage.reach import check_reachable
from preprocessing.storage.roots import ballast_outputs, is_under
from preprocessing.storage.schema_form import canonical_schema
from preprocessing.toolbox.faults import (
    DECODE_ERRORS,
    CorruptInput,
    RetriesExhausted,
    RetryPolicy,
    TruncatedRead,
    call_with_retries,
    is_permanent,
)
from preprocessing.toolbox.secrets import redact

FORMATS = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".csv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
}
_BATCH_ROWS = 65_536
# Parquet decodes on the calling thread: a Dask worker of ballast's has one thread per
# core, and pyarrow's pool cost 0.17 of 0.43 ms per small file scanned
# (benchmarks/RESULTS.md M18).
_THREADS = False
_GLOB_CHARS = set("*?[")
# pyarrow reads a Parquet file through a Python file in several calls (footer, then each
# column chunk): 0.64-0.69 ms per 58 KB file against 0.44-0.50 ms decoded from one read
# (benchmarks/RESULTS.md M31). Larger objects are streamed, so that a map task reading one
# piece of a file does not fetch the rest.
WHOLE_READ_BYTES = 1 << 20
STREAM_BUFFER_BYTES = 1 << 20

# The one reader option: pq.ParquetFile / pq.read_table(**VERIFY_PAGES): every page's CRC checked.
VERIFY_PAGES: dict[str, Any] = {"page_checksum_verification": True}


@dataclass(frozen=True)
class InputFile:
    """One raw file: its URI, the input root it came from, and what identifies its content."""

    uri: str
    root: str
    relative_path: str
    num_bytes: int
    content_tag: str


def list_inputs(spec: DatasetSpec, retry: RetryPolicy | None = None) -> list[InputFile]:
    """Every input file under the configured roots, sorted by URI, without duplicates;
    each root's listing is retried on transient errors, once its store answered a probe."""
    check_reachable(spec.inputs)
    found: dict[str, InputFile] = {}
    for root in spec.inputs:
        for item in _listed(root, retry or RetryPolicy()):
            found.setdefault(item.uri, item)
    if not found:
        raise FileNotFoundError(f"dataset.inputs matched no files: {redact(str(spec.inputs))}")
    return [found[uri] for uri in sorted(found)]


def _listed(root: str, retry: RetryPolicy) -> list[InputFile]:
    """`_list_root` under the policy; a root still unlisted for a reason that may pass
    (an endpoint that does not answer) raises RetriesExhausted naming it."""
    try:
        return call_with_retries(_list_root, root, policy=retry)
    except Exception as error:
        if is_permanent(error) or isinstance(error, FileNotFoundError):
            raise  # a root that is not there is the config's to fix, as before
        raise RetriesExhausted(
            f"input root {redact(root)} could not be listed after "
            f"{retry.attempts} tries ({type(error).__name__}: "
            f"{redact(str(error))}); rerun once it answers"
        ) from error


def _list_root(root: str) -> list[InputFile]:
    """The files of one root: a glob, a directory (searched for known formats) or a file."""
    fs, path = url_to_fs(root)
    if _GLOB_CHARS & set(path):
        matches = sorted(fs.glob(path))
        base = path[: min(path.find(c) for c in _GLOB_CHARS if c in path)].rsplit("/", 1)[0]
    elif fs.isdir(path):
        found = fs.find(path)
        own = ballast_outputs(found, path)  # an old output under the root is not data
        matches = sorted(
            p for p in found if p.lower().endswith(tuple(FORMATS)) and not is_under(p, own)
        )
        base = path
    else:
        matches, base = [path], path.rsplit("/", 1)[0]
    files = []
    for match in matches:
        info = fs.info(match)
        tag = str(info.get("ETag") or info.get("mtime") or info.get("LastModified") or "")
        relative = match[len(base) :].lstrip("/") or match.rsplit("/", 1)[-1]
        files.append(InputFile(fs.unstrip_protocol(match), root, relative, int(info["size"]), tag))
    return files


def fingerprint_inputs(files: list[InputFile]) -> str:
    """A digest of the listing (paths, sizes, etags/mtimes): changes when any input does."""
    digest = hashlib.sha256()
    for item in files:
        # Redacted URIs: the digest is stored, and a hash of a password is a way to test it.
        digest.update(f"{redact(item.uri)}\0{item.num_bytes}\0{item.content_tag}\n".encode())
    return digest.hexdigest()


def file_format(uri: str) -> str:
    """The format of a raw file, from its extension; unknown extensions are an error."""
    for suffix, name in FORMATS.items():
        if uri.lower().endswith(suffix):
            return name
    raise ValueError(f"{uri}: unsupported file type (expected one of {sorted(FORMATS)})")


class _CheckedReads:
    """A file for pyarrow that notes every error of the store and checks that each read
    returns all the bytes the object held at open from there on (a body cut short, or a
    file cut short while read, is not a short file)."""

    mode = "rb"

    def __init__(self, handle: Any, uri: str) -> None:
        self.handle, self.uri = handle, uri
        self.store_error: BaseException | None = None
        self.num_bytes = self._call(self._size)
        self.reader: Any = self  # what pyarrow reads: see `open_input`

    def _call(self, action: Any, *args: Any) -> Any:
        try:
            return action(*args)
        except Exception as error:
            self.store_error = error
            raise

    def _size(self) -> int:
        size = getattr(self.handle, "size", None)
        if size is None:
            here = self.handle.tell()
            size = self.handle.seek(0, 2)
            self.handle.seek(here)
        return int(size)

    def read(self, num_bytes: int = -1) -> bytes:
        offset = self._call(self.handle.tell)
        data = self._call(self.handle.read, num_bytes)
        expected = self.num_bytes - offset
        expected = expected if num_bytes is None or num_bytes < 0 else min(num_bytes, expected)
        if len(data) < expected:
            self.store_error = TruncatedRead(
                f"{self.uri}: read {len(data)} of {expected} bytes at offset {offset} (the "
                f"object holds {self.num_bytes}): the body was cut short"
            )
            raise self.store_error
        return bytes(data)

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 2:  # the end as it was at open: a file cut short since reads short
            offset, whence = self.num_bytes + offset, 0
        return int(self._call(self.handle.seek, offset, whence))

    def tell(self) -> int:
        return int(self._call(self.handle.tell))

    @property
    def closed(self) -> bool:
        return bool(self.handle.closed)

    def close(self) -> None:
        self.handle.close()


@contextmanager
def open_input(uri: str) -> Iterator[_CheckedReads]:
    """A file open for the block, whose `reader` is what to hand pyarrow; an error pyarrow
    raises in the block on bytes the store delivered in full becomes `CorruptInput`, the
    store's own pass as is. An object of at most WHOLE_READ_BYTES is read whole (one
    checked request) and decoded from memory."""
    fs, path = url_to_fs(uri)
    with fs.open(path, "rb") as handle:
        source = _CheckedReads(handle, uri)
        with decode_errors(source):
            if source.num_bytes <= WHOLE_READ_BYTES:
                source.reader = pa.BufferReader(pa.py_buffer(source.read()))
            yield source


@contextmanager
def decode_errors(source: _CheckedReads) -> Iterator[None]:
    """An error pyarrow raises in the block on bytes `source` delivered in full becomes
    `CorruptInput`; one after an error of the store passes as is."""
    try:
        yield
    except DECODE_ERRORS as error:
        if source.store_error is not None:
            raise
        raise CorruptInput(f"{source.uri}: {type(error).__name__}: {error}") from error


@dataclass(frozen=True)
class Footer:
    """What a Parquet footer tells without reading any data."""

    schema: pa.Schema
    piece_starts: list[int]
    # Per fixed-size list column (no other: 0.1 s a footer of 5,000 columns): null lists and
    # elements by the chunks' statistics, or None when a row group has none for it.
    null_counts: dict[str, int | None]
    # The row groups' uncompressed size (`total_byte_size`): the rows' size decoded.
    decoded_bytes: int = 0


def read_footer(uri: str, max_piece_rows: int) -> Footer | None:
    """Parquet only: schema, piece start rows and null counts (None for other formats)."""
    if file_format(uri) != "parquet":
        return None
    with open_input(uri) as handle:
        return footer_of(pq.ParquetFile(handle.reader), max_piece_rows)


def footer_of(parquet: pq.ParquetFile, max_piece_rows: int) -> Footer:
    """The footer of an open Parquet file (its schema in the scan's form: schema_form.py)."""
    metadata, first = parquet.metadata, 0
    schema, starts = metadata.schema.to_arrow_schema(), list[int]()
    for group in range(metadata.num_row_groups):
        rows = metadata.row_group(group).num_rows
        starts.extend(range(first, first + rows, max_piece_rows))
        first += rows
    decoded = sum(metadata.row_group(g).total_byte_size for g in range(metadata.num_row_groups))
    return Footer(canonical_schema(schema), starts, _null_counts(metadata, schema), decoded)


def _null_counts(metadata: pq.FileMetaData, schema: pa.Schema) -> dict[str, int | None]:
    counts: dict[str, int | None] = {}
    leaf, groups = 0, range(metadata.num_row_groups)
    for arrow_field in schema:
        num_leaves = _num_leaves(arrow_field.type)
        if pa.types.is_fixed_size_list(arrow_field.type):
            leaves = range(leaf, leaf + num_leaves)
            stats = [metadata.row_group(g).column(i).statistics for g in groups for i in leaves]
            known = all(item is not None and item.has_null_count for item in stats)
            counts[arrow_field.name] = sum(item.null_count for item in stats) if known else None
        leaf += num_leaves
    return counts


def _num_leaves(arrow_type: pa.DataType) -> int:
    """Parquet leaf columns of one Arrow field (lists nest one, structs and maps several)."""
    if pa.types.is_struct(arrow_type):
        return sum(_num_leaves(arrow_type.field(i).type) for i in range(arrow_type.num_fields))
    if pa.types.is_map(arrow_type):
        return _num_leaves(arrow_type.key_type) + _num_leaves(arrow_type.item_type)
    if isinstance(arrow_type, (pa.ListType, pa.LargeListType, pa.FixedSizeListType)):
        return _num_leaves(arrow_type.value_type)
    return 1


def iter_batches(
    uri: str, columns: list[str] | None = None, *, reading: CsvReading
) -> Iterator[pa.RecordBatch]:
    """Every row of the file in order, as record batches of at most ~64k rows."""
    with open_input(uri) as handle:
        yield from batches_of(handle.reader, uri, columns, reading=reading)


def parquet_batches(
    source: _CheckedReads, parquet: pq.ParquetFile, columns: list[str]
) -> Iterator[pa.RecordBatch]:
    """`iter_batches` of a Parquet file open already (`parquet`, over `source`): a scan
    reads the footer and the columns in one open (0.7 of 2 ms per small file)."""
    with decode_errors(source):
        yield from parquet.iter_batches(_BATCH_ROWS, columns=columns, use_threads=_THREADS)


def batches_of(
    handle: Any, uri: str, columns: list[str] | None = None, *, reading: CsvReading
) -> Iterator[pa.RecordBatch]:
    """`iter_batches` over a file open from its start."""
    kind = file_format(uri)
    if kind == "parquet":
        yield from pq.ParquetFile(handle, **VERIFY_PAGES).iter_batches(
            _BATCH_ROWS, columns=columns, use_threads=_THREADS
        )
    elif kind == "csv":
        yield from reading.batches(handle, columns)
    else:
        reader = pa_json.open_json(handle)
        for batch in reader:
            yield batch.select(columns) if columns else batch


def stream_schema(uri: str, *, reading: CsvReading) -> pa.Schema:
    """The schema a streaming read of the whole file produces."""
    kind = file_format(uri)
    with open_input(uri) as handle:
        if kind == "parquet":
            return canonical_schema(pq.ParquetFile(handle.reader).schema_arrow)
        if kind == "csv":
            return reading.schema(handle.reader)
        return pa_json.open_json(handle.reader).schema


def read_rows(uri: str, first_row: int, num_rows: int, *, reading: CsvReading) -> pa.Table:
    """Rows [first_row, first_row + num_rows) of a file, reading only what covers them
    (Parquet: the overlapping row groups; CSV / JSON Lines: a stream up to the range)."""
    whole = _whole_row_groups(uri, first_row, num_rows)
    if whole is not None:
        return whole
    batches = []
    position = 0
    for batch in _batches_from(uri, first_row, reading):
        start, end = batch[1], batch[1] + batch[0].num_rows
        position = end
        low, high = max(start, first_row), min(end, first_row + num_rows)
        if high > low:
            batches.append(batch[0].slice(low - start, high - low))
        if position >= first_row + num_rows:
            break
    return pa.Table.from_batches(batches) if batches else pa.table({})


def _whole_row_groups(uri: str, first_row: int, num_rows: int) -> pa.Table | None:
    """The fast path: a Parquet range made of whole row groups, decoded in one call."""
    if file_format(uri) != "parquet":
        return None
    with open_input(uri) as handle:
        parquet = pq.ParquetFile(handle.reader)
        sizes = [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)]
        bounds = np.cumsum([0, *sizes])
        first, last = np.searchsorted(bounds, [first_row, first_row + num_rows])
        if bounds[first] != first_row or bounds[last] != first_row + num_rows:
            return None
        return parquet.read_row_groups(list(range(int(first), int(last))), use_threads=_THREADS)


def _batches_from(
    uri: str, first_row: int, reading: CsvReading
) -> Iterator[tuple[pa.RecordBatch, int]]:
    """(batch, its first row) from the row group holding `first_row` on (Parquet), or from
    the start of the file (other formats)."""
    if file_format(uri) != "parquet":
        position = 0
        for batch in iter_batches(uri, reading=reading):
            yield batch, position
            position += batch.num_rows
        return
    with open_input(uri) as handle:
        # Pages through a buffer of STREAM_BUFFER_BYTES, not whole column chunks read ahead
        # (pre_buffer): a piece inside a row group larger than max_piece_rows then holds a
        # batch and a buffer per column, not the group's chunks (3 M rows in one group:
        # 227 -> 130 MiB peak, as for the same rows in 65,536-row groups).
        parquet = pq.ParquetFile(handle.reader, buffer_size=STREAM_BUFFER_BYTES, pre_buffer=False)
        sizes = [parquet.metadata.row_group(g).num_rows for g in range(parquet.num_row_groups)]
        starts = np.concatenate([[0], np.cumsum(sizes)])
        first_group = int(np.searchsorted(starts, first_row, side="right")) - 1
        position = int(starts[first_group])
        groups = list(range(first_group, len(sizes)))
        for batch in parquet.iter_batches(_BATCH_ROWS, row_groups=groups, use_threads=_THREADS):
            yield batch, position
            position += batch.num_rows
