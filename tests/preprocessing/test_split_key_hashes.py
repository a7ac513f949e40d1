"""The vectorised value hashes of preprocessing/plan/split_keys.py against their definition
(the module doc), written here one value at a time in plain Python, pure: for hostile
values (NaN of any bits, -0.0, nulls, nulls inside lists, empty and non-ASCII strings,
strings of one length, long lists, odd element widths) every row's hash is the
definition's, whatever rows share its batch, slice or chunk."""

from __future__ import annotations

import hashlib
import struct
from decimal import Decimal

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.plan.permutation import derive_key
from preprocessing.plan.split_keys import NULL_HASH, column_hashes, row_hashes

MASK = (1 << 64) - 1
PACK = {  # struct formats of the fixed-width element types the tables below use
    pa.int8(): "<b",
    pa.int16(): "<h",
    pa.int64(): "<q",
    pa.float32(): "<f",
    pa.float64(): "<d",
}


def mix(value: int, key: int) -> int:
    """splitmix64's finaliser of value + key, as plan/permutation.py: mix64."""
    z = (value + key) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def word_sum(data: bytes) -> int:
    """The bytes padded to 8-byte words, each word times its place's (odd) key, summed."""
    data += bytes(-len(data) % 8)
    words = struct.unpack(f"<{len(data) // 8}Q", data)
    keys = (mix(place, derive_key("word place")) | 1 for place in range(len(words)))
    return sum(word * key for word, key in zip(words, keys, strict=False)) & MASK


def reference(value: object, kind: pa.DataType) -> int:
    """The module doc's hash of one value of type `kind`."""
    if value is None:
        return int(NULL_HASH)
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return mix(int(value) & MASK, derive_key("integer"))  # type: ignore[call-overload]
    if pa.types.is_floating(kind):
        bits = struct.unpack("<Q", struct.pack("<d", value))[0]
        return mix(bits, derive_key("float"))
    if pa.types.is_temporal(kind):  # the tables below hold temporal values as stored
        return mix(int(value) & MASK, derive_key(str(kind)))  # type: ignore[call-overload]
    if isinstance(value, str | bytes):
        data = value.encode() if isinstance(value, str) else value
        return mix(word_sum(data) ^ len(data), derive_key("text"))
    if isinstance(value, list):
        return reference_list(value, kind)
    digest = hashlib.blake2b(f"{kind}:{value!r}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def reference_list(values: list[object], kind: pa.DataType) -> int:
    """A fixed-size list of numbers free of nulls by the bytes of its values as stored;
    any other list element by element, each keyed by its place."""
    element = kind.value_type
    if pa.types.is_fixed_size_list(kind) and element in PACK and None not in values:
        data = b"".join(struct.pack(PACK[element], value) for value in values)
        return mix(word_sum(data), derive_key("fixed list", str(kind)))
    total = sum(mix(reference(value, element), place) for place, value in enumerate(values))
    return mix((total & MASK) ^ len(values), derive_key("list"))


# Floats of any NaN bits (hypothesis draws signalling and negative NaNs too), -0.0, inf.
FLOATS = st.one_of(st.floats(allow_nan=True), st.sampled_from([0.0, -0.0, float("nan")]))
TEXTS = st.one_of(st.text(max_size=40), st.sampled_from(["", "é", "a\x00", "日本語のテキスト"]))
COLUMNS = {  # name: (Arrow type, one value's strategy: values as stored)
    "int": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "small": (pa.int8(), st.integers(-128, 127)),
    "flag": (pa.bool_(), st.booleans()),
    "float": (pa.float64(), FLOATS),
    "when": (pa.timestamp("us", tz="UTC"), st.integers(-(2**62), 2**62)),
    "day": (pa.date32(), st.integers(-(2**31), 2**31 - 1)),
    "text": (pa.string(), TEXTS),
    "bytes": (pa.large_binary(), st.binary(min_size=11, max_size=11)),  # one length
    "vector": (
        pa.list_(pa.float64(), 3),
        st.lists(st.one_of(st.none(), FLOATS), min_size=3, max_size=3),
    ),
    "vector32": (
        pa.list_(pa.float32(), 40),
        st.lists(st.floats(width=32), min_size=40, max_size=40),
    ),
    "odd": (
        pa.list_(pa.int16(), 3),
        st.lists(st.integers(-(2**15), 2**15 - 1), min_size=3, max_size=3),
    ),
    "long": (pa.list_(pa.int64()), st.lists(st.one_of(st.none(), st.integers(0, 9)), max_size=300)),
    "words": (pa.large_list(pa.string()), st.lists(st.one_of(st.none(), TEXTS), max_size=5)),
    "price": (pa.decimal128(10, 2), st.decimals(-(10**7), 10**7, places=2, allow_nan=False)),
}


def arrow_column(kind: pa.DataType, values: list[object]) -> pa.Array:
    """The values as an Arrow array of `kind` (temporal values given as stored)."""
    if pa.types.is_temporal(kind):
        storage = pa.int32() if kind.bit_width == 32 else pa.int64()
        return pa.array(values, storage).view(kind)
    if pa.types.is_decimal(kind):
        return pa.array([None if v is None else Decimal(v) for v in values], kind)
    return pa.array(values, kind)


@st.composite
def columns(draw: st.DrawFn) -> tuple[pa.DataType, list[object]]:
    """One column's type and values, nulls among them (a null list too)."""
    kind, value = COLUMNS[draw(st.sampled_from(sorted(COLUMNS)))]
    return kind, draw(st.lists(st.one_of(st.none(), value), min_size=1, max_size=25))


@settings(max_examples=300, deadline=None)
@given(columns(), st.data())
def test_every_value_hashes_as_its_definition_whatever_its_neighbours(drawn, data):
    """Invariant: `column_hashes` gives every row the definition's hash of its own value,
    on the whole array, on any slice of it and on it cut into chunks (a scan's batch, a
    map's piece): no row's hash depends on the rows beside it."""
    kind, values = drawn
    array = arrow_column(kind, values)
    as_read = array.to_pylist() if pa.types.is_decimal(kind) else values  # repr: as Arrow holds it
    expected = [reference(value, kind) for value in as_read]
    assert column_hashes(array).tolist() == expected
    start = data.draw(st.integers(0, len(values)))
    stop = data.draw(st.integers(start, len(values)))
    assert column_hashes(array.slice(start, stop - start)).tolist() == expected[start:stop]
    chunked = pa.chunked_array([array.slice(0, start), array.slice(start)], kind)
    assert column_hashes(chunked).tolist() == expected
    if pa.types.is_string(kind):  # dictionary-encoded strings hash as the plain ones
        assert column_hashes(array.dictionary_encode()).tolist() == expected


@settings(max_examples=50, deadline=None)
@given(st.lists(columns(), min_size=1, max_size=4), st.integers(0, 20))
def test_a_rows_hash_is_its_columns_hashes_folded_in_order(drawn, rows):
    """Invariant: a row's split key (`row_hashes`) is its columns' hashes folded in the
    order the columns are named, each step keyed by the column's place."""
    rows = min([rows, *(len(values) for _, values in drawn)])
    names = [f"c{i}" for i in range(len(drawn))]
    table = pa.table(
        {
            name: arrow_column(kind, values[:rows])
            for name, (kind, values) in zip(names, drawn, strict=True)
        }
    )
    expected = []
    for row in range(rows):
        folded = 0
        for position, (kind, values) in enumerate(drawn):
            folded = mix(folded ^ reference(values[row], kind), derive_key("column", position))
        expected.append(folded)
    assert row_hashes(table, names).tolist() == expected
