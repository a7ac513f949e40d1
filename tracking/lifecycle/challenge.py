"""What a challenger is judged on besides its own score: the drift of its dataset version
against the parent, and the current champion scored on the same held-out rows.

1. Drift: a version with a parent (its `parent_version`, or the version `_CURRENT` named
   before the run made a flat one) gets a report against it (tracking/lifecycle/drift.py),
   category shares counted on each version's held-out rows.
2. Same rows: the current champion (pinned by version number, not by alias) is scored on
   the new version's held-out rows by the one evaluation (tracking/lifecycle/scoring.py
   `evaluate`, through the codec logged with the champion). A champion whose codec refuses
   the rows (a missing column, another type, a class it does not know) is reported as
   unable to read them, which holds the challenger back unless `force`
   (tracking/lifecycle/promotion.py decides). Given a `scoring_run` config, the scoring
   is recorded as a run of its own (a child of the night's run), with the metric names
   the arms' runs use.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from preprocessing.contract.codec import FeatureCodec
from preprocessing.contract.column_spec import FeatureError
from preprocessing.contract.manifest import Manifest, manifest_uri, read_manifest, shard_uri
from tracking.config import TrackingConfig
from tracking.lifecycle.champion import champion
from tracking.lifecycle.drift import DriftReport, drift_report
from tracking.lifecycle.holdout import log_scoring_run
from tracking.lifecycle.promotion import SameRows
from tracking.lifecycle.scoring import Mapper, ModelError, evaluate
from tracking.lifecycle.trust import UntrustedModel

SPLIT = "holdout"
# A champion's codec that refuses the rows raises one of these: the rows are unreadable
# to it, which no retry changes (an interrupted read raises ArrowInvalid or OSError instead).
# A champion that fails its check before loading (UntrustedModel) is not scored either:
# the new version is held back as challenger with that reason, nothing of it loaded.
UNREADABLE = (
    FeatureError,
    ModelError,
    UntrustedModel,
    pa.ArrowTypeError,
    pa.ArrowNotImplementedError,
)


def parent_of(manifest: Manifest, current_before: str | None) -> str | None:
    """The version to compare with: the chain's parent, else what `_CURRENT` named before
    the run (None for the first version, or when the run made no new one)."""
    if manifest.parent_version is not None:
        return manifest.parent_version
    return current_before if current_before != manifest.version_id else None


def category_counts(manifest: Manifest, location: str) -> dict[str, dict[str, int]]:
    """Value counts of each category column over the version's held-out rows."""
    names = [
        spec.name
        for spec in FeatureCodec.from_manifest(manifest).columns
        if spec.kind == "category"
    ]
    counts: dict[str, dict[str, int]] = {name: {} for name in names}
    if not names or SPLIT not in manifest.splits:
        return counts
    for entry in manifest.split(SPLIT).shards:
        table = pq.read_table(shard_uri(location, entry), columns=names)
        for name in names:
            for item in pc.value_counts(table.column(name).combine_chunks()).to_pylist():
                key = "<null>" if item["values"] is None else str(item["values"])
                counts[name][key] = counts[name].get(key, 0) + int(item["counts"])
    return counts


def drift_against(location: str, parent: str) -> DriftReport:
    """The version at `location` against its parent version (a sibling under the same
    root), category shares counted on held-out rows."""
    after, _ = read_manifest(location)
    before_location = manifest_uri(location.rsplit("/", 2)[0], parent)
    before, _ = read_manifest(before_location)
    old, new = category_counts(before, before_location), category_counts(after, location)
    return drift_report(before, after, {name: (old.get(name, {}), new[name]) for name in new})


def champion_on_same_rows(
    tracking_uri: str,
    name: str,
    location: str,
    cluster_map: Callable[[], AbstractContextManager[Mapper]],
    scoring_run: TrackingConfig | None = None,
) -> SameRows | None:
    """The current champion's macro-F1 on the version's held-out rows (None: no champion),
    its figures logged to a run of `scoring_run` when given."""
    current = champion(tracking_uri, name)
    if current is None:
        return None
    manifest, _ = read_manifest(location)
    rows = dict(
        champion_version=current["version"],
        dataset_version=manifest.version_id,
        split=SPLIT,
        num_rows=manifest.split(SPLIT).num_rows,
    )
    try:
        scores = evaluate(
            f"models:/{name}/{current['version']}", tracking_uri, location, SPLIT, cluster_map
        )
    except UNREADABLE as error:
        return SameRows(
            **rows, champion_score=None, problem=f"{type(error).__name__}: {error}"[:1000]
        )
    if scoring_run is not None:
        tags = {
            "ballast.role": "champion-scoring",
            "ballast.champion_version": str(rows["champion_version"]),
            "ballast.dataset_version": manifest.version_id,
        }
        log_scoring_run(
            scoring_run,
            f"{scoring_run.run_name or name}-champion-v{current['version']}",
            scores,
            tags,
        )
    return SameRows(**rows, champion_score=scores["macro_f1"])
