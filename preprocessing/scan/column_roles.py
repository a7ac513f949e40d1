"""The role of each column of raw files, for `ballast init`: what it proposes is what the
reshard's scan accepts.

`survey_columns` reads the files (every row up to `MAX_SURVEY_ROWS`, then stops and says
so) through the scan's own code: nulls are `column_nulls` (NaN is a null), distinct values
the scan's sketch (preprocessing/plan/distinct.py), categories the scan's profiles. Then
each column gets one role:

- `label`, `source`: the columns named so;
- `id`: strings or integers whose values (almost) tell rows apart, by the rule the scan
  warns with (`identifies_rows`), or unique under an id-ish name: never a feature; an
  integer one unique in every row read is proposed as `dataset.id_column`, the others are
  left out;
- `date`: strings whose values parse as ISO 8601 dates or timestamps: temporal features
  (`dataset.date_columns`);
- `wide`: strings with more distinct values than `dataset.max_categories` (a one-hot over
  them would fail the scan, and hashing such a column rarely helps: the user may add it
  back with `category_buckets`) or than half their rows (most values seen once): left out;
- `group`: a column under an id-ish or entity name (`patient`, `user_id`, `vehicle`...)
  whose values repeat (a value in two rows or more on average, at least `MIN_GROUPS`
  values): rows of one entity, proposed as `dataset.group_column`, never a feature;
- `feature`: the rest of what the codec encodes; `ignored`: types it does not.

The survey also counts rows that repeat an earlier row of the sample exactly (a file
re-sent, an export retried), for `init`'s `duplicates` proposal.

`check_proposal` then builds the feature codec from the same profiles with the scan's
`build_codec`: a proposal whose nulls, policies or categories the scan would refuse fails
here, in `init`, instead of in the user's first run.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from preprocessing.config import DatasetSpec
from preprocessing.contract.codec import parse_timestamps
from preprocessing.contract.column_spec import FeatureError, kind_of
from preprocessing.plan.distinct import (
    MIN_IDENTIFYING_ROWS,
    distinct_count,
    identifies_rows,
)
from preprocessing.plan.split_keys import row_hashes
from preprocessing.scan.feature_stats import (
    ColumnProfile,
    build_codec,
    column_nulls,
    new_profiles,
    profile_batch,
)
from preprocessing.storage.csv_reading import CsvReading
from preprocessing.storage.sources import iter_batches

# An id-ish name: `id`, `Id`, `uuid`, `stone_id`, `stoneId`, `row-key`, `GUID`: unique
# values under such a name are an id however few the rows.
ID_NAME = re.compile(r"(?i:^(id|uuid|uid|guid|key)$)|(?i:[_\-. ](id|uuid|uid|guid|key)$)|[a-z]Id$")
MAX_SURVEY_ROWS = 2_000_000  # rows `init` reads at most, over all files
# A string with more distinct values than half its rows: most values occur once, so a
# one-hot over them can only memorise rows (scikit-learn's cars: 311 names in 406 rows).
SPARSE_FRACTION = 0.5
DATE_SAMPLE = 200  # distinct non-null strings tried as dates, from the first batch
ENTITY_NAME = re.compile(
    r"(?i)(^|[_\-. ])(user|patient|customer|client|vehicle|device|store|session|account|"
    r"subject|member|household)s?($|[_\-. ])"
)
GROUP_ROWS = 2.0  # rows a value of a group column has on average, at least
# Groups a group column has, at least: whole groups move the holdout in steps of one group,
# so with fewer (a `batch_id` of 3 values) no holdout lands near its fraction; such a
# column stays a feature.
MIN_GROUPS = 20


@dataclass
class ColumnRole:
    """One column: its role and the counts `init` shows for it."""

    name: str
    arrow_type: pa.DataType
    role: str
    kind: str | None
    null_rows: int = 0
    distinct: int = 0
    rows: int = 0  # non-null values read


@dataclass
class TableSurvey:
    """What the files hold: each column's role, the label's classes and null labels."""

    files: list[str]
    schema: pa.Schema
    label: str
    reading: CsvReading  # how the files' CSV text reads: as the proposed config will
    num_rows: int = 0
    sampled: bool = False  # stopped at MAX_SURVEY_ROWS
    classes: Counter[Any] = field(default_factory=Counter)
    unlabelled: int = 0
    columns: dict[str, ColumnRole] = field(default_factory=dict)
    profiles: dict[str, ColumnProfile] = field(default_factory=dict)
    files_with_nulls: dict[str, list[str]] = field(default_factory=dict)
    row_hashes: list[np.ndarray] = field(default_factory=list)  # of whole rows
    duplicate_rows: int = 0  # rows equal to an earlier row of the sample

    def named(self, role: str) -> list[str]:
        return [name for name, column in self.columns.items() if column.role == role]


def date_columns(batch: pa.RecordBatch) -> list[str]:
    """The string columns whose first distinct values all parse as ISO 8601 dates."""
    found = []
    for name in batch.schema.names:
        if kind_of(batch.schema.field(name).type) != "category":
            continue
        values = pc.unique(batch.column(name).cast(pa.string()).drop_null())[:DATE_SAMPLE]
        try:
            parse_timestamps(values)
        except FeatureError:
            continue
        if len(values):
            found.append(name)
    return found


def survey_columns(
    files: list[str], label: str, source: str | None, reading: CsvReading
) -> TableSurvey:
    """Read the files (up to MAX_SURVEY_ROWS rows) and give every column its role."""
    first = next(iter_batches(files[0], reading=reading))
    survey = TableSurvey(files, first.schema, label, reading)
    candidates = [
        f.name
        for f in first.schema
        if f.name not in (label, source) and kind_of(f.type) is not None
    ]
    survey.profiles = new_profiles(first.schema, candidates, date_columns(first))
    integers: dict[str, list[np.ndarray]] = {
        name: [] for name in candidates if pa.types.is_integer(first.schema.field(name).type)
    }
    for uri in files:
        _read_file(survey, uri, integers)
        if survey.sampled:
            break
    rows = np.concatenate(survey.row_hashes) if survey.row_hashes else np.zeros(0, np.uint64)
    survey.duplicate_rows, survey.row_hashes = len(rows) - len(np.unique(rows)), []
    _assign_roles(
        survey,
        source,
        {name: np.concatenate(parts) if parts else np.zeros(0) for name, parts in integers.items()},
    )
    return survey


def _read_file(survey: TableSurvey, uri: str, integers: dict[str, list[np.ndarray]]) -> None:
    """Fold one file's rows into the survey: classes, null labels, profiles, integers."""
    nulls_before = {name: p.null_rows for name, p in survey.profiles.items()}
    for batch in iter_batches(uri, reading=survey.reading):
        batch = batch.slice(0, MAX_SURVEY_ROWS - survey.num_rows)
        unlabelled = column_nulls(batch.column(survey.label))
        survey.unlabelled += int(unlabelled.sum())
        labels = batch.column(survey.label).filter(pa.array(~unlabelled))
        survey.classes.update(labels.to_pylist())
        profile_batch(survey.profiles, batch, np.ones(batch.num_rows, dtype=bool))
        for name, parts in integers.items():
            parts.append(batch.column(name).drop_null().to_numpy(zero_copy_only=False))
        survey.row_hashes.append(row_hashes(batch, batch.schema.names))
        survey.num_rows += batch.num_rows
        if survey.num_rows >= MAX_SURVEY_ROWS:
            survey.sampled = True
            break
    for name, profile in survey.profiles.items():
        if profile.null_rows > nulls_before[name]:
            survey.files_with_nulls.setdefault(name, []).append(uri)


