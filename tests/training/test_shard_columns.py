"""A row group's columns picked by leaf index (training/data/shards.py: `open_reader`,
`leaf_indices`) are the table `pq.ParquetFile.read_row_group(columns=names)` gives, for
flat and nested schemas, names in any order, names the file lacks and dotted names."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given, settings
from hypothesis import strategies as st

from training.data.shards import leaf_indices, open_reader

KINDS = {
    "float": lambda n: pa.array([float(k) for k in range(n)], pa.float32()),
    "struct": lambda n: pa.array([{"a": k, "b": -k} for k in range(n)]),
    "list": lambda n: pa.array([[k] * (k % 3) for k in range(n)], pa.list_(pa.int64())),
    "vector": lambda n: pa.array([[k, k] for k in range(n)], pa.list_(pa.float32(), 2)),
    "nested": lambda n: pa.array([{"p": {"q": [k]}} for k in range(n)]),
}


@st.composite
def files_and_names(draw: st.DrawFn) -> tuple[bytes, list[str]]:
    """A Parquet file of hostile columns (struct, list, fixed-size list, nested struct,
    dotted names) and the names asked for: some of them, some absent, any order."""
    count = draw(st.integers(1, 8))
    kinds = draw(st.lists(st.sampled_from(sorted(KINDS)), min_size=count, max_size=count))
    names = [f"c{k}" if k % 3 else f"c.{k}" for k in range(count)]
    table = pa.table({name: KINDS[kind](5) for name, kind in zip(names, kinds, strict=True)})
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=2)
    asked = draw(st.lists(st.sampled_from([*names, "absent", "c"]), unique=True))
    return sink.getvalue().to_pybytes(), asked


@settings(max_examples=80, deadline=None)
@given(files_and_names(), st.integers(0, 2))
def test_leaf_indices_read_what_parquet_file_reads(
    case: tuple[bytes, list[str]], group: int
) -> None:
    """Invariant: for any schema and any names asked, reading row group `group` by the
    leaf indices gives pq.ParquetFile's table by names, column for column."""
    data, names = case
    expected = pq.ParquetFile(pa.BufferReader(data)).read_row_group(group, columns=names)
    reader = open_reader(pa.BufferReader(data), None)
    found = reader.read_row_group(group, column_indices=leaf_indices(reader, names))
    assert found.equals(expected)
