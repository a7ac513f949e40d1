"""The split of a row from its values (preprocessing/plan/split_keys.py), pure: groups and
duplicate contents never cross splits, whatever the values, files, pieces and seed; the
default settings keep today's draw by (file, row); values hash as written."""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec
from preprocessing.plan.key_tally import SAMPLE, TOP, merge_keys, split_value_stats, tally_keys
from preprocessing.plan.permutation import mix64
from preprocessing.plan.row_fates import holdout_mask
from preprocessing.plan.split_keys import (
    column_hashes,
    content_columns,
    holdout_rows,
    key_hashes,
)
from preprocessing.scan.columns import configured_columns, row_problem
from preprocessing.scan.inputs import FileScan
from preprocessing.scan.scan_record import decode_scans, encode_scans
from preprocessing.storage.sources import InputFile

# Hostile values: NaN and -0.0, empty and non-ASCII strings, nulls in features.
GROUPS = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.text(max_size=4), st.sampled_from(["", "é", "0", "a\x00"])
)
FLOATS = st.one_of(st.none(), st.floats(allow_nan=True), st.sampled_from([0.0, -0.0]))


@st.composite
def tables(draw: st.DrawFn) -> tuple[pa.Table, list[int]]:
    """A table with a group column (ints or strings), a label, a float, a list and a
    fixed-size list feature,
    with rows repeated (duplicates), cut into files at random places."""
    as_text = draw(st.booleans())
    base = draw(st.lists(st.tuples(GROUPS, st.integers(0, 2), FLOATS), min_size=1, max_size=30))
    copies = draw(st.lists(st.integers(0, len(base) - 1), max_size=20))
    rows = [base[i] for i in [*range(len(base)), *copies]]
    rows = draw(st.permutations(rows))
    table = pa.table(
        {
            "group": [str(g) if as_text else hash(g) for g, _, _ in rows],
            "label": [label for _, label, _ in rows],
            "x": pa.array([x for _, _, x in rows], pa.float64()),
            "v": [[label, 1] if x is None else [label] for _, label, x in rows],
            "w": pa.array(
                [None if x is None else [x, float(label)] for _, label, x in rows],
                pa.list_(pa.float64(), 2),
            ),
        }
    )
    cuts = sorted(draw(st.lists(st.integers(0, len(rows)), max_size=4)))
    return table, cuts


def spec_of(group: bool, duplicates: str) -> DatasetSpec:
    return DatasetSpec(
        inputs=["raw"],
        source_column=None,
        feature_columns=["x", "v", "w"],
        group_column="group" if group else None,
        duplicates=duplicates,  # type: ignore[arg-type]
    )


def held_out_in_files(
    table: pa.Table, cuts: list[int], spec: DatasetSpec, seed: int, fraction: float
) -> np.ndarray:
    """The draw of every row, the table read as files cut at `cuts`, each in two pieces."""
    bounds = [0, *cuts, table.num_rows]
    parts = []
    for index, (start, stop) in enumerate(pairwise(bounds)):
        middle = (start + stop) // 2
        for first, last in ((start, middle), (middle, stop)):
            piece = table.slice(first, last - first)
            parts.append(holdout_rows(piece, spec, f"f{index}", first - start, seed, fraction))
    return np.concatenate(parts)


def crossing(keys: list[object], held_out: np.ndarray) -> list[object]:
    sides: dict[object, set[bool]] = defaultdict(set)
    for key, side in zip(keys, held_out.tolist(), strict=True):
        sides[key].add(side)
    return [key for key, seen in sides.items() if len(seen) > 1]


def content(table: pa.Table, columns: list[str]) -> list[object]:
    """Each row's content as Python values, NaN and -0.0 told apart by their bits."""

    def cell(value: object) -> object:
        return np.float64(value).tobytes() if isinstance(value, float) else repr(value)

    return [tuple(cell(row[c]) for c in columns) for row in table.to_pylist()]


@settings(max_examples=200, deadline=None)
@given(
    tables(),
    st.booleans(),
    st.sampled_from(["keep", "same_split"]),
    st.integers(0, 2**32),
    st.floats(0.01, 0.99),
)
def test_no_group_and_no_duplicate_crosses_splits(drawn, group, duplicates, seed, fraction):
    """Invariant: with `group_column` no group has rows on both sides; with `duplicates:
    same_split` no content (label, features, group) has copies on both sides; both hold
    however the rows are cut into files and pieces."""
    table, cuts = drawn
    spec = spec_of(group, duplicates)
    held_out = held_out_in_files(table, cuts, spec, seed, fraction)
    if group:
        assert crossing(table.column("group").to_pylist(), held_out) == []
    if duplicates == "same_split" or group:
        assert crossing(content(table, content_columns(spec)), held_out) == []


