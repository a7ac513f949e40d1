"""Which columns the config names, and whether the files have them.

`schema_problem` and `row_problem` are one file's reasons to be rejected (a missing or
internal column name, a feature type no kind encodes, null or NaN labels under
`dataset.unlabelled: refuse`, null ids).
`absent_columns_error` is the config's mistake, said once: a column the config names that
no input file has is one `InputError` naming the config field, the columns the files do
have and the closest of them, not a schema-drift rejection of every file. `IdTally`
holds a file's ids for its duplicate check and id range; `too_many_classes` is the reason
given when a file, or the files together, hold more label values than allowed.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from dataclasses import field as dataclass_field

import numpy as np
import pyarrow as pa

from preprocessing.config import DatasetSpec
from preprocessing.contract.column_spec import kind_of
from preprocessing.scan.feature_stats import InputError, column_nulls

INTERNAL_PREFIX = "__ballast_"  # the exchange's own columns; inputs may not use the prefix
_SHOWN_COLUMNS = 20


def configured_columns(spec: DatasetSpec) -> dict[str, str]:
    """Each config field that names a column, with the column it names."""
    fields = {"dataset.label_column": spec.label_column}
    if spec.source_column:
        fields["dataset.source_column"] = spec.source_column
    if spec.id_column:
        fields["dataset.id_column"] = spec.id_column
    if spec.group_column:
        fields["dataset.group_column"] = spec.group_column
    if spec.holdout_column:
        fields["dataset.holdout_column"] = spec.holdout_column
    fields.update(
        {
            f"dataset.feature_columns[{index}]": name
            for index, name in enumerate(spec.feature_columns)
        }
    )
    return fields


def closest_column(name: str, columns: list[str]) -> str | None:
    """The column `name` most likely meant: one equal but for case, else difflib's best."""
    same = [column for column in columns if column.casefold() == name.casefold()]
    if same:
        return same[0]
    matches = difflib.get_close_matches(name, columns, n=1, cutoff=0.6)
    return matches[0] if matches else None


def absent_columns_error(schemas: list[pa.Schema], spec: DatasetSpec) -> InputError | None:
    """One error for every configured column that none of `schemas` has, or None."""
    present = list(dict.fromkeys(name for schema in schemas for name in schema.names))
    if not schemas:
        return None
    problems, known = [], set(present)
    for field, name in configured_columns(spec).items():
        if name in known:
            continue
        closest = closest_column(name, present)
        hint = f"; did you mean {closest!r}?" if closest else ""
        problems.append(f"{field} is {name!r}, a column no input file has{hint}")
    if not problems:
        return None
    shown = present[:_SHOWN_COLUMNS] + (["..."] if len(present) > _SHOWN_COLUMNS else [])
    return InputError(f"{'; '.join(problems)} (the files' columns: {shown})")


def schema_problem(schema: pa.Schema, spec: DatasetSpec) -> str | None:
    """Why a file's columns cannot make rows of the version, or None."""
    present = set(schema.names)  # `schema.names` is a new list each time: 5,000 columns
    missing = [name for name in configured_columns(spec).values() if name not in present]
    if missing:
        return f"schema drift: missing columns {missing}"
    internal = [name for name in schema.names if name.startswith(INTERNAL_PREFIX)]
    if internal:
        return (
            f"columns {internal} collide with ballast's internal columns (names "
            f"starting with '{INTERNAL_PREFIX}'): rename them"
        )
    if spec.id_column and not pa.types.is_integer(id_type := schema.field(spec.id_column).type):
        return (
            f"id column '{spec.id_column}' is {id_type}: ids must be integers (cast the "
            "column, name an integer column as dataset.id_column, or leave it unset "
            "for ids ballast derives)"
        )
    unknown = [
        f"'{name}' ({schema.field(name).type})"
        for name in spec.feature_columns
        if kind_of(schema.field(name).type) is None
    ]
    if unknown:
        return (
            f"feature columns {', '.join(unknown)} have types no feature kind encodes "
            "(numbers, booleans, timestamps and dates, lists of numbers, strings)"
        )
    return None


