"""The rule of `duplicates: drop` (preprocessing/plan/first_copies.py): of each set of equal
hashes exactly the first by (file, row) is kept, however the hash space is cut into ranges
and whatever files, rows and collisions there are; and the pairs a file's scan writes for
it (preprocessing/scan/content_pairs.py), on local files, no process started."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec
from preprocessing.plan.first_copies import (
    BUCKETS,
    bucket_bounds,
    bucket_groups,
    later_copies,
    sorted_pairs,
)
from preprocessing.plan.row_ids import shared_id
from preprocessing.scan.content_pairs import read_pairs
from preprocessing.scan.inputs import scan_file
from preprocessing.scan.scan_record import decode_scans, encode_scans
from preprocessing.storage.sources import InputFile

# A few hashes spread over the whole space (so over many buckets), drawn again and again.
POOL = st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=12, unique=True)


@st.composite
def night(draw: st.DrawFn) -> list[np.ndarray]:
    """Files of rows, each row's hash drawn from a small pool (copies within and across
    files), empty files among them, rows numbered with gaps (rows left out by the scan)."""
    pool = draw(POOL)
    files = []
    for _ in range(draw(st.integers(1, 5))):
        picks = draw(st.lists(st.sampled_from(pool), max_size=30))
        gaps = draw(st.lists(st.integers(1, 3), min_size=len(picks), max_size=len(picks)))
        rows = np.cumsum(np.array(gaps, dtype=np.int64)) - 1
        hashes = np.array(picks, dtype=np.uint64)
        strata = np.arange(len(picks), dtype=np.int32) % 3
        files.append(sorted_pairs(hashes, rows, strata))
    return files


@settings(max_examples=300, deadline=None)
@given(night(), st.integers(1, 40))
def test_exactly_the_first_copy_by_file_then_row_survives_any_cut_of_the_hashes(
    files: list[np.ndarray], budget_rows: int
) -> None:
    """Invariant: per content hash, the kept pairs are exactly one, the smallest
    (file, row) holding it; each range of buckets (`bucket_groups`, any budget) is decided
    alone and the union is the whole; a file's pairs are sorted and its bounds cover them."""
    bounds = np.array([bucket_bounds(pairs) for pairs in files])
    for pairs, bound in zip(files, bounds, strict=True):
        assert (np.diff(pairs["hash"].astype(np.float64)) >= 0).all()
        assert bound[0] == 0 and bound[-1] == len(pairs) and (np.diff(bound) >= 0).all()
    groups = bucket_groups(np.diff(bounds, axis=1).sum(axis=0), budget_rows)
    assert groups[0][0] == 0 and groups[-1][1] == BUCKETS
    assert all(a[1] == b[0] for a, b in pairwise(groups))
    kept: dict[int, list[tuple[int, int]]] = {}
    for start, stop in groups:
        parts = [
            pairs[bound[start] : bound[stop]] for pairs, bound in zip(files, bounds, strict=True)
        ]
        for index, (part, later) in enumerate(zip(parts, later_copies(parts), strict=True)):
            for value, row in zip(
                part["hash"][~later].tolist(), part["row"][~later].tolist(), strict=True
            ):
                kept.setdefault(value, []).append((index, row))
    first: dict[int, tuple[int, int]] = {}
    for index, pairs in enumerate(files):
        for value, row in zip(pairs["hash"].tolist(), pairs["row"].tolist(), strict=True):
            first[value] = min(first.get(value, (index, row)), (index, row))
    assert {value: places for value, places in kept.items()} == {
        value: [place] for value, place in first.items()
    }


def test_a_range_is_one_bucket_when_that_bucket_alone_is_past_the_budget() -> None:
    """Invariant: `bucket_groups` never holds more than the budget but for a single bucket
    that alone holds more, and covers every bucket once."""
    rows = np.zeros(BUCKETS, dtype=np.int64)
    rows[[3, 4, 200]] = [5, 50, 7]
    groups = bucket_groups(rows, 10)
    assert (4, 5) in groups
    assert all(rows[a:b].sum() <= 10 or b - a == 1 for a, b in groups)
    assert [a for a, _ in groups][1:] == [b for _, b in groups][:-1]


