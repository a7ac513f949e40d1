"""JSON of the version contract's documents (the manifest), laid out for people and written
at the speed of the C encoder.

`document_json(record)` turns a dataclass tree into JSON with its keys sorted: each key of a
mapping on a line of its own, and each item of a list of records (a split's shards, the
inputs, the lineage) on one line, so that a manifest of 2,000 shards reads one shard per
line and `grep` finds one. Python's `json.dumps` with `indent` runs its pure-Python encoder;
with `dataclasses.asdict` first, it cost 0.33 s of the driver's commit for 5,000 inputs and
2,000 shards (benchmarks/RESULTS.md M37). Every item here goes through the C encoder.
"""

from __future__ import annotations

import json
from dataclasses import fields, is_dataclass
from typing import Any

_ENCODE = json.JSONEncoder(sort_keys=True, default=str, separators=(", ", ": ")).encode
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def document_json(record: Any) -> str:
    """`record` (a dataclass, with dataclasses, lists and mappings inside) as JSON."""
    return _laid_out(plain(record), "")


def plain(value: Any) -> Any:
    """`dataclasses.asdict` without its deep copies: the values are encoded right away."""
    if isinstance(value, str | int | float) or value is None:
        return value
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    names = _field_names(type(value))
    return {name: plain(getattr(value, name)) for name in names} if names else value


def _field_names(kind: type) -> tuple[str, ...]:
    """A dataclass's field names (none for any other type), looked up once per class."""
    if kind not in _FIELD_NAMES:
        _FIELD_NAMES[kind] = tuple(item.name for item in fields(kind)) if is_dataclass(kind) else ()
    return _FIELD_NAMES[kind]


def _laid_out(value: Any, indent: str) -> str:
    """A mapping of string keys a key per line; a list of mappings an item per line; any
    other value (and each such item) on one line."""
    inner = indent + " "
    if isinstance(value, dict) and value and all(isinstance(key, str) for key in value):
        lines = [f"{inner}{_ENCODE(key)}: {_laid_out(value[key], inner)}" for key in sorted(value)]
        return "{\n" + ",\n".join(lines) + "\n" + indent + "}"
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return "[\n" + ",\n".join(inner + _ENCODE(item) for item in value) + "\n" + indent + "]"
    return _ENCODE(value)
