"""Under `dataset.duplicates: drop`, the pairs a file's scan writes and the drop lists
the routes read (the rule: preprocessing/plan/first_copies.py).

A scan keeps, per kept row, its content hash, row number and a code for its (split,
label, source) (`PairTally`, 20 bytes a row while the file is read) and writes them once,
sorted by hash, as `<run's scratch>/_duplicates/<file key>.pairs` (`ContentPairs` names
the object by the file, not by the scratch: a rerun that takes a dead attempt over finds
it under its own). The night's reduce (preprocessing/scan/across_files.py:
`with_first_copies`) writes each file's dropped row numbers, ascending, as
`<file key>.drop`; `DropLists` is what every route is given to read them, where rows are
read for routing (preprocessing/exchange/staged_rows.py: `read_piece`). `RowsWritten`
tells, from both, which rows reach the version: the rows whose ids must be unique.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
from fsspec.core import url_to_fs

from preprocessing.config import DatasetSpec
from preprocessing.plan.counts import SPLITS
from preprocessing.plan.first_copies import PAIR_DTYPE, bucket_bounds, sorted_pairs
from preprocessing.scan.row_counts import row_sources, value_codes
from preprocessing.storage.objects import write_object
from preprocessing.storage.sources import InputFile

DUPLICATES_DIR = "_duplicates"  # in a run's staging attempt: keyed by the run


def file_key(file: InputFile) -> str:
    """The name a file's pairs and drop list have in the run's scratch."""
    return hashlib.sha256(file.uri.encode()).hexdigest()[:24]


def pairs_dir(attempt_uri: str) -> str:
    return f"{attempt_uri}/{DUPLICATES_DIR}"


@dataclass(frozen=True)
class ContentPairs:
    """A file's pairs as written: `name` in the scratch, where each hash bucket's pairs
    start (`bounds`, plan/first_copies.py: `bucket_bounds`) and the (split, label,
    source) each stratum code stands for."""

    name: str
    bounds: tuple[int, ...]
    strata: tuple[tuple[str, Any, Any], ...]
    # Two of the file's rows share an id of `dataset.id_column`: checked once the drop is
    # known, on the rows it keeps (preprocessing/scan/across_files.py: `id_groups`).
    repeated_ids: bool = False


@dataclass
class PairTally:
    """A file's pairs as its scan reads its batches."""

    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    strata: dict[tuple[str, Any, Any], int] = field(default_factory=dict)
    repeated_ids: bool = False

    def add(
        self,
        content: np.ndarray,
        rows: np.ndarray,
        splits: np.ndarray,
        table: pa.Table,
        spec: DatasetSpec,
        file: InputFile,
    ) -> None:
        """The pairs of a batch's kept rows (`table`; `rows`, their numbers in the file;
        `content`, their hashes; `splits`, their split codes)."""
        labels, label_codes = value_codes(table.column(spec.label_column))
        sources, source_codes = value_codes(row_sources(table, spec, file))
        key = (splits.astype(np.int64) * len(labels) + label_codes) * len(sources) + source_codes
        distinct, inverse = np.unique(key, return_inverse=True)
        rest, source = np.divmod(distinct, max(len(sources), 1))
        split, label = np.divmod(rest, max(len(labels), 1))
        codes = [
            self.strata.setdefault((SPLITS[s], labels[lab], sources[src]), len(self.strata))
            for s, lab, src in zip(split.tolist(), label.tolist(), source.tolist(), strict=True)
        ]
        strata = np.array(codes, dtype=np.int32)[inverse.reshape(-1)]
        self.parts.append((content, rows, strata))

    def write(self, directory: str, file: InputFile) -> ContentPairs:
        """Write the file's pairs, sorted by hash, into `directory`; what names them."""
        columns = [np.concatenate([part[i] for part in self.parts]) for i in range(3)]
        pairs = sorted_pairs(*columns) if self.parts else np.zeros(0, PAIR_DTYPE)
        fs, path = url_to_fs(f"{directory}/{file_key(file)}.pairs")
        write_object(fs, path, pairs.tobytes())
        bounds = tuple(bucket_bounds(pairs).tolist())
        return ContentPairs(file_key(file), bounds, tuple(self.strata), self.repeated_ids)


def read_pairs(directory: str, name: str, start: int, stop: int) -> np.ndarray:
    """Pairs `start`..`stop` of the file named `name` in `directory`: one ranged read."""
    if stop <= start:
        return np.zeros(0, PAIR_DTYPE)
    fs, path = url_to_fs(f"{directory}/{name}.pairs")
    size = PAIR_DTYPE.itemsize
    data = fs.cat_file(path, start=start * size, end=stop * size)
    return np.frombuffer(data, dtype=PAIR_DTYPE)


def write_drop_list(directory: str, name: str, rows: np.ndarray) -> None:
    fs, path = url_to_fs(f"{directory}/{name}.drop")
    write_object(fs, path, np.sort(rows).astype(np.int64).tobytes())


@dataclass(frozen=True)
class DropLists:
    """Where a night's drop lists are: the scratch and, by file URI, the name of each
    file that has one (O(files): what every map task is given)."""

    directory: str
    names: dict[str, str]

    def dropped(self, file: InputFile, first_row: int, num_rows: int) -> np.ndarray:
        """True for rows `first_row`.. (`num_rows`) of `file` that a copy before them holds."""
        mask = np.zeros(num_rows, dtype=bool)
        name = self.names.get(file.uri)
        if name is None:
            return mask
        rows = _drop_rows(f"{self.directory}/{name}.drop")
        low, high = np.searchsorted(rows, [first_row, first_row + num_rows])
        mask[rows[low:high] - first_row] = True
        return mask


@dataclass(frozen=True)
class RowsWritten:
    """Which rows of tonight's files reach the version under `drop`: those the scan kept
    (its pairs: not left out by a null or unlabelled policy) but those a drop list
    names; by file URI, the name of its pairs, their number and whether it has a list."""

    directory: str
    files: dict[str, tuple[str, int, bool]]

    def written(self, uri: str, num_rows: int) -> np.ndarray | None:
        """True for the rows of `uri` (of `num_rows`) written, or None: not tonight's.
        A mask, not a sort: the pairs come in hash order."""
        if uri not in self.files:
            return None
        name, count, dropped = self.files[uri]
        mask = np.zeros(num_rows, dtype=bool)
        mask[read_pairs(self.directory, name, 0, count)["row"]] = True
        if dropped:
            mask[_drop_rows(f"{self.directory}/{name}.drop")] = False
        return mask


# A file's pieces go to the same map task or thread pool one after the other: each read
# the file's whole list, so a file of P pieces read it P times. A list is written once
# per attempt (its path is keyed by the run) and never changed, so a few are kept.
@lru_cache(maxsize=8)
def _drop_rows(uri: str) -> np.ndarray:
    """The ascending row numbers of a drop list (read-only)."""
    fs, path = url_to_fs(uri)
    return np.frombuffer(fs.cat_file(path, start=0), dtype=np.int64)