def row_problem(batch: pa.RecordBatch, spec: DatasetSpec, first_row: int) -> str | None:
    """Null or NaN labels (under `dataset.unlabelled: refuse`), null groups, ids or holdout
    times, in a batch starting at `first_row`, as a reason naming the first such row."""
    if spec.unlabelled == "refuse":
        unlabelled = column_nulls(batch.column(spec.label_column))
        if unlabelled.any():
            return (
                f"{int(unlabelled.sum())} null or NaN labels in column "
                f"'{spec.label_column}' (the first at row "
                f"{first_row + int(unlabelled.argmax())} of the file); "
                "dataset.unlabelled is 'refuse': set it to 'drop' to leave unlabelled "
                "rows out, counted per file"
            )
    for column, what, fix in (
        (spec.group_column, "groups", _GROUP_FIX),
        (spec.id_column, "ids", ""),
        (spec.holdout_column, "times", _TIME_FIX),
    ):
        values = batch.column(column) if column else None
        if values is not None and values.null_count:
            first = first_row + int(values.is_null().to_numpy(zero_copy_only=False).argmax())
            return (
                f"{values.null_count} null {what} in column '{column}' (the first at row "
                f"{first} of the file){fix}"
            )
    return None


_TIME_FIX = (
    ": dataset.holdout_by: newest needs a time in every row (fill them, or leave the file out)"
)
_GROUP_FIX = (
    ": dataset.group_column needs a value in every row (fill them, e.g. with the row's id, "
    "to make each its own group)"
)


@dataclass
class IdTally:
    """A file's ids as its scan reads them, for the duplicate check and the id range.
    Ids that rise strictly through the file (a key counted up, the common case) cannot
    repeat, so they are never sorted; others are joined once and sorted in place. Memory:
    8 bytes a row kept, where joining, sorting and ranging them took three copies more
    (a 17 M-row file's scan peaked at 0.71 GB, benchmarks/RESULTS.md M36)."""

    parts: list[np.ndarray] = dataclass_field(default_factory=list)
    rising: bool = True
    low: int | None = None
    high: int | None = None

    def add(self, ids: np.ndarray) -> None:
        """The next batch's ids."""
        if not len(ids):
            return
        if self.rising:
            after_last = self.high is None or int(ids[0]) > self.high
            self.rising = after_last and bool((ids[1:] > ids[:-1]).all())
        self.parts.append(ids)
        low, high = int(ids.min()), int(ids.max())
        self.low = low if self.low is None else min(self.low, low)
        self.high = high if self.high is None else max(self.high, high)

    def repeated(self) -> np.ndarray:
        """Every id after its first occurrence, sorted (empty: the ids are unique)."""
        if self.rising or not self.parts:
            return np.zeros(0, dtype=np.int64)
        ids, self.parts = np.concatenate(self.parts), []
        ids.sort()
        return ids[1:][ids[1:] == ids[:-1]]


def too_many_classes(spec: DatasetSpec, count: int) -> str:
    """The reason a file, or the run's files together, hold too many label values."""
    return (
        f"label column '{spec.label_column}' holds {count} distinct values, more than "
        f"dataset.max_classes={spec.max_classes} (a regression target? ballast trains "
        "classifiers: bin the values into classes, or raise max_classes)"
    )


def kept_ids_hint(spec: DatasetSpec) -> str:
    """Under `duplicates: drop` with an id column, what an id clash found on the rows the
    drop keeps means, and what to do about one with an earlier night's file."""
    if spec.duplicates != "drop" or not spec.id_column:
        return ""
    return (
        " (under duplicates: drop, ids are checked on the rows the drop keeps: rows that "
        "share an id and differ in label or features are not copies; and copies are left "
        "out within one night only, so a file an earlier night committed, sent again, "
        "repeats committed ids: leave it out of the inputs, or reshard every input as one "
        "night with mode: full)"
    )
