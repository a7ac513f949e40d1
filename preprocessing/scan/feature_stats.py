"""What the scan learns about the feature columns, and the feature codec built from it.

Per file, `profile_batch` folds each batch of the feature columns into one
`ColumnProfile` per column (null rows, count / mean / squared deviations of the numbers,
the longest list, the distinct strings up to a cap); the numeric columns of one Arrow
type are folded together, bit for bit alike (preprocessing/scan/numeric_profiles.py).
The driver merges the files' profiles (`merge_profiles`) and `build_codec` turns them
into the codec's specs (preprocessing/contract/codec.py) under the dataset's settings, or
raises `InputError` naming the column, the count, the first files and the fix, before
any shard is written.

`null_rows` is the one definition of a row that a `drop_row` policy drops, used by the
scan (which counts only the kept rows, so the plan stays exact) and by the map stage
(which leaves them out). A NaN counts as a null.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, get_args

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from preprocessing.config import DatasetSpec, NullPolicy
from preprocessing.contract.codec import FeatureCodec, seconds
from preprocessing.contract.column_spec import SCALAR_KINDS, ColumnSpec, FeatureError, kind_of
from preprocessing.contract.notices import identifying_message
from preprocessing.plan.distinct import (
    distinct_count,
    fold_hashes,
    identifies_rows,
    value_hashes,
)
from preprocessing.scan.numeric_profiles import fold_block, numeric_blocks
from preprocessing.toolbox.faults import PermanentInputError

# Distinct strings kept per column beyond max_categories, so the error can give a count.
CATEGORY_COUNT_CAP = 100_000
_LIST_POLICIES = ("error", "drop_row", "fill_zero")
_POLICIES_OF = {"vector": _LIST_POLICIES, "sequence": _LIST_POLICIES, "category": _LIST_POLICIES}


def policies_for(kind: str | None) -> tuple[str, ...]:
    """The null policies a column of codec kind `kind` takes."""
    return _POLICIES_OF.get(kind or "", get_args(NullPolicy))


class InputError(PermanentInputError):
    """Raw inputs that cannot make a version; the message names the file, the column, the
    count and the fix. Permanent: no retry reads them differently."""


@dataclass
class ColumnProfile:
    """One feature column of one file (or, merged, of all accepted files)."""

    arrow_type: str
    kind: str
    null_rows: int = 0  # rows with a null (or NaN) in this column, dropped or not
    count: int = 0  # non-null values of the kept rows
    mean: float = 0.0
    m2: float = 0.0  # sum of squared deviations from the mean
    max_length: int = 0  # the longest kept list
    size: int = 0  # a fixed-size list's size
    values: set[str] | None = field(default_factory=set)  # None: past CATEGORY_COUNT_CAP
    # Strings and integers: the distinct-values sketch of the kept rows (plan/distinct.py).
    hashes: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))

    def add_numbers(self, numbers: np.ndarray) -> None:
        """Fold values in (Chan's parallel update: exact, and merges across files)."""
        if len(numbers):
            mean = numbers.mean()
            self.add_moments(len(numbers), float(mean), float(((numbers - mean) ** 2).sum()))

    def add_moments(self, count: int, mean: float, m2: float) -> None:
        """Fold in `count` values of mean `mean` and squared deviations `m2`."""
        total = self.count + count
        if total:
            delta = mean - self.mean
            self.m2 += m2 + delta * delta * self.count * count / total
            self.mean += delta * count / total
        self.count = total

    def merge(self, other: ColumnProfile) -> None:
        self.add_moments(other.count, other.mean, other.m2)
        self.null_rows += other.null_rows
        self.max_length = max(self.max_length, other.max_length)
        self.add_values(other.values)
        self.hashes = fold_hashes(self.hashes, other.hashes)

    def add_values(self, values: set[str] | None) -> None:
        if self.values is None or values is None:
            self.values = None
        else:
            self.values |= values
            if len(self.values) > CATEGORY_COUNT_CAP:
                self.values = None

    @property
    def std(self) -> float:
        return float(np.sqrt(self.m2 / self.count)) if self.count else 0.0


_RECORDED = [item.name for item in fields(ColumnProfile) if item.name != "hashes"]


def new_profiles(
    schema: pa.Schema, names: list[str], date_columns: list[str] | None = None
) -> dict[str, ColumnProfile]:
    """An empty profile per feature column; a type the codec cannot encode is an error.
    The strings of `date_columns` are temporal, not categories."""
    profiles = {}
    for name in names:
        arrow_type = schema.field(name).type
        kind = column_kind(arrow_type, name in (date_columns or []))
        if kind is None:
            raise InputError(
                f"feature column '{name}' has type {arrow_type}, which no feature kind "
                "encodes (numbers, booleans, timestamps/dates, lists of numbers, strings)"
            )
        size = arrow_type.list_size if kind == "vector" else 0
        profiles[name] = ColumnProfile(str(arrow_type), kind, size=size)
    return profiles


def column_kind(arrow_type: pa.DataType, is_date: bool) -> str | None:
    """The codec kind of a feature column: its type's, but `temporal` for the strings of
    a column in `dataset.date_columns`."""
    kind = kind_of(arrow_type)
    return "temporal" if is_date and kind == "category" else kind


def column_nulls(array: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per row: is the value null or NaN (a list: null, or holding a null element)?"""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_floating(array.type):  # nulls come out as NaN
        return np.isnan(array.to_numpy(zero_copy_only=False))
    if not (
        pa.types.is_list(array.type)
        or pa.types.is_large_list(array.type)
        or pa.types.is_fixed_size_list(array.type)
    ):
        if not array.null_count:  # most columns: no bitmap to unpack
            return np.zeros(len(array), dtype=bool)
        return array.is_null().to_numpy(zero_copy_only=False)
    rows = array.is_null().to_numpy(zero_copy_only=False).copy()
    elements = pc.list_flatten(array)
    if elements.null_count:
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
        rows[parents[elements.is_null().to_numpy(zero_copy_only=False)]] = True
    return rows


def null_rows(table: pa.Table | pa.RecordBatch, columns: list[str]) -> np.ndarray:
    """Rows with a null in any of `columns`: the rows a `drop_row` policy leaves out."""
    dropped = np.zeros(table.num_rows, dtype=bool)
    for name in columns:
        dropped |= column_nulls(table.column(name))
    return dropped


def drop_row_columns(spec: DatasetSpec) -> list[str]:
    return [name for name in spec.feature_columns if spec.nulls.get(name) == "drop_row"]


def profile_batch(
    profiles: dict[str, ColumnProfile], batch: pa.RecordBatch, kept: np.ndarray
) -> None:
    """Fold one batch into the profiles of the columns it holds; statistics cover the
    `kept` rows only, null counts every row."""
    present = set(batch.schema.names)  # a new list at each call: once, for 5,000 columns
    # A fixed-size list its footer showed to be free of nulls is not in the batch.
    names = [name for name in profiles if name in present]
    folded: set[str] = set()
    for block in numeric_blocks(profiles, batch.schema, names):  # wide tables: at once
        if fold_block(profiles, batch, block, kept):
            folded.update(block)
    for name in (name for name in names if name not in folded):
        profile = profiles[name]
        array = batch.column(name)
        nulls = column_nulls(array)
        profile.null_rows += int(nulls.sum())
        try:
            _fold(profile, array, kept & ~nulls)
        except FeatureError as error:  # a date that does not parse: the file is bad
            raise InputError(f"feature column '{name}': {error}") from None


def _fold(profile: ColumnProfile, array: pa.Array, use: np.ndarray) -> None:
    """Fold the rows `use` of `array` (non-null, kept) into the profile."""
    if profile.kind in SCALAR_KINDS:  # numpy's mask: cheaper than an Arrow filter
        numbers = seconds(array) if profile.kind == "temporal" else array.cast(pa.float64())
        profile.add_numbers(numbers.to_numpy(zero_copy_only=False)[use])
        if pa.types.is_integer(array.type):
            values = array.to_numpy(zero_copy_only=False)[use]
            profile.hashes = fold_hashes(profile.hashes, value_hashes(values))
        return
    if profile.kind not in ("sequence", "category"):  # a vector's profile is its nulls:
        return  # no filtered copy of it (the scan reads one to hash a row's content)
    valid = array.filter(pa.array(use))
    if profile.kind == "sequence" and len(valid):
        profile.max_length = max(profile.max_length, pc.max(pc.list_value_length(valid)).as_py())
    elif profile.kind == "category":
        distinct = pc.unique(valid.cast(pa.string()))
        profile.count += len(valid)  # the rows the distinct values are of
        profile.add_values(set(distinct.to_pylist()))
        profile.hashes = fold_hashes(
            profile.hashes, value_hashes(distinct.to_numpy(zero_copy_only=False))
        )


def identifying_columns(
    profiles: dict[str, ColumnProfile], spec: DatasetSpec
) -> dict[str, dict[str, int]]:
    """Feature columns (strings, integers) whose distinct values approach their rows
    (plan/distinct.py: `identifies_rows`), each with its distinct and row counts;
    `InputError` naming them under `dataset.on_identifying_feature: refuse`."""
    found = {
        name: {"distinct": distinct_count(profile.hashes), "rows": profile.count}
        for name, profile in profiles.items()
        if len(profile.hashes) and identifies_rows(distinct_count(profile.hashes), profile.count)
    }
    if found and spec.on_identifying_feature == "refuse":
        raise InputError(
            "; ".join(identifying_message(name, **counts) for name, counts in found.items())
            + " (dataset.on_identifying_feature is 'refuse')"
        )
    return found


def merge_profiles(per_file: list[dict[str, ColumnProfile]]) -> dict[str, ColumnProfile]:
    """The profiles of all files, column by column."""
    merged: dict[str, ColumnProfile] = {}
    for profiles in per_file:
        for name, profile in profiles.items():
            if name not in merged:
                merged[name] = ColumnProfile(profile.arrow_type, profile.kind, size=profile.size)
            merged[name].merge(profile)
    return merged


def build_codec(
    profiles: dict[str, ColumnProfile], files_with_nulls: dict[str, list[str]], spec: DatasetSpec
) -> FeatureCodec:
    """The codec of the version: one spec per feature column, or `InputError` for nulls
    under the `error` policy, an unsupported policy, or too many categories."""
    refused = [
        (name, profiles[name])
        for name in spec.feature_columns
        if profiles[name].null_rows and spec.nulls.get(name, "error") == "error"
    ]
    if refused:
        raise InputError(
            "; ".join(
                _null_message(name, profile, files_with_nulls[name]) for name, profile in refused
            )
        )
    return FeatureCodec(
        tuple(_column_spec(name, profiles[name], spec) for name in spec.feature_columns)
    )


def _null_message(name: str, profile: ColumnProfile, files: list[str]) -> str:
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    fix = "fill_mean" if profile.kind in SCALAR_KINDS else "fill_zero"
    return (
        f"feature column '{name}' holds {profile.null_rows} null rows (in {shown}); "
        f"choose a null policy, e.g. `dataset.nulls: {{{name}: {fix}}}` "
        f"(or drop_row{', fill_zero, indicator' if fix == 'fill_mean' else ''})"
    )


def _column_spec(name: str, profile: ColumnProfile, spec: DatasetSpec) -> ColumnSpec:
    policy = spec.nulls.get(name, "error")
    allowed = _POLICIES_OF.get(profile.kind)
    if allowed and policy not in allowed:
        raise InputError(
            f"dataset.nulls: {policy} does not apply to feature column '{name}' "
            f"({profile.kind}, {profile.arrow_type}); use one of {list(allowed)}"
        )
    base = ColumnSpec(
        name, profile.kind, profile.arrow_type, nulls=policy, null_count=profile.null_rows
    )
    if profile.kind in SCALAR_KINDS:
        return _scalar_spec(base, profile, spec.standardize and profile.kind != "boolean")
    if profile.kind == "vector":
        return replace(base, size=profile.size)
    if profile.kind == "sequence":
        return replace(base, size=spec.sequence_length or max(profile.max_length, 1))
    return _category_spec(base, profile, spec)


def _scalar_spec(base: ColumnSpec, profile: ColumnProfile, standardize: bool) -> ColumnSpec:
    fill = profile.mean if base.nulls in ("fill_mean", "indicator") else 0.0
    if not standardize:
        return replace(base, fill=fill)
    # A constant column keeps scale 1: it then encodes as 0 instead of dividing by 0.
    return replace(base, shift=profile.mean, scale=profile.std or 1.0, fill=fill)


def _category_spec(base: ColumnSpec, profile: ColumnProfile, spec: DatasetSpec) -> ColumnSpec:
    values = profile.values
    if values is not None and len(values) <= spec.max_categories:
        return replace(base, vocabulary=sorted(values))
    if spec.category_buckets:
        return replace(base, num_buckets=spec.category_buckets)
    count = f"{len(values)}" if values is not None else f"more than {CATEGORY_COUNT_CAP}"
    raise InputError(
        f"feature column '{base.name}' holds {count} distinct values, more than "
        f"dataset.max_categories={spec.max_categories}: raise max_categories, or set "
        "dataset.category_buckets to hash the values into that many buckets"
    )


def features_record(codec: FeatureCodec, dropped_rows: dict[str, int]) -> dict[str, Any]:
    """The manifest's `features` field: the codec's state and the rows dropped per file."""
    return {"columns": codec.to_json(), "dropped_rows": dropped_rows}


def profiles_record(profiles: dict[str, ColumnProfile], spec: DatasetSpec) -> dict[str, Any]:
    """The merged profiles as the `features` field's `profiles`, which a chain's child
    folds its new files into (`earlier_profiles`). Distinct strings are kept only up to
    `max_categories`: past it the codec hashes or fails whatever a later file adds."""
    # The distinct-values sketch stays out (up to 4,096 hashes a column): a child's check
    # of identifying features covers its own new files.
    return {
        name: {
            **_without_hashes(profile),
            "values": sorted(profile.values)
            if profile.values is not None and len(profile.values) <= spec.max_categories
            else None,
        }
        for name, profile in profiles.items()
    }


def _without_hashes(profile: ColumnProfile) -> dict[str, Any]:
    # Not `asdict`: it deep-copies the distinct values and the sketch (0.6 s for 5,000
    # columns); the caller replaces `values` with a sorted copy.
    return {name: getattr(profile, name) for name in _RECORDED}


def earlier_profiles(features: dict[str, Any]) -> dict[str, ColumnProfile]:
    """The merged profiles a `features_record` holds ({} for a record without them)."""
    return {
        name: ColumnProfile(
            **{**raw, "values": None if raw["values"] is None else set(raw["values"])}
        )
        for name, raw in features.get("profiles", {}).items()
    }
