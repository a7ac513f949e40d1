"""Which split a row goes to: the one decision the scan (which counts the splits) and the
exchange (which routes the rows) both make, from the row's own values.

Without `dataset.group_column` or `dataset.duplicates` a row's draw is a function of
(seed, file, row index), as it always was (`plan.row_fates.holdout_mask`). With them the
draw is a function of (seed, a hash of the row's split key): the group's value when
`group_column` is set, else with `duplicates: same_split` or `drop` the row's content
(label, then feature columns; `drop` also keeps one copy: plan/first_copies.py). A
duplicate is a row equal in label, features and group (when set), so under a group
every duplicate set sits in one group and follows it. Equal keys draw
alike in any file, piece or night, so a group or a duplicate content never crosses
splits and stays on its side in every later child of a chain, with no index kept and no
pass of its own.

Values are hashed as written: integers by value whatever their width, floats by the bits
of their float64, strings and binaries by their bytes (8 at a time, vectorised),
timestamps and dates by their stored integer tagged with the type, fixed-size lists of
numbers by the bytes of their values as stored (one holding a null element as other
lists are), other lists element by element in order, any other type by the repr of its
Python value (slow, but exact). A null hashes to one fixed value. A value's hash is a
function of the value alone, never of the rows read beside it (a scan's batch, a map's
piece): tests/preprocessing/test_split_key_hashes.py checks each path against this
definition written one value at a time.

Under `holdout_by: newest` the split is the night's time cut (plan/time_cut.py), known only
once every file is counted: the scan's `held_out` holds no row out (it counts rows by
their time cell instead) and the routes pass the cut to `validation_split.row_splits`.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from preprocessing.config import DatasetSpec
from preprocessing.plan.permutation import derive_key, mix64, unit_interval
from preprocessing.plan.row_fates import holdout_mask

NULL_HASH = np.uint64(derive_key("null value"))
TEXT_ROWS = 1 << 16  # strings hashed this many at a time: index arrays of 8 bytes a byte


def split_key_columns(spec: DatasetSpec) -> list[str]:
    """The columns whose values decide a row's split; empty: (file, row) decides. The
    group wins: a duplicate's content holds its group, so it follows the group too."""
    if spec.group_column:
        return [spec.group_column]
    return content_columns(spec) if spec.duplicates != "keep" else []


def content_columns(spec: DatasetSpec) -> list[str]:
    """The columns whose equal values make two rows duplicates (whatever `duplicates` is)."""
    group = [spec.group_column] if spec.group_column else []
    return list(dict.fromkeys([spec.label_column, *spec.feature_columns, *group]))


def content_in_map(spec: DatasetSpec) -> bool:
    """Whether the exchange, not the scan, hashes the content for the manifest's tally:
    under a group with `same_split` the content decides no split, and the exchange decodes
    every column anyway, while the scan would decode the feature columns (a vector it
    otherwise skips) for the tally alone. `drop` needs the content in the scan (its pairs),
    and without a group the content is the split."""
    return bool(spec.group_column) and spec.duplicates == "same_split"


def key_columns(spec: DatasetSpec) -> list[str]:
    """The columns a scan reads for the split and for the manifest's tally of keys."""
    tallied = spec.duplicates != "keep" and not content_in_map(spec)
    content = content_columns(spec) if tallied else []
    return list(dict.fromkeys([*split_key_columns(spec), *content]))


def key_hashes(
    table: pa.Table | pa.RecordBatch, spec: DatasetSpec, tally: bool = True
) -> dict[str, np.ndarray]:
    """Per row, a hash of its `group` (with group_column) and of its `content` (with
    `duplicates: same_split` or `drop`, or for the tally whenever duplicates is not `keep`;
    the scan asks for the tally's unless `content_in_map`)."""
    keys: dict[str, np.ndarray] = {}
    columns: dict[str, np.ndarray] = {}  # a group column in the content is hashed once
    if spec.group_column:
        keys["group"] = row_hashes(table, [spec.group_column], columns)
    if (spec.duplicates != "keep" and not spec.group_column) or (
        tally and spec.duplicates != "keep"
    ):
        keys["content"] = row_hashes(table, content_columns(spec), columns)
    return keys


def held_out(
    keys: dict[str, np.ndarray],
    spec: DatasetSpec,
    file_key: str,
    first_row: int,
    num_rows: int,
    seed: int,
    fraction: float,
) -> np.ndarray:
    """True for rows `first_row`.. of file `file_key` held out, from their `key_hashes`
    (none under a time holdout: the scan counts its cells, the plan cuts)."""
    split = keys.get("group") if spec.group_column else keys.get("content")
    if spec.holdout_by == "newest":  # the night's cut is known only once all are counted
        return np.zeros(num_rows, dtype=bool)
    if split is None or fraction <= 0:
        return holdout_mask(file_key, first_row, num_rows, seed, fraction)
    return unit_interval(split, derive_key(seed, "holdout", "value")) < fraction


