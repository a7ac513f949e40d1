"""The checks across a run's scanned files, before anything is written: schemas that drift
from the majority's (`check_schemas`), the label values
of all accepted files together, ids unique across files (only files whose id ranges
overlap are read again), the manifest's feature codec from every file's profiles, the
night's time cut (`holdout_by: newest`), the night's first copies (`duplicates: drop`) and
the accepted files' counts over global pieces for the plan. Each check raises `InputError`
(or names the clash) rather than rejecting one file.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any, cast

import numpy as np
import pyarrow as pa

from preprocessing.config import DatasetSpec
from preprocessing.plan.counts import Counts, concat_counts
from preprocessing.plan.first_copies import BUCKETS, bucket_groups, later_copies
from preprocessing.plan.row_ids import shared_id
from preprocessing.plan.time_cut import TimeCut, choose_cut, split_counts
from preprocessing.scan.columns import kept_ids_hint, too_many_classes
from preprocessing.scan.content_pairs import (
    ContentPairs,
    DropLists,
    RowsWritten,
    read_pairs,
    write_drop_list,
)
from preprocessing.scan.feature_stats import (
    InputError,
    build_codec,
    earlier_profiles,
    features_record,
    identifying_columns,
    merge_profiles,
    profiles_record,
)
from preprocessing.scan.inputs import FileScan
from preprocessing.storage.csv_reading import CsvReading
from preprocessing.storage.sources import iter_batches


def count_records(scans: list[FileScan]) -> tuple[Counts, np.ndarray]:
    """The accepted files' counts over global pieces (files in order), and each piece's
    (scan index, piece in file) as a [pieces, 2] array."""
    accepted = [index for index, scan in enumerate(scans) if scan.reason is None]
    num_pieces = np.fromiter(
        (len(scans[index].piece_rows) for index in accepted), np.int64, len(accepted)
    )
    first_pieces = np.cumsum(num_pieces) - num_pieces
    counts = concat_counts([scans[index].counts for index in accepted], first_pieces)
    pieces = np.empty((int(num_pieces.sum()), 2), dtype=np.int64)
    pieces[:, 0] = np.repeat(np.array(accepted, dtype=np.int64), num_pieces)
    pieces[:, 1] = np.arange(len(pieces)) - np.repeat(first_pieces, num_pieces)
    return counts, pieces


def time_cut_of(scans: list[FileScan], spec: DatasetSpec, fraction: float) -> TimeCut | None:
    """Under `holdout_by: newest`, the night's cut from its accepted files' time cells
    (preprocessing/plan/time_cut.py); else None. The same scans give the same cut, so the
    plan, every route and the manifest each ask for it."""
    if spec.holdout_by != "newest":
        return None
    cells = [scan.time_cells for scan in scans if scan.reason is None and scan.time_cells]
    return choose_cut(cells, fraction, spec.validation_fraction)


def with_time_cut(scans: list[FileScan], spec: DatasetSpec, fraction: float) -> list[FileScan]:
    """`scans` with their counts split by the night's time cut (unchanged without one):
    the plan then reads exact rows per split, as from any other scan."""
    cut = time_cut_of(scans, spec, fraction)
    if cut is None:
        return scans
    return [
        replace(scan, counts=split_counts(scan.time_cells, cut))
        if scan.reason is None and scan.time_cells is not None
        else scan
        for scan in scans
    ]


def with_first_copies(
    scans: list[FileScan], spec: DatasetSpec, directory: str, budget_rows: int
) -> list[FileScan]:
    """Under `duplicates: drop`, `scans` less every copy of a content but its first of
    the night (by file as listed, then row: preprocessing/plan/first_copies.py): the
    reduce over the pairs their scans wrote in `directory`, a range of hashes of about
    `budget_rows` pairs at a time, writing each file's drop list there; the counts
    corrected, so the plan is exact. Unchanged otherwise."""
    if spec.duplicates != "drop":
        return scans
    order = [i for i, scan in enumerate(scans) if scan.reason is None and scan.content_pairs]
    pairs = [cast(ContentPairs, scans[i].content_pairs) for i in order]
    bounds = np.array([p.bounds for p in pairs], np.int64).reshape(len(pairs), BUCKETS + 1)
    dropped: list[list[np.ndarray]] = [[] for _ in order]
    for start, stop in bucket_groups(np.diff(bounds, axis=1).sum(axis=0), budget_rows):
        parts = [
            read_pairs(directory, p.name, int(bounds[k, start]), int(bounds[k, stop]))
            for k, p in enumerate(pairs)
        ]
        for k, later in enumerate(later_copies(parts)):
            if later.any():
                dropped[k].append(parts[k][later])
    scans = list(scans)
    for k, index in enumerate(order):
        if dropped[k]:
            scans[index] = _less_copies(scans[index], np.concatenate(dropped[k]), directory)
    return scans


def _less_copies(scan: FileScan, dropped: np.ndarray, directory: str) -> FileScan:
    """`scan` with the rows of `dropped` (its pairs) out of its counts, their drop list
    written."""
    pairs = cast(ContentPairs, scan.content_pairs)
    write_drop_list(directory, pairs.name, dropped["row"])
    pieces = np.searchsorted(np.cumsum(scan.piece_rows), dropped["row"], side="right")
    keys, removed = np.unique(pieces * len(pairs.strata) + dropped["stratum"], return_counts=True)
    less: Counter[tuple[int, str, Any, Any]] = Counter()
    per_split: Counter[str] = Counter()
    for key, n in zip(keys.tolist(), removed.tolist(), strict=True):
        piece, code = divmod(key, len(pairs.strata))
        less[(piece, *pairs.strata[code])] += n
        per_split[pairs.strata[code][0]] += n
    records = [
        (p, sp, lab, src, n - less[(p, sp, lab, src)])
        for p, sp, lab, src, n in scan.counts.records()
    ]
    counts = Counts.of(record for record in records if record[-1] > 0)
    return replace(scan, counts=counts, duplicates_dropped=dict(sorted(per_split.items())))


def drop_lists(scans: list[FileScan], directory: str) -> DropLists | None:
    """What the routes read of the night's drop lists (None: no row is dropped)."""
    names = {
        scan.file.uri: scan.content_pairs.name
        for scan in scans
        if scan.reason is None and scan.content_pairs and scan.duplicates_dropped
    }
    return DropLists(directory, names) if names else None


