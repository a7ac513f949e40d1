"""What changed in the data between a dataset version and its parent: the drift report.

Pure functions over two manifests (preprocessing/contract/manifest.py), no I/O: flows
read the manifests and pass them in, then publish the report (a Prefect markdown
artifact, MLflow metrics) and hold back a promotion whose report passes a threshold
(tracking/lifecycle/promotion.py). The parent is the version's `parent_version` (a chain's child),
or, for a flat version, the version `_CURRENT` named before the run made it.

The distance is the population stability index, PSI = sum over bins of
(after - before) * ln(after / before) over shares, each share floored at `SHARE_FLOOR` so
that a category that is new (or gone) costs a large but finite amount. 0 means the same
distribution; 0.1 is usually read as a small shift and 0.25 as a large one.

- classes and sources: PSI over the input rows' class (source) shares, each class's
  share before and after and its term of the sum, so the report names the class that moved;
- numeric (and temporal, boolean) feature columns: the scan's merged profile stores count,
  mean and squared deviations, not a histogram, so the distribution is read as a normal of
  that mean and standard deviation: bins at the parent's deciles, the child's shares of
  them by its own normal's CDF (a shift of mean or spread is seen; a change of shape at
  equal moments is not);
- category columns: PSI over category shares when the caller counted them (`category
  counts`, e.g. of each version's held-out rows), else only the vocabulary's new and gone values;
- every feature column: the null rate before and after (rows with a null among the rows read);
- rows: input rows before and after, added or removed, dropped by a `drop_row` policy, and
  the rejected input files (new ones named).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from preprocessing.contract.manifest import Manifest
from preprocessing.contract.names import mlflow_key

SHARE_FLOOR = 1e-4
NUM_BINS = 10
_SCALAR_KINDS = ("numeric", "boolean", "temporal")
MAX_NAMED_FILES = 5


def shares(counts: Mapping[str, float]) -> dict[str, float]:
    """Each key's share of the total (all 0 for an empty or zero total)."""
    total = float(sum(counts.values()))
    return {key: (value / total if total > 0 else 0.0) for key, value in counts.items()}


