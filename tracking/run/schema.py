"""A dataset version's columns in MLflow's own schema format.

MLflow's UI reads a dataset input's schema only as `{"mlflow_colspec": [...]}` (what its
own pandas and Spark datasets log); anything else shows as "Unrecognized Schema Format"
above raw JSON. The manifest records Arrow type names (`int64`, `string`,
`fixed_size_list<item: float>[16]`); each becomes the MLflow type of its values.
"""

from __future__ import annotations

import json
import re

from mlflow.types.schema import Array, ColSpec, DataType, Schema

_LIST = re.compile(r"^(?:large_)?(?:fixed_size_)?list<[^:]*:\s*(?P<item>.+?)>(?:\[\d+\])?$")
_SCALARS = (  # (prefixes of an Arrow type name, MLflow type), first match wins
    (("bool",), DataType.boolean),
    (("int8", "int16", "int32", "uint8", "uint16"), DataType.integer),
    (("int", "uint"), DataType.long),
    (("halffloat", "float"), DataType.float),
    (("double",), DataType.double),
    (("timestamp", "date"), DataType.datetime),
    (("binary", "large_binary", "fixed_size_binary"), DataType.binary),
)


def mlflow_column_type(arrow_type: str) -> DataType | Array:
    """The MLflow type of a column of Arrow type `arrow_type` (a list: an array of its
    items' type; strings, dictionaries and anything unknown: string)."""
    match = _LIST.match(arrow_type)
    if match:
        return Array(mlflow_column_type(match.group("item")))
    for prefixes, data_type in _SCALARS:
        if arrow_type.startswith(prefixes):
            return data_type
    return DataType.string


def mlflow_schema_json(fields: list[dict[str, str]]) -> str:
    """The manifest's `arrow_schema` as the schema JSON of an MLflow dataset."""
    schema = Schema([ColSpec(mlflow_column_type(field["type"]), field["name"]) for field in fields])
    return json.dumps({"mlflow_colspec": schema.to_dict()})