def _assign_roles(survey: TableSurvey, source: str | None, integers: dict[str, np.ndarray]) -> None:
    spec = DatasetSpec(inputs=["-"])  # the scan's defaults (max_categories)
    for item in survey.schema:
        profile = survey.profiles.get(item.name)
        column = ColumnRole(item.name, item.type, "ignored", profile.kind if profile else None)
        if item.name == survey.label:
            column.role, column.null_rows = "label", survey.unlabelled
        elif item.name == source:
            column.role = "source"
        elif profile is not None:
            column.null_rows, column.rows = profile.null_rows, profile.count
            column.distinct = distinct_count(profile.hashes)
            column.role = _role(column, profile, spec, integers.get(item.name))
        survey.columns[item.name] = column


def _role(
    column: ColumnRole, profile: ColumnProfile, spec: DatasetSpec, integers: np.ndarray | None
) -> str:
    if _repeating_entity(column, profile):
        return "group"
    named = ID_NAME.search(column.name) is not None and column.distinct == column.rows
    if len(profile.hashes) and (identifies_rows(column.distinct, column.rows) or named):
        unique = (
            integers is not None
            and not column.null_rows
            and len(np.unique(integers)) == len(integers)
        )
        return "id_column" if unique else "id"
    if profile.kind == "temporal" and pa.types.is_string(column.arrow_type):
        return "date"
    if profile.kind == "category" and (
        profile.values is None or len(profile.values) > spec.max_categories or _sparse(column)
    ):
        return "wide"
    return "feature"


def _repeating_entity(column: ColumnRole, profile: ColumnProfile) -> bool:
    """An entity's id (by its name) whose values repeat: its rows belong together."""
    entity = ID_NAME.search(column.name) or ENTITY_NAME.search(column.name)
    repeats = column.distinct >= MIN_GROUPS and column.distinct * GROUP_ROWS <= column.rows
    return bool(len(profile.hashes) and entity and repeats)


def _sparse(column: ColumnRole) -> bool:
    return column.rows >= MIN_IDENTIFYING_ROWS and column.distinct > SPARSE_FRACTION * column.rows


def check_proposal(survey: TableSurvey, spec: DatasetSpec) -> None:
    """Raise the scan's own `InputError` where the scan would refuse `spec` on these rows:
    nulls without a policy, a policy the column's kind refuses, too many categories."""
    profiles = {name: survey.profiles[name] for name in spec.feature_columns}
    build_codec(
        profiles,
        {name: survey.files_with_nulls.get(name, []) for name in spec.feature_columns},
        spec,
    )
