"""A scan's schema has one form whatever carried it (preprocessing/storage/schema_form.py):
the form a pickle (a Dask worker process's result) gives, so a scan on threads and one on
worker processes report the same schema, and an append made on either matches a parent
made on the other."""

from __future__ import annotations

import pickle

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from preprocessing.storage.schema_form import canonical_schema

NAMES = st.sampled_from(["item", "element", "", "é ü", "values", "a.b", "0"])
LEAVES = st.sampled_from([pa.int8(), pa.float32(), pa.string(), pa.bool_(), pa.timestamp("ms")])


def _field(child: st.SearchStrategy[pa.DataType]) -> st.SearchStrategy[pa.Field]:
    metadata = st.one_of(st.none(), st.just({b"k": b"v"}))
    return st.builds(pa.field, NAMES, child, st.booleans(), metadata)


TYPES = st.recursive(
    LEAVES,
    lambda child: st.one_of(
        st.builds(pa.list_, _field(child), st.integers(1, 5)),  # fixed size
        st.builds(pa.list_, _field(child)),
        st.builds(pa.large_list, _field(child)),
        st.builds(lambda fields: pa.struct(fields), st.lists(_field(child), max_size=3)),
        st.builds(lambda item: pa.map_(pa.string(), item), _field(child)),
    ),
    max_leaves=6,
)
SCHEMAS = st.lists(st.tuples(NAMES, TYPES), max_size=4, unique_by=lambda pair: pair[0]).map(
    lambda pairs: pa.schema(
        [pa.field(name, arrow_type) for name, arrow_type in pairs], metadata={b"m": b"1"}
    )
)


def spelled(schema: pa.Schema) -> list[tuple[str, str]]:
    """What a manifest records of a schema: each field's name and type as a string."""
    return [(field.name, str(field.type)) for field in schema]


@given(SCHEMAS)
def test_a_schema_reads_the_same_on_threads_and_after_a_process_boundary(schema) -> None:
    """Invariants, over nested lists, fixed-size lists, structs and maps with any child
    names, nullability and metadata: the canonical form spells exactly as the pickled
    schema does, whichever of the two is pickled; it is stable (canonical twice is once);
    it equals the pickled schema; and it keeps every top-level field's name and the
    schema's metadata (only fixed-size lists' child fields change)."""
    canonical = canonical_schema(schema)
    crossed = pickle.loads(pickle.dumps(schema))
    assert spelled(canonical) == spelled(crossed)
    assert spelled(pickle.loads(pickle.dumps(canonical))) == spelled(canonical)
    assert canonical_schema(canonical).equals(canonical, check_metadata=True)
    assert canonical.names == schema.names and canonical.metadata == schema.metadata
    assert canonical.equals(crossed)


def test_a_fixed_size_list_of_a_parquet_file_reads_as_the_worker_processes_recorded_it() -> None:
    """Invariant: a Parquet vector column (`fixed_size_list<element: float>[4]` as pyarrow
    reads it back) is reported as every process-made version recorded it."""
    read_back = pa.schema([("features", pa.list_(pa.field("element", pa.float32()), 4))])
    assert str(canonical_schema(read_back).field("features").type) == (
        "fixed_size_list<item: float>[4]"
    )