@settings(max_examples=30, deadline=None)
@given(tables(), st.integers(0, 2**32), st.floats(0.0, 0.99))
def test_default_settings_keep_todays_draw(drawn, seed, fraction):
    """Invariant: without group_column and with `duplicates: keep`, a row's draw is the
    one by (seed, file, row index) every version before these settings made."""
    table, _ = drawn
    spec = spec_of(False, "keep")
    expected = holdout_mask("f", 7, table.num_rows, seed, fraction)
    assert np.array_equal(holdout_rows(table, spec, "f", 7, seed, fraction), expected)


def test_values_hash_as_written() -> None:
    """Invariant: an integer hashes by value whatever its width, a string alike plain or
    dictionary-encoded, a list by its elements in order; a null is not a zero or an empty
    string; float 0.0 and -0.0 are told apart (their bits differ)."""
    same = [
        (pa.array([5, None], pa.int32()), pa.array([5, None], pa.int64())),
        (pa.array(["p1", None]), pa.array(["p1", None]).dictionary_encode()),
        (pa.array(["p1", None]), pa.array(["p1", None], pa.large_string())),
        (pa.array([[1, 2], None]), pa.array([[1, 2], None], pa.large_list(pa.int64()))),
    ]
    for left, right in same:
        assert np.array_equal(column_hashes(left), column_hashes(right))
    assert column_hashes(pa.array([0, None]))[0] != column_hashes(pa.array([0, None]))[1]
    assert column_hashes(pa.array(["", None]))[0] != column_hashes(pa.array(["", None]))[1]
    assert len(set(column_hashes(pa.array([0.0, -0.0])).tolist())) == 2
    lists = column_hashes(pa.array([[1, 2], [2, 1], [1], [1, 2]]))
    assert lists[0] == lists[3] and len(set(lists[:3].tolist())) == 3


def test_group_split_is_stable_across_nights_and_fractions_near_target() -> None:
    """Invariant: a group's side depends on its value and the seed only (another file,
    another row, another night: the same side), and over many groups the held-out share of
    groups is near the fraction."""
    spec = spec_of(True, "keep")
    groups = pa.table({"group": [f"patient-{i}" for i in range(20_000)]})
    first = holdout_rows(groups, spec, "night-1.parquet", 0, 3, 0.2)
    again = holdout_rows(groups, spec, "night-9.parquet", 12_345, 3, 0.2)
    assert np.array_equal(first, again)
    assert first.mean() == pytest.approx(0.2, abs=0.01)


def test_group_column_config_errors_name_the_field() -> None:
    """Invariant: a group column equal to the label, or an unknown duplicates policy, is
    refused naming the field."""
    with pytest.raises(ValueError, match=r"dataset\.group_column"):
        DatasetSpec(inputs=["raw"], group_column="label")
    with pytest.raises(ValueError, match="duplicates"):
        DatasetSpec(inputs=["raw"], duplicates="sometimes")  # type: ignore[arg-type]


def test_the_tally_of_groups_and_duplicates_adds_up_and_survives_a_scan_record() -> None:
    """Invariant: tallied per batch and merged, a split records its rows, its groups and
    the largest group's share, and the rows whose content another input row shares (in
    any batch or file); the tally round-trips through the scan record a rerun reads."""
    spec = spec_of(True, "same_split")
    table = pa.table(
        {
            "group": ["a", "a", "a", "b", "c", "c"],
            "label": [0, 0, 1, 1, 0, 0],
            "x": [1.0, 1.0, 2.0, 3.0, 4.0, 5.0],
            "v": [[1]] * 6,
            "w": pa.array([[0.0, 0.0]] * 6, pa.list_(pa.float64(), 2)),
        }
    )
    holdout = np.array([False, False, False, True, False, False])
    halves = [
        tally_keys({k: h[rows] for k, h in key_hashes(table, spec).items()}, holdout[rows])
        for rows in (np.arange(6) < 2, np.arange(6) >= 2)
    ]
    stats = split_value_stats(merge_keys(halves))
    assert stats["train"] == {
        "groups": 2,
        "largest_group_share": 0.6,
        "duplicate_rows": 2,
        "rows": 5,
    }
    assert stats["holdout"] == {
        "groups": 1,
        "largest_group_share": 1.0,
        "duplicate_rows": 0,
        "rows": 1,
    }
    scan = FileScan(InputFile("f", "r", "f", 1, "t"), keys=merge_keys(halves))
    again = decode_scans(encode_scans([scan], "v1"), "v1")[0].keys
    assert all(np.array_equal(again[k][i], scan.keys[k][i]) for k in scan.keys for i in range(5))


