"""A wide manifest read fast, and read the same: the parse is `json.loads`'s, value for
value, type for type and error for error (orjson where it agrees); the type checks of many
values at once answer as the one-by-one checks do; the codec built by position equals the
one built by keyword; and a damaged wide manifest is still refused, naming the file and
the field, on the fast path (benchmarks/RESULTS.md M94)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.contract.codec import FeatureCodec
from preprocessing.contract.column_spec import ColumnSpec
from preprocessing.contract.documents import read_document
from preprocessing.contract.fields import _all_checker, _checker
from preprocessing.contract.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestError,
    ShardEntry,
    SplitEntry,
    read_manifest,
)

SURROGATES = st.sampled_from(["\ud800", "\udfff", "a\ud83dz"])
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),  # unbounded: past 64 bits, where orjson reads a float
    st.integers(-(2**70), 2**70),
    st.floats(),  # NaN, infinities, -0.0, subnormals
    st.text(max_size=8),
    SURROGATES,
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=4), inner, max_size=4)
    ),
    max_leaves=12,
)
NUMBER = r"-?(0|[1-9][0-9]{0,30})(\.[0-9]{1,30})?([eE][-+]?[0-9]{1,4})?"
NUMBERS = st.from_regex(NUMBER, fullmatch=True)
JSON_BYTES = ' \t\n\r[]{}:,"\\-+.0123456789eEaflnrstuINTy\x00\x7f'


@st.composite
def documents(draw: st.DrawFn) -> str:
    """JSON texts as `json.dumps` writes hostile values (NaN, 70-bit ints, surrogates),
    number literals of any length, and such texts with one character changed."""
    kind = draw(st.sampled_from(["dumps", "number", "changed", "junk"]))
    if kind == "number":
        return f"[{draw(NUMBERS)}, {draw(NUMBERS)}]"
    if kind == "junk":
        return draw(st.text(alphabet=JSON_BYTES, max_size=30))
    text = json.dumps(draw(VALUES), ensure_ascii=draw(st.booleans()))
    if kind == "changed" and text:
        at = draw(st.integers(0, len(text) - 1))
        text = text[:at] + draw(st.sampled_from(JSON_BYTES)) + text[at + 1 :]
    return text


def typed(value: Any) -> Any:
    """`value` with every leaf's type beside it, floats by repr (NaN equals NaN, -0.0 is
    not 0.0): two parses are the same when these are equal."""
    if isinstance(value, dict):
        return ("dict", [(key, typed(item)) for key, item in value.items()])
    if isinstance(value, list):
        return ("list", [typed(item) for item in value])
    return (type(value).__name__, repr(value) if isinstance(value, float) else value)


def outcome(parse: Any, text: str | bytes) -> Any:
    try:
        return ("value", typed(parse(text)))
    except (ValueError, RecursionError) as error:
        return ("error", type(error).__name__, str(error))


@settings(max_examples=600, deadline=None)
@given(documents(), st.booleans())
def test_parse_equals_the_standard_library(text: str, as_bytes: bool) -> None:
    """Whatever the text (hostile values, long numbers, damage), `read_document` returns
    what `json.loads` returns, of the same types, or raises its error, word for word."""
    data: str | bytes = text.encode(errors="surrogatepass") if as_bytes else text
    assert outcome(read_document, data) == outcome(json.loads, data)


@pytest.mark.parametrize(
    "literal",
    ["18446744073709551616", "-9223372036854775809", "1" + "0" * 40, "1e400", "NaN", "-Infinity"],
)
def test_values_orjson_reads_otherwise_keep_the_standard_type(literal: str) -> None:
    """An integer past 64 bits stays an exact int (orjson alone makes it a float);
    NaN, infinities and overflows read as `json.loads` reads them."""
    found = read_document(f'{{"x": [{literal}, 1.5]}}')["x"]
    expected = json.loads(f"[{literal}, 1.5]")
    assert type(found[0]) is type(expected[0])
    assert found[0] == expected[0] or (math.isnan(found[0]) and math.isnan(expected[0]))


class Name(str):
    """A str subclass: its check goes one by one, as before."""


HOSTILE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([2**63 - 1, -(2**63) + 1, 2**63, -(2**63)]),
    st.floats(),
    st.text(max_size=3),
    st.builds(Name, st.text(max_size=3)),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.one_of(st.text(max_size=2), st.integers()), max_size=3),
)
HINTS = [str, int, float, bool, dict[str, str], dict[str, int], dict[str, float], list[int]]


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(HINTS), st.lists(HOSTILE, max_size=6))
def test_many_values_checked_at_once_as_one_by_one(hint: Any, values: list[Any]) -> None:
    """For every hint a manifest's containers hold, the check of all values at once
    answers exactly as checking each value on its own does."""
    one = _checker(hint, 1)
    many = _all_checker(hint, 1)
    assert one is not None and many is not None
    assert many(iter(values)) == all(map(one, values))


def wide_columns(count: int) -> list[dict[str, Any]]:
    specs = [
        ColumnSpec(f"x{i}", "numeric", "float", shift=i / 7, scale=1 + i / 3, null_count=i % 3)
        for i in range(count)
    ]
    return FeatureCodec(tuple(specs)).to_json()


def test_codec_by_position_equals_codec_by_keyword() -> None:
    """Specs as the writer writes them (every field) build the same codec as keywords;
    a spec with an unknown field is still refused, one missing a field takes its default."""
    columns = wide_columns(300)
    by_keyword = FeatureCodec(tuple(ColumnSpec(**column) for column in columns))
    assert FeatureCodec.from_json(columns) == by_keyword
    with pytest.raises(TypeError, match="colour"):
        FeatureCodec.from_json([*columns[:-1], {**columns[-1], "colour": 1}])
    shorter = [{k: v for k, v in column.items() if k != "num_buckets"} for column in columns]
    assert FeatureCodec.from_json(shorter) == by_keyword


def wide_manifest(count: int) -> Manifest:
    shard = ShardEntry("split=train/train-00000.parquet", 10, 100, 1, 10, "0" * 64, {"a": 10}, {})
    return Manifest(
        version_id="wide",
        label_column="label",
        source_column="source",
        id_column="id",
        feature_columns=[f"x{i}" for i in range(count)],
        classes=["a"],
        sources=[],
        arrow_schema=[{"name": f"x{i}", "type": "float"} for i in range(count)],
        splits={"train": SplitEntry(10, [shard])},
        seed=1,
        config={},
        input_fingerprint="f",
        input_class_counts={"a": 10},
        input_source_counts={},
        features={"columns": wide_columns(count)},
        timings_s={"scan_s": 1.0},
    )


def set_in(path: tuple[Any, ...], value: Any) -> Any:
    def change(raw: dict[str, Any]) -> None:
        target = raw
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


DAMAGE = {
    "a schema type not a string": (set_in(("arrow_schema", 7, "type"), 5), "arrow_schema"),
    "a schema type null": (
        set_in(("arrow_schema", 9), {"name": "x9", "type": None}),
        "arrow_schema",
    ),
    "a feature name a number": (set_in(("feature_columns", 300), 300), "feature_columns"),
    "a feature name a bool": (set_in(("feature_columns", 0), True), "feature_columns"),
    # orjson alone reads 2**64 as a float, which a float field would take
    "a timing past 64 bits": (set_in(("timings_s", "scan_s"), 2**64), "timings_s"),
    "a count past 64 bits": (
        set_in(("splits", "train", "shards", 0, "num_rows"), 2**64),
        "num_rows",
    ),
    "a count a float": (set_in(("input_class_counts", "a"), 10.0), "input_class_counts"),
}


@pytest.mark.parametrize("case", DAMAGE)
def test_damaged_wide_manifest_is_refused_naming_file_and_field(tmp_path: Path, case: str) -> None:
    """A wide manifest (500 columns) with one value damaged (`case`) is refused by
    `read_manifest` with a ManifestError naming the manifest's file and the field;
    the undamaged one reads back equal to what was written."""
    directory = tmp_path / "v-wide"
    directory.mkdir()
    path = directory / MANIFEST_NAME
    manifest = wide_manifest(500)
    path.write_text(manifest.to_json())
    assert read_manifest(str(directory))[0] == manifest
    change, field = DAMAGE[case]
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))
    with pytest.raises(ManifestError, match=re.escape(str(path))) as refused:
        read_manifest(str(directory))
    assert field in str(refused.value)
