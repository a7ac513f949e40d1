"""A manifest's values of the types its dataclasses declare, and shard counts that add up.

A manifest is untrusted input (preprocessing/contract/manifest.py): JSON gives any value
any type, so `manifest_problem` checks every field of the Manifest and of each record it
holds against its annotation (containers and their simple elements one level deep; an int
is no bool and fits in 64 bits; a float may be an int) and each shard's counts against
each other, before anything uses them: a count of the wrong type or one too large to plan
(millions of row groups per shard from one edited number) is a ManifestError, not a
TypeError or a hang later. Standard library only.
"""

from __future__ import annotations

import types
from dataclasses import fields, is_dataclass
from typing import Any, Union, get_args, get_origin, get_type_hints

MAX_INT = 2**63 - 1
MAX_ROW_GROUPS = 2**20  # per shard: planning allocates one entry per row group


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = get_type_hints(cls)
    return _HINTS[cls]


def _is(value: Any, hint: Any, depth: int = 0) -> bool:
    """Whether `value` has the type `hint` (containers checked `depth` < 2 levels down)."""
    origin = get_origin(hint)
    if hint is Any or (depth > 1 and origin is not None):
        return True
    if origin in (Union, types.UnionType):
        return any(_is(value, arg, depth) for arg in get_args(hint))
    if hint is type(None):
        return value is None
    if origin is list:
        return isinstance(value, list) and all(_is(v, get_args(hint)[0], depth + 1)
                                               for v in value)
    if origin is dict:
        key, item = get_args(hint)
        return isinstance(value, dict) and all(
            _is(k, key, depth + 1) and _is(v, item, depth + 1) for k, v in value.items())
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_INT
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    return not isinstance(hint, type) or is_dataclass(hint) or isinstance(value, hint)


def record_problem(record: Any) -> str:
    """The first field of a dataclass record whose value is not of its declared type."""
    for field in fields(record):
        value, hint = getattr(record, field.name), _hints(type(record))[field.name]
        if not _is(value, hint):
            return (f"{type(record).__name__}.{field.name} is {str(value)[:60]!r} of type "
                    f"{type(value).__name__}, expected {hint}")
    return ""


def entry_count_problem(entry: Any) -> str:
    """What is wrong with a shard entry's rows, row groups and bytes, or ""."""
    if entry.num_rows < 0 or entry.num_bytes < 0 or entry.rows_per_row_group <= 0:
        return (f"shard {entry.path!r} has negative counts or rows_per_row_group "
                f"{entry.rows_per_row_group} <= 0")
    groups = -(-entry.num_rows // entry.rows_per_row_group)
    if groups != entry.num_row_groups:
        return (f"shard {entry.path!r} lists {entry.num_row_groups} row groups, but "
                f"{entry.num_rows} rows at {entry.rows_per_row_group} per group make {groups}")
    if groups > MAX_ROW_GROUPS:
        return f"shard {entry.path!r} lists {groups} row groups, more than {MAX_ROW_GROUPS}"
    return ""


def manifest_problem(manifest: Any) -> str:
    """The first value of a manifest (or of a record it holds) of the wrong type, or the
    first shard whose counts do not add up; "" when there is none."""
    entries = [e for split in manifest.splits.values() for e in split.shards]
    records = [manifest, *manifest.splits.values(), *entries, *manifest.rejected,
               *manifest.inputs, *manifest.deltas]
    for record in records:
        if problem := record_problem(record):
            return problem
    return next((p for e in entries if (p := entry_count_problem(e))), "")
