"""The validation split (preprocessing/plan/validation_split.py), pure: every row is in
exactly one of train, holdout and validation, whatever the values, files, pieces, seed and
fractions; groups and duplicate contents lie in one of the three; adding a validation split
changes no held-out row; the splits' counts add up to every row; the validation share is
its fraction of all rows; the scan's draw (batches) is the map's (pieces); training
selects on validation where a version has it, else on the holdout."""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.cli.summary import chosen_on
from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import Manifest, SplitEntry
from preprocessing.plan.counts import HOLDOUT, SPLITS, TRAIN, VALIDATION, Counts
from preprocessing.plan.split import split_counts
from preprocessing.plan.split_keys import content_columns, holdout_rows, key_hashes
from preprocessing.plan.validation_split import (
    row_splits,
    split_codes,
    splits_of,
    validation_rows,
)
from preprocessing.scan.row_counts import count_rows
from preprocessing.storage.sources import InputFile
from tests.preprocessing.test_split_keys import content, spec_of, tables

FRACTIONS = st.tuples(st.floats(0.0, 0.9), st.floats(0.0, 1.0)).map(
    lambda pair: (pair[0], pair[1] * (1.0 - pair[0]) * 0.999)  # holdout + validation < 1
)


def with_validation(spec: DatasetSpec, fraction: float) -> DatasetSpec:
    return spec.model_copy(update={"validation_fraction": fraction})


def splits_in_files(
    table: pa.Table, cuts: list[int], spec: DatasetSpec, seed: int, holdout: float, halves: bool
) -> np.ndarray:
    """Each row's split code, the table read as files cut at `cuts`, each in two pieces
    as map tasks read it (`halves`), or whole as one scan batch, which hashes the keys
    for its tally too."""
    parts = []
    for index, (start, stop) in enumerate(pairwise([0, *cuts, table.num_rows])):
        middle = (start + stop) // 2 if halves else stop
        for first, last in ((start, middle), (middle, stop)):
            piece, name, row = table.slice(first, last - first), f"f{index}", first - start
            if halves:
                parts.append(row_splits(piece, spec, name, row, seed, holdout))
            else:
                keys = key_hashes(piece, spec)
                parts.append(splits_of(keys, spec, name, row, piece.num_rows, seed, holdout))
    return np.concatenate(parts)


def crossing(keys: list[object], codes: np.ndarray) -> list[object]:
    """The keys found in more than one split."""
    sides: dict[object, set[int]] = defaultdict(set)
    for key, code in zip(keys, codes.tolist(), strict=True):
        sides[key].add(code)
    return [key for key, seen in sides.items() if len(seen) > 1]


@settings(max_examples=200, deadline=None)
@given(
    tables(),
    st.booleans(),
    st.sampled_from(["keep", "same_split"]),
    st.integers(0, 2**32),
    FRACTIONS,
)
def test_every_row_in_one_split_and_no_group_or_duplicate_across_them(
    drawn, group, duplicates, seed, fractions
):
    """Invariants: every row has one split code of the three; the held-out rows are the
    ones drawn without a validation split (adding it moves no held-out row); with
    `group_column` no group, and with `duplicates: same_split` (or a group) no content, is
    in two of train, holdout and validation; the map's draw (in pieces) is the scan's
    (whole, its keys hashed for the tally too)."""
    table, cuts = drawn
    holdout, validation = fractions
    spec = with_validation(spec_of(group, duplicates), validation)
    codes = splits_in_files(table, cuts, spec, seed, holdout, halves=True)
    assert set(codes.tolist()) <= {TRAIN, HOLDOUT, VALIDATION}
    assert np.array_equal(codes, splits_in_files(table, cuts, spec, seed, holdout, halves=False))
    before = with_validation(spec, 0.0)
    held = [
        holdout_rows(table.slice(a, b - a), before, f"f{i}", 0, seed, holdout)
        for i, (a, b) in enumerate(pairwise([0, *cuts, table.num_rows]))
    ]
    assert np.array_equal(codes == HOLDOUT, np.concatenate(held))
    if group:
        assert crossing(table.column("group").to_pylist(), codes) == []
    if duplicates == "same_split" or group:
        assert crossing(content(table, content_columns(spec)), codes) == []


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 5_000), st.integers(0, 2**32), FRACTIONS, st.integers(1, 3))
def test_the_splits_counts_add_up_to_every_row(num_rows, seed, fractions, num_pieces):
    """Invariant: the scan's counts of train, holdout and validation (per piece, label and
    source) add up to the file's rows exactly, and each split's plan counts its own."""
    holdout, validation = fractions
    spec = with_validation(DatasetSpec(inputs=["raw"], feature_columns=["x"]), validation)
    labels = np.arange(num_rows) % 3
    table = pa.table({"label": labels, "x": np.arange(num_rows, dtype=np.float64)})
    table = table.append_column("source", pa.array(["s"] * num_rows))
    codes = row_splits(table, spec, "f", 0, seed, holdout)
    pieces = np.arange(num_rows) * num_pieces // max(num_rows, 1)
    file = InputFile("raw/f", "raw", "f", 0, "tag")
    counted = count_rows(table, spec, file, pieces, codes)
    assert sum(counted.values()) == num_rows
    counts = Counts.of([(*key, n) for key, n in sorted(counted.items())])
    for code, split in enumerate(SPLITS):
        assert int(split_counts(counts, split).num_rows.sum()) == int((codes == code).sum())