def psi_terms(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """Each key's term of the PSI between two count (or share) maps over their union of
    keys; a side with no rows at all contributes nothing to compare, so every term is 0."""
    if sum(before.values()) <= 0 or sum(after.values()) <= 0:
        return {key: 0.0 for key in {*before, *after}}
    p, q = shares(before), shares(after)
    terms = {}
    for key in sorted({*p, *q}, key=str):
        old, new = max(p.get(key, 0.0), SHARE_FLOOR), max(q.get(key, 0.0), SHARE_FLOOR)
        terms[key] = (new - old) * math.log(new / old)
    return terms


def psi(before: Mapping[str, float], after: Mapping[str, float]) -> float:
    """The population stability index of two count (or share) maps."""
    return float(sum(psi_terms(before, after).values()))


def normal_psi(
    before: tuple[float, float], after: tuple[float, float], num_bins: int = NUM_BINS
) -> float:
    """PSI of two normals given as (mean, standard deviation), over bins at the deciles of
    `before`. A zero deviation (a constant column) is read as a very narrow normal."""
    first, second = (
        NormalDist(mean, max(std, 1e-9 * (1.0 + abs(mean)))) for mean, std in (before, after)
    )
    edges = [first.inv_cdf(k / num_bins) for k in range(1, num_bins)]
    cdf = [0.0, *(second.cdf(edge) for edge in edges), 1.0]
    new = {str(k): cdf[k + 1] - cdf[k] for k in range(num_bins)}
    return psi({str(k): 1.0 / num_bins for k in range(num_bins)}, new)


@dataclass(frozen=True)
class ShareChange:
    """One class or source: its share of the input rows before and after, and its PSI term."""

    name: str
    before: float
    after: float
    term: float


@dataclass(frozen=True)
class FeatureDrift:
    """One feature column: its PSI (None: nothing to compare it by) and null rates."""

    name: str
    kind: str
    psi: float | None
    null_rate_before: float
    null_rate_after: float
    note: str = ""

    @property
    def null_rate_change(self) -> float:
        return self.null_rate_after - self.null_rate_before


@dataclass(frozen=True)
class DriftReport:
    """A version against its parent (see the module docstring)."""

    version: str
    parent: str
    classes: list[ShareChange]
    class_psi: float
    sources: list[ShareChange]
    source_psi: float
    features: list[FeatureDrift]
    rows: dict[str, int]
    new_rejected_files: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """Flat MLflow metric names and values (`drift.class_psi`, `drift.feature.x.psi`)."""
        values = {
            "drift.class_psi": self.class_psi,
            "drift.source_psi": self.source_psi,
            **{f"drift.rows.{name}": float(count) for name, count in self.rows.items()},
        }
        for column in self.features:
            if column.psi is not None:
                values[mlflow_key(column.name, "drift.feature.", ".psi")] = column.psi
            values[mlflow_key(column.name, "drift.feature.", ".null_rate_change")] = (
                column.null_rate_change
            )
        return values


def share_changes(before: Mapping[str, int], after: Mapping[str, int]) -> list[ShareChange]:
    p, q, terms = shares(before), shares(after), psi_terms(before, after)
    return [ShareChange(key, p.get(key, 0.0), q.get(key, 0.0), terms[key]) for key in terms]


def rows_read(manifest: Manifest) -> int:
    """Input rows the version read: the rows kept (its input class counts) and dropped."""
    dropped = manifest.features.get("dropped_rows") or {}
    return sum(manifest.input_class_counts.values()) + sum(int(n) for n in dropped.values())


def column_profile(manifest: Manifest, name: str) -> dict[str, Any] | None:
    return (manifest.features.get("profiles") or {}).get(name)


def moments(manifest: Manifest, name: str) -> tuple[float, float] | None:
    """(mean, standard deviation) of a feature column's values from the scan's profile,
    or from the codec's standardization (shift, scale) when the version has no profile."""
    profile = column_profile(manifest, name)
    if profile and profile.get("count"):
        return float(profile["mean"]), math.sqrt(float(profile["m2"]) / profile["count"])
    spec = _spec(manifest, name)
    if spec and (spec.get("shift") or spec.get("scale", 1.0) != 1.0):
        return float(spec["shift"]), float(spec["scale"])
    return None


def _spec(manifest: Manifest, name: str) -> dict[str, Any] | None:
    return next(
        (column for column in manifest.features.get("columns") or [] if column["name"] == name),
        None,
    )


def null_rate(manifest: Manifest, name: str) -> float:
    """Rows with a null in the column (the scan's count) among the rows read."""
    profile = column_profile(manifest, name) or {}
    nulls = profile.get("null_rows", (_spec(manifest, name) or {}).get("null_count", 0))
    total = rows_read(manifest)
    return float(nulls) / total if total else 0.0


def feature_drift(
    before: Manifest,
    after: Manifest,
    name: str,
    category_counts: tuple[Mapping[str, int], Mapping[str, int]] | None,
) -> FeatureDrift:
    """One column's PSI and null rates (see the module docstring for how each kind's PSI
    is computed)."""
    spec = _spec(after, name) or {"kind": "numeric"}
    kind = str(spec["kind"])
    rates = null_rate(before, name), null_rate(after, name)
    if kind == "category":
        return _category_drift(before, after, name, category_counts, rates)
    if kind in _SCALAR_KINDS:
        old, new = moments(before, name), moments(after, name)
        if old is not None and new is not None:
            return FeatureDrift(name, kind, normal_psi(old, new), *rates)
        return FeatureDrift(name, kind, None, *rates, note="no statistics stored")
    return FeatureDrift(name, kind, None, *rates, note=f"no distance for {kind} columns")


def _category_drift(
    before: Manifest,
    after: Manifest,
    name: str,
    counts: tuple[Mapping[str, int], Mapping[str, int]] | None,
    rates: tuple[float, float],
) -> FeatureDrift:
    old = set((_spec(before, name) or {}).get("vocabulary") or [])
    new = set((_spec(after, name) or {}).get("vocabulary") or [])
    note = ", ".join(
        part
        for part in (
            f"new values {sorted(new - old)[:5]}" if new - old else "",
            f"gone values {sorted(old - new)[:5]}" if old - new else "",
        )
        if part
    )
    value = psi(*counts) if counts is not None else None
    return FeatureDrift(
        name, "category", value, *rates, note=note or ("" if counts else "no category counts")
    )


def drift_report(
    before: Manifest,
    after: Manifest,
    category_counts: Mapping[str, tuple[Mapping[str, int], Mapping[str, int]]] | None = None,
) -> DriftReport:
    """`after` against its parent `before`; `category_counts`: per category column, its
    value counts in each version's rows, when the caller counted them."""
    counts = category_counts or {}
    old_rejected = {rejected.path for rejected in before.rejected}
    rows_before, rows_after = (sum(m.input_class_counts.values()) for m in (before, after))
    dropped = [
        sum(int(n) for n in (m.features.get("dropped_rows") or {}).values())
        for m in (before, after)
    ]
    new_rejected = [r.path for r in after.rejected if r.path not in old_rejected]
    rows = {
        "before": rows_before,
        "after": rows_after,
        "added": max(rows_after - rows_before, 0),
        "removed": max(rows_before - rows_after, 0),
        "dropped_before": dropped[0],
        "dropped_after": dropped[1],
        "rejected_files_before": len(before.rejected),
        "rejected_files_after": len(after.rejected),
    }
    classes = share_changes(before.input_class_counts, after.input_class_counts)
    sources = share_changes(before.input_source_counts, after.input_source_counts)
    return DriftReport(
        version=after.version_id,
        parent=before.version_id,
        classes=classes,
        class_psi=sum(c.term for c in classes),
        sources=sources,
        source_psi=sum(s.term for s in sources),
        features=[
            feature_drift(before, after, name, counts.get(name)) for name in after.feature_columns
        ],
        rows=rows,
        new_rejected_files=new_rejected,
    )
