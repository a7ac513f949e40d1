"""The columnar count table holds exactly the records it was given, joined across files."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.plan.counts import Counts, concat_counts

record = st.tuples(
    st.integers(0, 3),
    st.sampled_from(["train", "holdout"]),
    st.sampled_from([0, 1, 7, 12]),
    st.sampled_from(["a", "b", None]),
    st.integers(1, 10**12),
)
file_records = st.lists(st.lists(record, max_size=8, unique_by=lambda r: r[:4]), max_size=6)


@given(files=file_records)
@settings(max_examples=60, deadline=None)
def test_joined_table_holds_every_file_record_on_global_pieces(files) -> None:
    """Invariant: joining files' tables gives each file's records with its pieces moved
    past the earlier files' pieces (4 per file here) and the same label and source
    values, whatever codes each file gave them."""
    parts = [Counts.of(records) for records in files]
    joined = concat_counts(parts, np.arange(len(parts)) * 4)
    expected = [
        (piece + 4 * index, split, label, source, n)
        for index, records in enumerate(files)
        for piece, split, label, source, n in records
    ]
    assert sorted(joined.records(), key=repr) == sorted(expected, key=repr)


@given(records=st.lists(record, max_size=12, unique_by=lambda r: r[:4]))
def test_rows_by_label_and_source_sum_each_value(records) -> None:
    """Invariant: rows per label (and per source) are the sums of its records' rows."""
    counts = Counts.of(records)
    for column, position in (("label", 2), ("source", 3)):
        totals: dict[object, int] = {}
        for item in records:
            totals[item[position]] = totals.get(item[position], 0) + item[4]
        assert counts.rows_by(column) == totals