def test_a_null_group_rejects_its_file_naming_the_column_and_first_row() -> None:
    """Invariant: a row without a group cannot be placed with its group, so its file is
    rejected with the column, the count and the file's row of the first null; the
    configured group column is named by its field when no file has it."""
    spec = spec_of(True, "keep")
    batch = pa.record_batch({"group": ["a", None, None], "label": [0, 1, 0]})
    reason = row_problem(batch, spec, first_row=10)
    assert reason is not None and "2 null groups in column 'group'" in reason
    assert "the first at row 11 of the file" in reason
    assert configured_columns(spec)["dataset.group_column"] == "group"


def test_past_its_sample_the_tally_stays_bounded_and_estimates_within_a_few_percent() -> None:
    """Invariant: over 40 files of 60,000 groups (3 rows each, the largest 900 rows in
    every file) and 6% of contents repeated, the merged tally holds at most SAMPLE + TOP
    keys an entry, and estimates the groups and duplicate rows within 5% (K-minimum-values
    with 4,096 keys: about 1.6% standard error), the largest group's share exactly."""
    rng = np.random.default_rng(1)
    parts, every_content = [], []
    for file in range(40):
        groups = np.r_[np.repeat(np.arange(1_500) + 1_500 * file, 3), np.full(900, 10**9)]
        contents = rng.integers(0, 2**63, size=len(groups)).astype(np.uint64)
        repeat = rng.random(len(groups)) < 0.03
        contents[repeat] = contents[np.flatnonzero(repeat) - 1]  # each copies its neighbour
        every_content.append(contents)
        keys = {"group": mix64(groups.astype(np.uint64), 7), "content": mix64(contents, 3)}
        parts.append(tally_keys(keys, np.zeros(len(groups), dtype=bool)))
    merged = merge_keys(parts)
    assert all(len(entry[0]) + len(entry[2]) <= SAMPLE + TOP for entry in merged.values())
    stats = split_value_stats(merged)["train"]
    rows = 40 * (4_500 + 900)
    assert stats["groups"] == pytest.approx(60_001, rel=0.05)
    assert stats["largest_group_share"] == pytest.approx(36_000 / rows, abs=1e-6)
    _, counts = np.unique(np.concatenate(every_content), return_counts=True)
    assert stats["duplicate_rows"] == pytest.approx(counts[counts > 1].sum(), rel=0.05)
    assert stats["estimated_from"] == SAMPLE and stats["rows"] == rows


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 150), st.integers(0, 2)), max_size=400),
    st.sampled_from([2**64 - 1, 2**40, 1]),
)
def test_a_batch_tally_is_its_keys_counted_smallest_first_and_largest_first(rows, scale):
    """Invariant: a batch's tally of a split holds its distinct keys, smallest first
    (SAMPLE of them), with their rows, and the TOP keys by rows, ties by the smaller
    key: many keys tied at one count (the scan's distinct groups) keep the smallest."""
    hashes = np.array([value * scale % 2**64 for value, _ in rows], dtype=np.uint64)
    splits = np.array([split for _, split in rows], dtype=np.int8)
    tally = tally_keys({"group": hashes}, splits)
    for code, split in enumerate(("train", "holdout", "validation")):
        counts = Counter(hashes[splits == code].tolist())
        if f"{split}/group" not in tally:
            assert code == 2 and not counts
            continue
        sample, sample_rows, top, top_rows, total = tally[f"{split}/group"]
        keys = sorted(counts)[:SAMPLE]
        assert sample.tolist() == keys and sample_rows.tolist() == [counts[k] for k in keys]
        largest = sorted(counts, key=lambda k: (-counts[k], k))[:TOP]
        assert top.tolist() == largest and top_rows.tolist() == [counts[k] for k in largest]
        assert total.tolist() == [sum(counts.values())]