def rows_written(scans: list[FileScan], directory: str) -> RowsWritten:
    """Under `drop`, where tonight's accepted files' rows written are told (`RowsWritten`)."""
    return RowsWritten(
        directory,
        {
            scan.file.uri: (p.name, p.bounds[-1], bool(scan.duplicates_dropped))
            for scan in scans
            if scan.reason is None and (p := scan.content_pairs)
        },
    )


def check_classes(scans: list[FileScan], spec: DatasetSpec) -> None:
    """The accepted files together must hold at most `max_classes` label values."""
    labels = {label for scan in scans if scan.reason is None for label in scan.counts.labels}
    if len(labels) > spec.max_classes:
        raise InputError(too_many_classes(spec, len(labels)))


def overlapping_id_groups(scans: list[FileScan]) -> list[list[str]]:
    """Accepted files whose id ranges overlap, grouped (each file's own ids are unique
    already); files with disjoint ranges cannot share an id and need no read."""
    ranged = sorted(
        (scan.id_range, scan.file.uri)
        for scan in scans
        if scan.reason is None and scan.id_range is not None
    )
    groups: list[list[str]] = []
    reach = None
    for (low, high), uri in ranged:
        if reach is not None and low <= reach:
            groups[-1].append(uri)
            reach = max(reach, high)
        else:
            groups.append([uri])
            reach = high
    return [group for group in groups if len(group) > 1]


def id_groups(scans: list[FileScan], earlier: list[FileScan]) -> list[list[str]]:
    """The files whose ids `duplicate_ids` must read, by group: files (with the `earlier`
    files of a chain's parent) whose id ranges overlap, where one is tonight's; and under
    `duplicates: drop`, each file whose own ids repeat (its scan left that to the rows
    the drop keeps: scan/inputs.py)."""
    new = {scan.file.uri for scan in scans}
    groups = [g for g in overlapping_id_groups([*scans, *earlier]) if new & set(g)]
    grouped = {uri for group in groups for uri in group}
    return groups + [
        [scan.file.uri]
        for scan in scans
        if scan.reason is None
        and scan.content_pairs
        and scan.content_pairs.repeated_ids
        and scan.file.uri not in grouped
    ]


def check_ids(
    scans: list[FileScan],
    earlier: list[FileScan],
    spec: DatasetSpec,
    on_cluster: Callable[[Callable[..., str | None], list[list[str]]], list[str | None]],
    written: RowsWritten | None = None,
) -> None:
    """Ids unique among tonight's `scans` and against the `earlier` files of a chain's
    parent; `InputError` naming a clash. Under `duplicates: drop` the driver runs it
    after the reduce, on the rows `written` (`rows_written`): a copy left out no longer
    holds its id. `on_cluster(check, groups)`: check's answer for each group."""
    groups = id_groups(scans, earlier)
    committed = frozenset(scan.file.uri for scan in earlier)
    check = partial(duplicate_ids, spec=spec, written=written, committed=committed)
    found = on_cluster(check, groups) if groups else []
    if any(found):
        raise id_clash(found, spec)


def id_clash(found: list[str | None], spec: DatasetSpec) -> InputError:
    """The error naming ids held by two files (`found`: `duplicate_ids`' answers)."""
    return InputError("; ".join(problem for problem in found if problem) + kept_ids_hint(spec))