def test_a_scan_writes_its_sorted_pairs_and_its_record_keeps_where_they_are(tmp_path) -> None:
    """Invariant: under `drop`, a file's scan writes one pair per kept row (a `drop_row`
    null left out), sorted by hash, its bucket bounds covering them and each stratum code
    naming the row's (split, label, source); the scan record keeps them exactly, and a
    scan without a scratch writes nothing (`keep` and `same_split` never do)."""
    table = pa.table(
        {
            "label": [0, 1, 0, 0, 1, 1],
            "x": pa.array([1.0, 2.0, 1.0, None, -0.0, 0.0], pa.float64()),
        }
    )
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=4)
    file = InputFile(str(tmp_path / "a.parquet"), str(tmp_path), "a.parquet", 1, "t")
    spec = DatasetSpec(
        inputs=[str(tmp_path)],
        source_column=None,
        feature_columns=["x"],
        nulls={"x": "drop_row"},
        duplicates="drop",
    )
    scan = scan_file(file, spec, 3, 0.5, 100, pairs_dir=str(tmp_path / "scratch"))
    pairs = scan.content_pairs
    assert pairs is not None and pairs.bounds[-1] == 5
    found = read_pairs(str(tmp_path / "scratch"), pairs.name, 0, 5)
    assert sorted(found["row"].tolist()) == [0, 1, 2, 4, 5]
    assert (np.diff(found["hash"].astype(np.float64)) >= 0).all()
    hashes = dict(zip(found["row"].tolist(), found["hash"].tolist(), strict=True))
    assert hashes[0] == hashes[2] and hashes[4] != hashes[5]  # -0.0 is not 0.0
    labels = {
        row: pairs.strata[code][1] for row, code in zip(found["row"], found["stratum"], strict=True)
    }
    assert labels == {0: 0, 1: 1, 2: 0, 4: 1, 5: 1}
    [kept] = decode_scans(encode_scans([scan], "0123456789abcdef"), "0123456789abcdef")
    assert kept.content_pairs == pairs and kept.counts == scan.counts
    for other in ("keep", "same_split"):
        settings = spec.model_copy(update={"duplicates": other})
        assert scan_file(file, settings, 3, 0.5, 100, pairs_dir="unused").content_pairs is None


def test_under_drop_a_file_repeating_an_id_is_left_to_the_check_on_kept_rows(
    tmp_path,
) -> None:
    """Invariant: under `drop` with an id column the scan does not reject a file whose ids
    repeat (a copy may hold its row's id, and the drop is not known yet): its pairs say
    so, in the scan record too, for the check on the rows the drop keeps; under
    `same_split` the file is rejected as before."""
    table = pa.table({"id": [1, 2, 1], "label": [0, 1, 0], "x": [1.0, 2.0, 1.0]})
    pq.write_table(table, tmp_path / "a.parquet")
    file = InputFile(str(tmp_path / "a.parquet"), str(tmp_path), "a.parquet", 1, "t")
    spec = DatasetSpec(
        inputs=[str(tmp_path)], source_column=None, id_column="id", feature_columns=["x"]
    )
    dropping = spec.model_copy(update={"duplicates": "drop"})
    drop = scan_file(file, dropping, 3, 0.5, 100, pairs_dir=str(tmp_path))
    assert drop.reason is None and drop.content_pairs and drop.content_pairs.repeated_ids
    [kept] = decode_scans(encode_scans([drop], "0123456789abcdef"), "0123456789abcdef")
    assert kept.content_pairs == drop.content_pairs
    unique = table.set_column(0, "id", pa.array([1, 2, 3]))
    pq.write_table(unique, tmp_path / "a.parquet")
    drop = scan_file(file, dropping, 3, 0.5, 100, pairs_dir=str(tmp_path))
    assert drop.content_pairs and not drop.content_pairs.repeated_ids
    pq.write_table(table, tmp_path / "a.parquet")
    settings = spec.model_copy(update={"duplicates": "same_split"})
    reason = scan_file(file, settings, 3, 0.5, 100, pairs_dir=str(tmp_path)).reason
    assert reason is not None and "column 'id' holds 1 duplicate ids (e.g. 1)" in reason


@settings(max_examples=300, deadline=None)
@given(
    ids=st.lists(st.tuples(st.integers(0, 4), st.integers(-3, 3)), max_size=40),
    committed=st.lists(st.booleans(), min_size=5, max_size=5),
)
def test_shared_id_finds_a_clash_unless_only_committed_files_share_it(ids, committed) -> None:
    """Invariant (plan/row_ids.py `shared_id`): of (file, id) entries in file order, it
    names two entries with one id, not both of committed files, exactly when such a pair
    exists; the first named is the first entry holding that id, and comes before the
    second in (file, row) order."""
    ids = sorted(ids, key=lambda entry: entry[0])  # files in order, rows as drawn
    owners = np.array([file for file, _ in ids], dtype=np.int64)
    values = np.array([value for _, value in ids], dtype=np.int64)
    flags = np.array(committed)
    found = shared_id(values, owners, flags)
    exists = any(
        values[a] == values[b] and not (flags[owners[a]] and flags[owners[b]])
        for a in range(len(ids))
        for b in range(a + 1, len(ids))
    )
    assert (found is not None) == exists
    if found is not None:
        a, b = found
        assert a < b and values[a] == values[b] and a == list(values).index(values[a])
        assert not (flags[owners[a]] and flags[owners[b]])