@pytest.mark.parametrize("group", [False, True])
def test_the_validation_share_is_its_fraction_of_all_rows(group: bool) -> None:
    """Invariant: over 200,000 rows (ids as groups), each split's share is its fraction
    within 5 standard deviations of the draw: validation's of all rows, not of the rows
    the holdout leaves."""
    rows, holdout, validation = 200_000, 0.2, 0.15
    spec = with_validation(spec_of(group, "keep"), validation)
    table = pa.table({"group": np.arange(rows), "label": np.zeros(rows, np.int64)})
    codes = row_splits(table, spec, "f", 0, 11, holdout)
    for code, fraction in ((HOLDOUT, holdout), (VALIDATION, validation)):
        spread = 5 * np.sqrt(fraction * (1 - fraction) / rows)
        assert abs((codes == code).mean() - fraction) < spread


def test_validation_rows_are_never_held_out() -> None:
    """Invariant: the two masks are disjoint, so a code array keeps both."""
    spec = with_validation(spec_of(False, "keep"), 0.6)
    held = np.arange(1_000) % 2 == 0
    chosen = validation_rows({}, spec, "f", 0, held, 3, 0.3)  # drawn by (file, row)
    assert not (chosen & held).any() and chosen.any()
    codes = split_codes(held, chosen)
    assert np.array_equal(codes == HOLDOUT, held) and np.array_equal(codes == VALIDATION, chosen)


def test_the_fractions_must_leave_rows_to_train() -> None:
    """Invariant: holdout and validation fractions adding up to 1 or more are refused,
    naming both fields."""
    dataset = {"inputs": ["raw"], "validation_fraction": 0.5}
    with pytest.raises(ValueError, match=r"holdout_fraction and dataset\.validation_fraction"):
        ReshardConfig.model_validate(
            {"dataset": dataset, "output_root": "out", "holdout_fraction": 0.5}
        )


@pytest.mark.parametrize(
    ("rows", "chosen"),
    [
        ({"train": 5, "holdout": 3, "validation": 2}, "validation"),
        ({"train": 5, "holdout": 3, "validation": 0}, "holdout"),
        ({"train": 5, "holdout": 3}, "holdout"),
        ({"train": 5}, None),
    ],
)
def test_training_selects_on_validation_else_the_holdout(rows, chosen) -> None:
    """Invariant: the split training validates (so selects) on is the validation split
    where it has rows, else the holdout, as before; the console says which, and where it
    is the holdout, that the holdout also judged the model."""
    splits = {name: SplitEntry(n, []) for name, n in rows.items()}
    manifest = Manifest(
        "v", "label", "source", "id", ["x"], [0], ["s"], [], splits, 0, {}, "f", {}, {}
    )
    assert manifest.selection_split() == chosen
    line = chosen_on(chosen)
    assert (chosen or "") in line and ("judged" in line) == (chosen == "holdout")


def test_a_validation_split_beside_a_time_holdout_is_accepted_and_cut_by_time() -> None:
    """Invariant: `validation_fraction` beside `holdout_by: newest` is accepted (its rows
    are cut by time, plan/time_cut.py); either alone is accepted as before, and the two
    fractions together still must leave rows to train on."""
    time = {"holdout_by": "newest", "holdout_column": "seen"}
    assert DatasetSpec(inputs=["raw"], validation_fraction=0.1, **time).holdout_by == "newest"
    assert DatasetSpec(inputs=["raw"], **time).validation_fraction == 0
    assert DatasetSpec(inputs=["raw"], validation_fraction=0.1).holdout_by == "random"
    dataset = {"inputs": ["raw"], "validation_fraction": 0.5, **time}
    with pytest.raises(ValueError, match="validation_fraction add up to 1"):
        ReshardConfig(output_root="out", holdout_fraction=0.5, dataset=dataset)
