"""The scan record a rerun plans from (preprocessing/scan/scan_record.py): the scans it
gives back are exactly those stored, whatever their URIs, column names, labels and arrays
hold; a record cut short, changed, of another format version, version or listing is not
used, with the reason said. Whole reshards that resume from it are in test_kill.py."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec
from preprocessing.plan.counts import Counts
from preprocessing.scan.feature_stats import ColumnProfile
from preprocessing.scan.inputs import FileScan, scan_file
from preprocessing.scan.scan_record import (
    SCANS_NAME,
    RecordError,
    decode_scans,
    encode_scans,
    load_scans,
    store_scans,
)
from preprocessing.storage.sources import InputFile, list_inputs
from tests.log_records import messages, records_of
from tests.raw_tables import write_messy_files

VERSION = "0123456789abcdef"
LOGGER = "preprocessing.scan.scan_record"

# Any code point, lone surrogates too: URIs and column names are a user's strings.
HOSTILE = st.text(st.characters(exclude_categories=[]), max_size=12) | st.sampled_from(
    ["", "\x00", '\n{"t": 1}', "s3://b/ü/\ud800.parquet", 'a\\b"c', "t", "v", "\u2028"]
)
# Arrow's names are UTF-8: no lone surrogates, anything else.
COLUMN_NAMES = st.text(st.characters(exclude_categories=["Cs"]), max_size=12) | st.sampled_from(
    ["", "\x00", "__ballast_row", "ä b.c", "\u2028", '{"t": "schema"}', "💥"]
)
LABELS = (
    st.integers(-(2**70), 2**70)
    | st.booleans()
    | st.floats(allow_nan=False)
    | HOSTILE
    | st.none()
    | st.binary(max_size=8)
)
TYPES = st.sampled_from(
    [
        pa.int64(),
        pa.float32(),
        pa.string(),
        pa.bool_(),
        pa.timestamp("ms", tz="Europe/Paris"),
        pa.list_(pa.float32(), 8),
        pa.dictionary(pa.int32(), pa.string()),
        pa.struct([("a", pa.int8())]),
        pa.decimal128(12, 3),
    ]
)


@st.composite
def schemas(draw: st.DrawFn) -> pa.Schema:
    names = draw(st.lists(COLUMN_NAMES, min_size=1, max_size=4, unique=True))
    fields = [pa.field(name, draw(TYPES), nullable=draw(st.booleans())) for name in names]
    metadata = draw(st.none() | st.dictionaries(st.binary(max_size=6), st.binary(max_size=6)))
    return pa.schema(fields, metadata=metadata)


@st.composite
def profiles(draw: st.DrawFn) -> ColumnProfile:
    count = st.integers(0, 2**62)
    number = st.floats(allow_nan=True, allow_infinity=True)
    hashes = draw(st.lists(st.integers(0, 2**64 - 1), max_size=6, unique=True))
    return ColumnProfile(
        draw(HOSTILE),
        draw(st.sampled_from(["numeric", "category", "vector", "temporal"])),
        null_rows=draw(count),
        count=draw(count),
        mean=draw(number),
        m2=draw(number),
        max_length=draw(count),
        size=draw(count),
        values=draw(st.none() | st.sets(HOSTILE, max_size=5)),
        hashes=np.array(sorted(hashes), dtype=np.uint64),
    )


@st.composite
def file_scans(draw: st.DrawFn, shared: list[pa.Schema]) -> FileScan:
    uri, root, relative_path, tag = (draw(HOSTILE) for _ in range(4))
    file = InputFile(uri, root, relative_path, draw(st.integers(0, 2**63)), tag)
    records = draw(
        st.lists(
            st.tuples(
                st.integers(0, 9),
                st.sampled_from(["train", "holdout"]),
                LABELS,
                LABELS,
                st.integers(0, 2**40),
            ),
            max_size=6,
        )
    )
    pair = st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(-(2**63), 2**63 - 1))
    return FileScan(
        file,
        draw(st.none() | st.sampled_from(shared) | schemas()),
        draw(st.lists(st.integers(0, 2**40), max_size=6)),
        Counts.of(records),
        draw(st.none() | HOSTILE),
        draw(st.booleans()),
        draw(st.dictionaries(HOSTILE, profiles(), max_size=3)),
        draw(st.integers(0, 2**40)),
        draw(st.integers(0, 2**40)),
        draw(st.none() | pair),
    )


@st.composite
def scan_lists(draw: st.DrawFn) -> list[FileScan]:
    shared = [draw(schemas()) for _ in range(2)]  # most files of a version share a schema
    return draw(st.lists(file_scans(shared), max_size=6))


def assert_identical(found: Any, expected: Any, where: str = "scan") -> None:
    """`found` is `expected` rebuilt: same types all the way down, floats to the bit,
    arrays of the same dtype, shape and bytes, schemas with their metadata, dicts in order."""
    assert type(found) is type(expected), (where, found, expected)
    if dataclasses.is_dataclass(expected):
        for item in dataclasses.fields(expected):
            name = f"{where}.{item.name}"
            assert_identical(getattr(found, item.name), getattr(expected, item.name), name)
    elif isinstance(expected, dict):
        assert list(found) == list(expected), where
        for (key, value), (other_key, other) in zip(found.items(), expected.items(), strict=True):
            assert_identical(key, other_key, f"{where} key")
            assert_identical(value, other, f"{where}[{key!r}]")
    elif isinstance(expected, list | tuple):
        assert len(found) == len(expected), where
        for index, (item, other) in enumerate(zip(found, expected, strict=True)):
            assert_identical(item, other, f"{where}[{index}]")
    elif isinstance(expected, np.ndarray):
        assert (found.dtype, found.shape) == (expected.dtype, expected.shape), where
        assert found.tobytes() == expected.tobytes(), where
    elif isinstance(expected, float):
        assert struct.pack("<d", found) == struct.pack("<d", expected) or (
            math.isnan(found) and math.isnan(expected)
        ), (where, found, expected)
    elif isinstance(expected, pa.Schema):
        assert found.equals(expected, check_metadata=True), where
    else:
        assert found == expected, (where, found, expected)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scans=scan_lists())
def test_any_scans_come_back_exactly_as_stored(scans: list[FileScan]) -> None:
    """Invariant: decoding a record gives back scans identical to those encoded (types,
    floats to the bit incl. NaN, infinities and -0.0, uint64 arrays, schemas with metadata,
    hostile strings and lone surrogates), each distinct schema is stored once, and the
    record holds a line per scan and per schema between its header and its end line."""
    data = encode_scans(scans, VERSION)
    assert_identical(decode_scans(data, VERSION), scans, "scans")
    lines = [json.loads(line) for line in data.split(b"\n")[1:-2]]
    stored = [line["v"] for line in lines if line["t"] == "arrow-schema"]
    distinct = {s.schema.serialize().to_pybytes() for s in scans if s.schema is not None}
    assert len(stored) == len(distinct) and len(lines) == len(stored) + len(scans)


def test_the_scans_of_real_files_come_back_exactly_as_stored(tmp_path: Path) -> None:
    """Invariant: the scans `scan_file` makes of messy files (string, integer, timestamp
    and float features: profiles with value sets and distinct-value sketches; a file
    rejected) are rebuilt identical, and their JSON holds no pickle; an accepted scan holds
    its footer's decoded bytes (the row groups' uncompressed sizes, for the route)."""
    write_messy_files(tmp_path / "raw", 3_000)
    (tmp_path / "raw" / "part-9.parquet").write_bytes(b"PAR1 not a parquet file PAR1")
    spec = DatasetSpec(
        inputs=[str(tmp_path / "raw")],
        label_column="label",
        source_column=None,
        id_column="order_no",
        feature_columns=["ticket", "created", "x", "colour", "shop"],
        date_columns=["created"],
        unlabelled="drop",
    )
    scans = [scan_file(f, spec, 0, 0.2, 256) for f in list_inputs(spec)]
    assert scans[-1].reason and all(s.reason is None for s in scans[:-1])
    assert any(p.hashes.size and p.values for s in scans for p in s.profiles.values())
    for scan in scans[:-1]:
        metadata = pq.ParquetFile(scan.file.uri).metadata
        groups = range(metadata.num_row_groups)
        assert scan.decoded_bytes == sum(metadata.row_group(g).total_byte_size for g in groups) > 0
    data = encode_scans(scans, VERSION)
    assert_identical(decode_scans(data, VERSION), scans, "scans")
    assert b"pickle" not in data and b"__reduce__" not in data


def resealed(body: list[bytes], **header: Any) -> bytes:
    """A record of `body` lines under a header, with `header` changes, and an end line
    that vouches for both."""
    fields = {"format": "ballast-scans", "format_version": 6, "version_id": VERSION, **header}
    vouched = json.dumps(fields).encode() + b"\n" + b"".join(line + b"\n" for line in body)
    return vouched + json.dumps({"sha256": hashlib.sha256(vouched).hexdigest()}).encode() + b"\n"


def damaged_records(data: bytes) -> dict[str, tuple[bytes, str]]:
    """Ways a record goes bad, each with the words of the reason it must give."""
    lines = data.split(b"\n")
    header, body = lines[0], lines[1:-2]
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x01
    unknown = json.dumps({"t": "os.system", "v": "ls"}).encode()
    return {
        "cut short": (data[: len(data) // 2], "does not hash"),
        "header only": (header + b"\n", "does not hash"),
        "no end line": (data[: data.rindex(b"{")], "does not hash"),
        "a byte changed": (bytes(flipped), "does not hash"),
        "empty": (b"", "header is not JSON"),
        "not JSON": (b"\x00\xff garbage\n{}", "header is not JSON"),
        "another format": (resealed(body, format="other"), "not a ballast-scans record"),
        "format version 1": (resealed(body, format_version=1), "format version 1, not 6"),
        "format version 2 (no decoded bytes)": (
            resealed(body, format_version=2),
            "format version 2, not 6",
        ),
        "format version 3 (no time cells)": (
            resealed(body, format_version=3),
            "format version 3, not 6",
        ),
        "format version 4 (no content pairs)": (
            resealed(body, format_version=4),
            "format version 4, not 6",
        ),
        "format version 5 (pairs without their repeated ids)": (
            resealed(body, format_version=5),
            "format version 5, not 6",
        ),
        "another version": (resealed(body, version_id="fedcba9876543210"), "of version"),
        "payload not JSON": (resealed([b"{not json"]), "not a record of scans"),
        "an unknown tag": (resealed([unknown]), "unknown tag"),
        "a field too many": (
            resealed(
                [line.replace(b'"transient":', b'"extra":0,"transient":', 1) for line in body]
            ),
            "FileScan with fields",
        ),
        "a schema not Arrow": (
            resealed(
                [
                    line.replace(b'"arrow-schema","v":"', b'"arrow-schema","v":"AAAA', 1)
                    for line in body
                ]
            ),
            "not a record of scans",
        ),
        "not a list of scans": (
            resealed([json.dumps({"t": "tuple", "v": []}).encode()]),
            "not a list of scans",
        ),
        "a scan before its schema": (resealed(body[1:]), "not a record of scans"),
    }


def some_scans() -> list[FileScan]:
    schema = pa.schema([("label", pa.string()), ("x", pa.float64())])
    profile = ColumnProfile("double", "numeric", 1, 2, 0.5, 1.5, hashes=np.arange(3, dtype="u8"))
    return [
        FileScan(
            InputFile(f"/raw/part-{i}.parquet", "/raw", f"part-{i}.parquet", 100 + i, f"{i}.0"),
            schema,
            [60, 40],
            Counts.of([(0, "train", "a", "/raw", 60), (1, "holdout", "b", "/raw", 40)]),
            profiles={"x": profile},
            id_range=(i * 100, i * 100 + 99),
        )
        for i in range(3)
    ]


@pytest.mark.parametrize("case", sorted(damaged_records(encode_scans(some_scans(), VERSION))))
def test_a_damaged_record_is_refused_with_its_reason(case: str) -> None:
    """Invariant: a record cut short, changed, not JSON, of another format, format
    version or version id, or whose payload is not scans as written, is refused with a
    RecordError whose message says which."""
    data, reason = damaged_records(encode_scans(some_scans(), VERSION))[case]
    with pytest.raises(RecordError, match=reason):
        decode_scans(data, VERSION)


def test_a_rerun_uses_a_stored_record_and_scans_again_without_a_usable_one(tmp_path) -> None:
    """Invariants: scans stored in an attempt load back for the same version and listing
    (the run log says "scan kept: the scans of 3 input files"); with no record, a damaged
    one, another version's or another listing's, `load_scans` gives None and warns naming
    the record and why; a scan a record cannot hold, met part way through the streamed
    record, leaves no record and no temporary file, with a warning."""
    attempt, scans = tmp_path / "attempt", some_scans()
    files = [scan.file for scan in scans]
    record = attempt / SCANS_NAME
    with records_of(LOGGER, logging.INFO) as logged:
        assert load_scans(str(attempt), VERSION, files) is None
        store_scans(str(attempt), VERSION, scans)
        assert_identical(load_scans(str(attempt), VERSION, files), scans)
        assert load_scans(str(attempt), "fedcba9876543210", files) is None
        assert load_scans(str(attempt), VERSION, files[:2]) is None
        record.write_bytes(record.read_bytes()[:-1])
        assert load_scans(str(attempt), VERSION, files) is None
    lines = messages(logged).splitlines()
    assert lines[0] == f"scan record {record} not used: there is none " + (
        "(the attempt died before its scan ended); scanning again"
    )
    assert lines[1] == "scan kept: the scans of 3 input files"
    assert "of version '0123456789abcdef', not fedcba9876543210" in lines[2]
    assert "its files are not the ones listed" in lines[3]
    assert "does not hash to its sha256" in lines[4] and str(record) in lines[4]
    assert [r.levelno for r in logged] == [logging.WARNING, logging.INFO, *[logging.WARNING] * 3]
    record.unlink()
    odd = [scans[0], dataclasses.replace(scans[1], counts=Counts(b"", (object(),), ()))]
    with records_of(LOGGER) as logged:
        store_scans(str(attempt), VERSION, odd)  # fails after its first lines are written
    assert not list(attempt.iterdir()) and "a record cannot hold" in messages(logged)
