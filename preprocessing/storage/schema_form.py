"""The one form of a schema a scan reports, whatever carried it (preprocessing/scan/).

A scan's result comes back from a Dask worker process pickled, or from a thread of the
driver's own process as is (`dask.kind: threads`). pyarrow's pickle of a fixed-size list
type drops its child field: the name becomes `item`, the child nullable, its metadata
gone. Every version scanned on worker processes recorded that form in its manifest, so
the schema is put in that form where it is read, and a scan reports the same schema
either way: an append scanned on threads then matches the parent its process-made
chain holds, and pickling a scan's schema changes nothing.
"""

from __future__ import annotations

import pyarrow as pa


def canonical_schema(schema: pa.Schema) -> pa.Schema:
    """`schema` in the module's form: every fixed-size list, at any depth, with the child
    field pyarrow's pickle gives it; the fields' own names, nullability and metadata,
    and the schema's metadata, as they are."""
    fields = [field.with_type(_canonical_type(field.type)) for field in schema]
    return pa.schema(fields, metadata=schema.metadata)


def _canonical_type(arrow_type: pa.DataType) -> pa.DataType:
    if pa.types.is_fixed_size_list(arrow_type):
        return pa.list_(_canonical_type(arrow_type.value_type), arrow_type.list_size)
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type):
        build = pa.list_ if pa.types.is_list(arrow_type) else pa.large_list
        value = arrow_type.value_field
        return build(value.with_type(_canonical_type(value.type)))
    if pa.types.is_map(arrow_type):
        key, item = arrow_type.key_field, arrow_type.item_field
        return pa.map_(key, item.with_type(_canonical_type(item.type)), arrow_type.keys_sorted)
    if pa.types.is_struct(arrow_type):
        children = [arrow_type.field(i) for i in range(arrow_type.num_fields)]
        return pa.struct([child.with_type(_canonical_type(child.type)) for child in children])
    return arrow_type