def duplicate_ids(
    uris: list[str],
    spec: DatasetSpec,
    written: RowsWritten | None = None,
    committed: frozenset[str] = frozenset(),
) -> str | None:
    """An id held by two rows of `uris`, named with its rows and files, or None (reads the
    id column). Of a file `written` holds, only its rows written are read (`duplicates:
    drop`); two rows of `committed` files (an earlier night's, checked then) never clash.
    Derived ids (no id column) of files whose ranges overlap do clash: no read needed."""
    id_column = spec.id_column
    if id_column is None:
        return (
            f"the row ids ballast derives (dataset.id_column unset) of {uris} overlap: "
            "those files have the same path relative to their input roots; list one "
            "root that holds them all, or name an id column as dataset.id_column"
        )
    parts = [_written_ids(uri, id_column, CsvReading.of(spec), written) for uri in uris]
    owners = np.repeat(np.arange(len(uris)), [len(ids) for ids, _ in parts])
    ids, rows = (np.concatenate([part[k] for part in parts]) for k in (0, 1))
    clash = shared_id(ids, owners, np.array([uri in committed for uri in uris]))
    if clash is None:
        return None
    first, second = (uris[owners[at]] for at in clash)
    where = _clash_place(first, second, (int(rows[clash[0]]), int(rows[clash[1]])), committed)
    return (
        f"column '{id_column}': id {ids[clash[0]]} is in {where}; "
        "ids must be unique across the input files"
    )


def _clash_place(first: str, second: str, rows: tuple[int, int], committed: frozenset[str]) -> str:
    """Where two rows sharing an id are: one file twice, or two files (saying which of
    them an earlier version read), with the rows."""
    at_rows = f"rows {rows[0]} and {rows[1]}"
    if first == second:
        return f"{first} twice ({at_rows})"
    earlier = "".join(
        f", {uri} an input of an earlier version" for uri in (first, second) if uri in committed
    )
    return f"both {first} and {second} ({at_rows}){earlier}"


def _written_ids(
    uri: str, id_column: str, reading: CsvReading, written: RowsWritten | None
) -> tuple[np.ndarray, np.ndarray]:
    """The ids of the file at `uri` (of its rows `written`, if it is tonight's under
    `drop`), and their row numbers."""
    batches = iter_batches(uri, columns=[id_column], reading=reading)
    ids = np.concatenate([batch.column(0).to_numpy(zero_copy_only=False) for batch in batches])
    kept = written.written(uri, len(ids)) if written else None
    if kept is None:
        return ids, np.arange(len(ids))
    return ids[kept], np.flatnonzero(kept)


def feature_state(
    scans: list[FileScan], spec: DatasetSpec, earlier: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The manifest's `features` field from the accepted files' profiles, folded into the
    `earlier` version's (a chain's parent: its files are not read again); `InputError` for
    nulls under `error`, unsupported policies, too many categories, identifying features."""
    accepted = [scan for scan in scans if scan.reason is None]
    earlier = earlier or {}
    profiles = merge_profiles([earlier_profiles(earlier), *(scan.profiles for scan in accepted)])
    files_with_nulls = {
        name: [scan.file.uri for scan in accepted if scan.profiles[name].null_rows]
        for name in spec.feature_columns
    }
    codec = build_codec(profiles, files_with_nulls, spec)
    dropped = {
        **earlier.get("dropped_rows", {}),
        **{scan.file.uri: scan.dropped_rows for scan in accepted if scan.dropped_rows},
    }
    copies = {
        **earlier.get("duplicates_dropped", {}),
        **{
            s.file.uri: sum(s.duplicates_dropped.values()) for s in accepted if s.duplicates_dropped
        },
    }
    unlabelled = {
        **earlier.get("unlabelled_rows", {}),
        **{scan.file.uri: scan.unlabelled_rows for scan in accepted if scan.unlabelled_rows},
    }
    return {
        **features_record(codec, dropped),
        "unlabelled_rows": unlabelled,
        **({"duplicates_dropped": copies} if copies else {}),  # a key only where rows are
        "identifying_columns": identifying_columns(profiles, spec),
        "profiles": profiles_record(profiles, spec),
    }


def check_schemas(scans: list[FileScan]) -> list[FileScan]:
    """Reject accepted files whose schema differs from the most common one, saying how."""
    schemas = [scan.schema for scan in scans if scan.reason is None and scan.schema is not None]
    if not schemas:
        return scans
    reference = Counter(s.remove_metadata().to_string() for s in schemas).most_common(1)[0][0]
    reference_schema = next(s for s in schemas if s.remove_metadata().to_string() == reference)
    return [
        scan
        if scan.reason
        or scan.schema is None
        or scan.schema.remove_metadata().equals(reference_schema.remove_metadata())
        else replace(scan, reason=_describe_drift(scan.schema, reference_schema))
        for scan in scans
    ]


def _describe_drift(found: pa.Schema, expected: pa.Schema) -> str:
    present = set(found.names)  # `names` is a new list at each call
    for name in expected.names:
        if name not in present:
            return f"schema drift: missing column '{name}'"
        if not found.field(name).type.equals(expected.field(name).type):
            return (
                f"schema drift: column '{name}' is {found.field(name).type}, "
                f"expected {expected.field(name).type}"
            )
    wanted = set(expected.names)
    extra = [name for name in found.names if name not in wanted]
    return f"schema drift: unexpected columns {extra}"
