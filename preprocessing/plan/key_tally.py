"""The manifest's record of groups and duplicates per split, in bounded memory.

A scan tallies, per batch and per `<split>/<kind>` (kind: `group` or `content`, the hashes
of preprocessing/plan/split_keys.py: `key_hashes`; under a group with `same_split` the
content is tallied where the exchange reads the rows, `exchange_content_tally`, as the
scan then reads no feature column for it), the rows and two samples of the
distinct hashes with their rows: the SAMPLE smallest hashes (a bottom-k sample: a key
among the smallest of the union is among the smallest of every part that holds it, so
its rows merge exactly) and the TOP keys by rows. Merged over batches and files, an
entry holds at most SAMPLE + TOP keys however many rows there are (the driver holds
16 bytes a key of them per file). While a split holds fewer than SAMPLE distinct keys
every figure is exact; past it the number of keys is the K-minimum-values estimate and
the duplicate rows are the sample's scaled to it (the record says `estimated_from`). The
largest group is the largest of the per-part top lists summed: exact when it is among
each part's TOP, a lower bound otherwise.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from preprocessing.config import DatasetSpec
from preprocessing.plan.counts import SPLITS
from preprocessing.plan.split_keys import content_columns, content_in_map, row_hashes

SAMPLE = 4096
TOP = 64

# (sample hashes, their rows, top hashes, their rows, [all rows])
Tally = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]
KeyCounts = dict[str, Tally]


def tally_keys(keys: dict[str, np.ndarray], splits: np.ndarray) -> KeyCounts:
    """The tally of each kind of `keys` (`key_hashes` of some rows) per split (`splits`:
    each row's split code, or a holdout mask); empty when there are none (nothing to
    record). Train and holdout are always tallied, validation where it has rows."""
    tally: KeyCounts = {}
    present = {0, 1} | set(np.unique(splits).tolist())
    for kind, hashes in keys.items():
        for code, split in enumerate(SPLITS):
            if code not in present:
                continue
            rows = splits == code
            # A sort and its runs: np.unique's inverse (an argsort) is needed only to weigh.
            unique, counts = np.unique(hashes[rows], return_counts=True)
            counts = counts.astype(np.int64)
            tally[f"{split}/{kind}"] = _bounded(unique, counts, unique, counts, int(rows.sum()))
    return tally


def exchange_content_tally(table: pa.Table, spec: DatasetSpec, splits: np.ndarray) -> KeyCounts:
    """The content tally of `table`'s rows (those the scan counts, as read, with their
    split codes `splits`) where the exchange takes it (`split_keys.content_in_map`); empty
    otherwise. Merged with the scans' group tallies, the manifest's figures are those of a
    scan that hashed the content: a bottom-k sample and the rows merge exactly however the
    rows are cut into batches, pieces or files."""
    if not content_in_map(spec):
        return {}
    return tally_keys({"content": row_hashes(table, content_columns(spec))}, splits)


def merge_keys(parts: list[KeyCounts]) -> KeyCounts:
    """The tallies of several batches or files as one."""
    names = dict.fromkeys(name for part in parts for name in part)
    merged: KeyCounts = {}
    for name in names:
        entries = [part[name] for part in parts if name in part]
        sample = _distinct(*(np.concatenate([e[i] for e in entries]) for i in (0, 1)))
        top = _distinct(*(np.concatenate([e[i] for e in entries]) for i in (2, 3)))
        rows = int(sum(int(e[4].sum()) for e in entries))
        merged[name] = _bounded(*sample, *top, rows)
    return merged


def _bounded(
    hashes: np.ndarray, counts: np.ndarray, top: np.ndarray, top_counts: np.ndarray, rows: int
) -> Tally:
    """The SAMPLE smallest of sorted `hashes` and the TOP of `top` by rows."""
    largest = _largest(top_counts, TOP)
    return hashes[:SAMPLE], counts[:SAMPLE], top[largest], top_counts[largest], np.array([rows])


def _largest(counts: np.ndarray, k: int) -> np.ndarray:
    """`np.argsort(-counts, kind="stable")[:k]` (the k largest, ties by position) without
    sorting them all: a scan's batch of distinct groups holds 65,536 counts of 1."""
    if len(counts) <= k:
        return np.argsort(-counts, kind="stable")
    cutoff = np.partition(counts, len(counts) - k)[len(counts) - k]  # the k-th largest
    above = np.flatnonzero(counts > cutoff)  # fewer than k
    chosen = np.r_[above, np.flatnonzero(counts == cutoff)[: k - len(above)]]
    return chosen[np.argsort(-counts[chosen], kind="stable")]


def _distinct(hashes: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    unique, inverse = np.unique(hashes, return_inverse=True)
    return unique, np.bincount(inverse, weights=rows, minlength=len(unique)).astype(np.int64)


def split_value_stats(keys: KeyCounts) -> dict[str, dict[str, float]]:
    """Per split: its rows, its groups and the largest group's share of its rows, and the
    input rows whose content another input row of the split shares (copies oversampling
    makes are not input rows). Whole groups are held out, so the held-out share of rows
    is what the draw achieved."""
    stats: dict[str, dict[str, float]] = {}
    for name, (hashes, counts, _, top_counts, rows) in sorted(keys.items()):
        split, kind = name.split("/")
        entry = stats.setdefault(split, {"rows": int(rows.sum())})
        total, distinct = int(rows.sum()), float(len(hashes))
        if len(hashes) >= SAMPLE:  # K-minimum-values: the k-th smallest of 2**64
            distinct = (SAMPLE - 1) * 2.0**64 / (float(hashes[SAMPLE - 1]) + 1.0)
            entry["estimated_from"] = SAMPLE
        if kind == "group":
            entry["groups"] = round(distinct)
            share = int(top_counts.max()) / total if total else 0.0
            entry["largest_group_share"] = round(share, 6)
        else:
            scale = distinct / len(hashes) if len(hashes) else 0.0
            entry["duplicate_rows"] = round(float(counts[counts > 1].sum()) * scale)
    return stats