def holdout_rows(
    table: pa.Table | pa.RecordBatch,
    spec: DatasetSpec,
    file_key: str,
    first_row: int,
    seed: int,
    fraction: float,
) -> np.ndarray:
    """True for the rows of `table` (rows `first_row`.. of file `file_key`) held out
    (under a time holdout, none: the night's cut routes them, `validation_split.row_splits`)."""
    keys = key_hashes(table, spec, tally=False) if fraction > 0 else {}
    return held_out(keys, spec, file_key, first_row, table.num_rows, seed, fraction)


def row_hashes(
    table: pa.Table | pa.RecordBatch, columns: list[str], cache: dict | None = None
) -> np.ndarray:
    """A 64-bit hash per row of the values of `columns`, in that order; `cache` keeps
    each column's hashes for another call on the same table."""
    cache = {} if cache is None else cache
    hashes = np.zeros(table.num_rows, dtype=np.uint64)
    for position, name in enumerate(columns):
        if name not in cache:
            cache[name] = column_hashes(table.column(name))
        hashes ^= cache[name]
        hashes = mix64(hashes, derive_key("column", position))
    return hashes


def column_hashes(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit hash of every value of `column` (see the module doc)."""
    if isinstance(column, pa.ChunkedArray):
        chunks = [column_hashes(chunk) for chunk in column.chunks]
        return np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint64)
    kind = column.type
    if pa.types.is_dictionary(kind):
        return _dictionary(column)
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return _with_nulls(column, _numbers(column.cast(pa.int64(), safe=False), "integer"))
    if pa.types.is_floating(kind):
        bits = column.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
        return _with_nulls(column, mix64(bits.view(np.uint64), derive_key("float")))
    if pa.types.is_temporal(kind) and kind.bit_width in (32, 64):
        stored = column.view(pa.int32() if kind.bit_width == 32 else pa.int64())
        return _with_nulls(column, _numbers(stored.cast(pa.int64()), str(kind)))
    if _is_text(kind):
        return _texts(column)
    if pa.types.is_fixed_size_list(kind) and _fixed_width(kind.value_type):
        return _fixed_lists(column)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return _lists(column)
    return _reprs(column)


def _numbers(values: pa.Array, tag: str) -> np.ndarray:
    raw = values.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    return mix64(raw.view(np.uint64), derive_key(tag))


def _with_nulls(column: pa.Array, hashes: np.ndarray) -> np.ndarray:
    if column.null_count:
        hashes[column.is_null().to_numpy(zero_copy_only=False)] = NULL_HASH
    return hashes


def _dictionary(column: pa.DictionaryArray) -> np.ndarray:
    """A dictionary-encoded value as its plain value: its entry's hash, a null index the
    null's (an entry past the dictionary: a batch of nulls may have an empty one)."""
    entries = np.r_[column_hashes(column.dictionary), NULL_HASH].astype(np.uint64)
    filled = column.indices.fill_null(len(column.dictionary))
    return entries[filled.to_numpy(zero_copy_only=False).astype(np.int64)]


def _is_text(kind: pa.DataType) -> bool:
    return any(
        check(kind)
        for check in (
            pa.types.is_string,
            pa.types.is_large_string,
            pa.types.is_binary,
            pa.types.is_large_binary,
        )
    )


def _texts(column: pa.Array) -> np.ndarray:
    """Strings and binaries by their bytes, vectorised: each value padded to 8-byte words,
    each word times its place's key, the words of a value summed; TEXT_ROWS at a time."""
    column = column.cast(pa.large_binary())
    parts = [
        _text_slice(column.slice(start, TEXT_ROWS)) for start in range(0, len(column), TEXT_ROWS)
    ]
    hashes = np.concatenate(parts) if parts else np.zeros(0, np.uint64)
    return _with_nulls(column, hashes)


def _text_slice(column: pa.Array) -> np.ndarray:
    offsets = np.frombuffer(column.buffers()[1], np.int64)[
        column.offset : column.offset + len(column) + 1
    ]
    data = column.buffers()[2]
    values = (
        np.frombuffer(data, np.uint8)[offsets[0] : offsets[-1]] if data else np.zeros(0, np.uint8)
    )
    lengths = np.diff(offsets)
    if len(lengths) and lengths[0] > 0 and (lengths == lengths[0]).all():  # ids, uuids
        sums = _row_words(values.reshape(len(lengths), int(lengths[0])))
        return mix64(sums ^ lengths.astype(np.uint64), derive_key("text"))
    words = (lengths + 7) // 8
    first_word = np.r_[0, np.cumsum(words)]
    padded = np.zeros(int(first_word[-1]) * 8, np.uint8)
    shift = np.repeat(first_word[:-1] * 8 - (offsets[:-1] - offsets[0]), lengths)
    padded[np.arange(len(values)) + shift] = values
    places = np.arange(first_word[-1]) - np.repeat(first_word[:-1], words)
    with np.errstate(over="ignore"):
        keyed = padded.view(np.uint64) * _place_keys(int(words.max(initial=0)))[places]
    return mix64(_segment_sums(keyed, first_word) ^ lengths.astype(np.uint64), derive_key("text"))


def _segment_sums(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Wrapping uint64 sums of `values[starts[i]:starts[i + 1]]`."""
    totals = np.r_[np.uint64(0), np.cumsum(values, dtype=np.uint64)]
    with np.errstate(over="ignore"):
        return totals[starts[1:]] - totals[starts[:-1]]


def _fixed_width(kind: pa.DataType) -> bool:
    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


def _fixed_lists(column: pa.FixedSizeListArray) -> np.ndarray:
    """Fixed-size lists of numbers by the bytes of their values as stored, 8 at a time,
    each word times its place's key (a vector of 64 float32 is 32 words); a list holding a
    null element hashes element by element (`_lists`). Each row takes its path by its own
    elements, so its hash does not depend on the rows beside it in a batch or a piece."""
    size, width = column.type.list_size, column.type.value_type.bit_width // 8
    values = column.values  # the child, whole: a slice of the list keeps its offset
    first = values.offset + column.offset * size
    data = values.buffers()[1]
    raw = np.frombuffer(data, np.uint8) if data else np.zeros(0, np.uint8)
    rows = raw[first * width : (first + len(column) * size) * width]
    words = _row_words(rows.reshape(len(column), size * width))
    hashes = mix64(words, derive_key("fixed list", str(column.type)))
    holed = _null_elements(column, values.slice(first - values.offset, len(column) * size))
    if holed.any():
        hashes[holed] = _lists(column.filter(pa.array(holed)))
    return _with_nulls(column, hashes)


def _null_elements(column: pa.FixedSizeListArray, elements: pa.Array) -> np.ndarray:
    """Per row of `column`, a list (not null itself) holding a null element."""
    if not elements.null_count:
        return np.zeros(len(column), dtype=bool)
    size = column.type.list_size
    nulls = elements.is_null().to_numpy(zero_copy_only=False).reshape(len(column), size)
    return nulls.any(axis=1) & column.is_valid().to_numpy(zero_copy_only=False)


def _row_words(rows: np.ndarray) -> np.ndarray:
    """Per row of `rows` (bytes, one row a value), its bytes padded to 8-byte words, each
    word times its place's key, summed (wrapping): as `_text_slice` sums a string."""
    pad = -rows.shape[1] % 8
    if pad:
        rows = np.pad(rows, ((0, 0), (0, pad)))
    words = np.ascontiguousarray(rows).view(np.uint64)
    # One product of the (rows, words) matrix with the keys: numpy's integer matmul wraps
    # as the sum does, reads each row once in order, and is 7x faster than a pass per
    # word place (which strides over every row 32 times for a vector of 64 float32).
    return words @ _place_keys(words.shape[1])


def _place_keys(count: int) -> np.ndarray:
    """An odd 64-bit key per word place: a word times its place's key is one to one, and
    the sum of a value's words is mixed once (mix64) rather than every word."""
    return mix64(np.arange(count, dtype=np.uint64), derive_key("word place")) | np.uint64(1)


def _lists(column: pa.Array) -> np.ndarray:
    """Lists element by element, each element keyed by its place in its list."""
    lengths = pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False)
    elements = pc.list_flatten(column)
    starts = np.r_[0, np.cumsum(lengths)].astype(np.int64)
    places = np.arange(len(elements), dtype=np.int64) - np.repeat(starts[:-1], lengths)
    keyed = mix64(column_hashes(elements), places.astype(np.uint64))
    sums = _segment_sums(keyed, starts)
    hashes = mix64(sums ^ lengths.astype(np.uint64), derive_key("list"))
    return _with_nulls(column, hashes)


def _reprs(column: pa.Array) -> np.ndarray:
    hashes = [_digest(f"{column.type}:{value!r}".encode()) for value in column.to_pylist()]
    return _with_nulls(column, np.array(hashes, dtype=np.uint64))


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")
