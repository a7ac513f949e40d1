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
from collections.abc import Callable, Iterable
from dataclasses import fields, is_dataclass
from itertools import chain
from typing import Any, Union, get_args, get_origin, get_type_hints

MAX_INT = 2**63 - 1
MAX_ROW_GROUPS = 2**20  # per shard: planning allocates one entry per row group


Check = Callable[[Any], bool]
Checks = Callable[[Iterable[Any]], bool]  # all of many values at once


def _checker(hint: Any, depth: int = 0) -> Check | None:
    """A predicate for values of type `hint` (None: anything goes), built once per field:
    a manifest of 1e5 shards is checked field by field at every read."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any or (depth > 1 and origin is not None):
        return None
    if origin in (Union, types.UnionType):
        options = [_checker(arg, depth) for arg in args if arg is not type(None)]
        checks = [check for check in options if check is not None]
        if len(checks) < len(options):
            return None
        none_ok = type(None) in args
        return lambda v: (none_ok and v is None) or any(check(v) for check in checks)
    if origin is list:
        items = _all_checker(args[0], depth + 1)
        return lambda v: type(v) is list and (items is None or items(v))
    if origin is dict:
        keys, values = (_all_checker(arg, depth + 1) for arg in args)
        return lambda v: (
            type(v) is dict and (keys is None or keys(v)) and (values is None or values(v.values()))
        )
    if hint is int:
        return lambda v: type(v) is int and -MAX_INT <= v <= MAX_INT
    if hint is float:
        return lambda v: type(v) is float or (type(v) is int and -MAX_INT <= v <= MAX_INT)
    if isinstance(hint, type) and not is_dataclass(hint):
        return lambda v: isinstance(v, hint) and not (hint is not bool and type(v) is bool)
    return None


def _all_checker(hint: Any, depth: int) -> Checks | None:
    """`all(map(_checker(hint), values))`, with the per-value call left out where the
    values' types alone decide: a manifest of 5,000 columns holds 5,000 names and 5,000
    schema entries (25,000 calls a read, 12 CPU-ms, where one pass over their types
    costs 1)."""
    one = _checker(hint, depth)
    if one is None:
        return None
    if get_origin(hint) is dict:  # a list of mappings: every key at once, every value
        keys, values = (_all_checker(arg, depth + 1) for arg in get_args(hint))
        return lambda vs: (
            _only(vs := list(vs), dict)
            and (keys is None or keys(chain.from_iterable(vs)))
            and (values is None or values(chain.from_iterable(map(dict.values, vs))))
        )
    if hint is int:
        return lambda vs: (
            _only(vs := list(vs), int) and (not vs or (min(vs) >= -MAX_INT and max(vs) <= MAX_INT))
        )
    exact = hint if isinstance(hint, type) and hint is not int else None
    # The types decide when each value is of exactly `hint` (a str is a str); any other
    # value (a subclass, an int for a float) is asked one by one, as before.
    return lambda vs: _only(vs := list(vs), exact) or all(map(one, vs))


def _only(values: list[Any], kind: type | None) -> bool:
    """Whether every one of `values` is of exactly type `kind` (by one pass in C)."""
    return kind is not None and set(map(type, values)) <= {kind}


_CHECKS: dict[type, list[tuple[str, Any, Check]]] = {}


def _checks(cls: type) -> list[tuple[str, Any, Check]]:
    if cls not in _CHECKS:
        hints = get_type_hints(cls)
        found = ((f.name, hints[f.name], _checker(hints[f.name])) for f in fields(cls))
        _CHECKS[cls] = [(name, hint, check) for name, hint, check in found if check]
    return _CHECKS[cls]


def record_problem(record: Any) -> str:
    """The first field of a dataclass record whose value is not of its declared type."""
    for name, hint, check in _checks(type(record)):
        value = getattr(record, name)
        if not check(value):
            return (
                f"{type(record).__name__}.{name} is {str(value)[:60]!r} of type "
                f"{type(value).__name__}, expected {hint}"
            )
    return ""


def entry_count_problem(entry: Any) -> str:
    """What is wrong with a shard entry's rows, row groups and bytes, or ""."""
    if entry.num_rows < 0 or entry.num_bytes < 0 or entry.rows_per_row_group <= 0:
        return (
            f"shard {entry.path!r} has negative counts or rows_per_row_group "
            f"{entry.rows_per_row_group} <= 0"
        )
    groups = -(-entry.num_rows // entry.rows_per_row_group)
    if groups != entry.num_row_groups:
        return (
            f"shard {entry.path!r} lists {entry.num_row_groups} row groups, but "
            f"{entry.num_rows} rows at {entry.rows_per_row_group} per group make {groups}"
        )
    if groups > MAX_ROW_GROUPS:
        return f"shard {entry.path!r} lists {groups} row groups, more than {MAX_ROW_GROUPS}"
    return ""


def manifest_problem(manifest: Any) -> str:
    """The first value of a manifest (or of a record it holds) of the wrong type, or the
    first shard whose counts do not add up; "" when there is none."""
    entries = [e for split in manifest.splits.values() for e in split.shards]
    records = [
        manifest,
        *manifest.splits.values(),
        *entries,
        *manifest.rejected,
        *manifest.inputs,
        *manifest.deltas,
    ]
    for record in records:
        if problem := record_problem(record):
            return problem
    return next((p for e in entries if (p := entry_count_problem(e))), "")
