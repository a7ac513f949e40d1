"""The pipeline's promotion step: drift against the parent, the champion on the same rows,
then the registration that decides (tracking/promotion.py) and what a person reads of it.

1. Drift: a version with a parent (its `parent_version`, or the version `_CURRENT` named
   before this run made a flat one) gets a report against it (tracking/drift.py), published
   as the Prefect markdown artifact `drift` and as `drift.*` metrics on the run.
2. Same rows: the current champion (pinned by version number, not by alias) is scored on
   the new version's held-out rows by the evaluation path of `ballast evaluate` (one
   task per shard on Dask, through the codec logged with the champion). A champion whose
   codec refuses the rows (a missing column, another type, a class it does not know) is
   reported as unable to read them, which holds the challenger back unless `force`.
3. Register: tracking/registry.py registers the version, and the decision of
   tracking/promotion.py sets its alias; both scores, the rows and the reasons go to the
   run log, the run's metrics and tags, and the training summary.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.tasks import IN_PROCESS_EVALUATION_ROWS, TRANSIENT_RETRIES
from preprocessing.contract.codec import FeatureCodec, FeatureError
from preprocessing.contract.manifest import Manifest, manifest_uri, read_manifest, shard_uri
from preprocessing.driver.cluster import Executor, dask_client
from tracking.config import TrackingConfig
from tracking.drift import DriftReport, ShareChange, drift_report
from tracking.inference import ModelError, evaluate_model
from tracking.promotion import (
    Promotion,
    PromotionConfig,
    SameRows,
    drift_breaches,
    log_promotion,
)
from tracking.registry import register_and_promote
from tracking.run import champion

SPLIT = "holdout"
# A champion's codec that refuses the rows raises one of these: the rows are unreadable
# to it, which no retry changes (an interrupted read raises ArrowInvalid or OSError instead).
UNREADABLE = (FeatureError, ModelError, pa.ArrowTypeError, pa.ArrowNotImplementedError)


def parent_of(manifest: Manifest, current_before: str | None) -> str | None:
    """The version to compare with: the chain's parent, else what `_CURRENT` named before
    the run (None for the first version, or when the run made no new one)."""
    if manifest.parent_version is not None:
        return manifest.parent_version
    return current_before if current_before != manifest.version_id else None


def category_counts(manifest: Manifest, location: str) -> dict[str, dict[str, int]]:
    """Value counts of each category column over the version's held-out rows."""
    names = [spec.name for spec in FeatureCodec.from_manifest(manifest).columns
             if spec.kind == "category"]
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


@task(cache_policy=NO_CACHE, task_run_name="drift[{arm}]", **TRANSIENT_RETRIES)
def drift(location: str, parent: str, arm: str) -> DriftReport:
    """The new version against its parent, category shares counted on held-out rows."""
    after, _ = read_manifest(location)
    before_location = manifest_uri(location.rsplit("/", 2)[0], parent)
    before, _ = read_manifest(before_location)
    old, new = category_counts(before, before_location), category_counts(after, location)
    return drift_report(before, after, {name: (old.get(name, {}), new[name]) for name in new})


@task(cache_policy=NO_CACHE, task_run_name="score-champion[{arm}]", **TRANSIENT_RETRIES)
def score_champion(tracking: TrackingConfig, name: str, location: str, dask: Executor,
                   arm: str) -> SameRows | None:
    """The current champion's macro-F1 on the version's held-out rows (None: no champion)."""
    current = champion(tracking.tracking_uri, name)
    if current is None:
        return None
    manifest, _ = read_manifest(location)
    rows = dict(champion_version=current["version"], dataset_version=manifest.version_id,
                split=SPLIT, num_rows=manifest.split(SPLIT).num_rows)
    try:
        scores = _evaluate(f"models:/{name}/{current['version']}", tracking, location, dask)
    except UNREADABLE as error:
        return SameRows(**rows, champion_score=None,
                        problem=f"{type(error).__name__}: {error}"[:1000])
    return SameRows(**rows, champion_score=scores["macro_f1"])


def _evaluate(model_uri: str, tracking: TrackingConfig, location: str,
              dask: Executor) -> dict[str, Any]:
    """The same path as the evaluate task (flows/tasks.py): a small split in this process,
    a large one one task per shard on Dask."""
    if read_manifest(location)[0].split(SPLIT).num_rows <= IN_PROCESS_EVALUATION_ROWS:
        return evaluate_model(model_uri, tracking.tracking_uri, location, SPLIT)
    with dask_client(dask, storage=[location]) as client:
        def dask_map(function: Any, uris: list[str]) -> list[Any]:
            return list(client.gather(client.map(function, uris, pure=False)))

        return evaluate_model(model_uri, tracking.tracking_uri, location, SPLIT, dask_map)


@task(cache_policy=NO_CACHE, task_run_name="register[{arm}]", **TRANSIENT_RETRIES)
def register(tracking: TrackingConfig, name: str, model_uri: str, evaluation: dict[str, Any],
             promotion: Promotion, arm: str, description: str = "") -> dict[str, Any]:
    """Register the model (with `description`); tracking/promotion.py decides its alias on
    the same rows."""
    return register_and_promote(tracking, model_uri, name, evaluation["macro_f1"],
                                evaluation["beats_class_prior"], promotion, description)


@task(cache_policy=NO_CACHE, task_run_name="record-promotion[{arm}]", **TRANSIENT_RETRIES)
def record(tracking: TrackingConfig, run_id: str, registration: dict[str, Any],
           report: DriftReport | None, markdown: str | None, arm: str) -> None:
    """Scores, rows, reasons and drift metrics on the new model's MLflow run."""
    log_promotion(tracking, run_id, registration,
                  report.metrics() if report else {}, markdown)


def promote(tracking: TrackingConfig, config: PromotionConfig, dask: Executor,
            result: Mapping[str, Any], current_before: str | None, arm: str,
            description: str = "") -> dict[str, Any]:
    """Drift, champion on the same rows, registration (with `description`) of the model of
    the pipeline's `result` so far: the registration's summary."""
    name = str(tracking.registered_model_name)
    location = str(result["manifest_uri"])
    run_id, evaluation = str(result["run_id"]), result["evaluations"][arm]
    manifest, _ = read_manifest(location)
    parent = parent_of(manifest, current_before)
    report = drift(location, parent, arm) if parent else None
    breaches = drift_breaches(report, config) if report else []
    markdown = drift_markdown(report, breaches) if report else None
    if report is not None and markdown is not None:
        create_markdown_artifact(markdown, key="drift", description=f"dataset version "
                                 f"{report.version} against its parent {report.parent}")
    same_rows = score_champion(tracking, name, location, dask, arm)
    registration = register(tracking, name, result["training"]["model_uri"], evaluation,
                            Promotion(same_rows, breaches, config.force), arm, description)
    record(tracking, run_id, registration, report, markdown, arm)
    log_drift_line(arm, report)
    return {**registration, "drift": drift_summary(report, breaches) if report else None}


def drift_summary(report: DriftReport, breaches: list[str]) -> dict[str, Any]:
    return {"parent": report.parent, "class_psi": report.class_psi,
            "source_psi": report.source_psi, "rows": report.rows, "breaches": breaches}


def _share_rows(title: str, changes: list[ShareChange]) -> list[str]:
    lines = [f"| {title} | share before | share after | PSI term |", "|---|---|---|---|"]
    return lines + [f"| {c.name} | {c.before:.2%} | {c.after:.2%} | {c.term:.4f} |"
                    for c in changes]


def drift_markdown(report: DriftReport, breaches: list[str]) -> str:
    """The report as Markdown: thresholds passed, classes, sources, features, rows."""
    rows = report.rows
    lines = [f"# Drift: version {report.version} against {report.parent}", "",
             *([f"- **held back**: {b}" for b in breaches] or ["- no threshold passed"]),
             f"- class mix PSI {report.class_psi:.4f}, source mix PSI "
             f"{report.source_psi:.4f}",
             f"- input rows {rows['before']} -> {rows['after']} (added {rows['added']}, "
             f"removed {rows['removed']}); dropped for nulls {rows['dropped_before']} -> "
             f"{rows['dropped_after']}; rejected files {rows['rejected_files_before']} -> "
             f"{rows['rejected_files_after']}",
             *[f"- newly rejected: {path}" for path in report.new_rejected_files[:5]], "",
             *_share_rows("class", report.classes), "", *_share_rows("source", report.sources),
             "", "| feature | kind | PSI | null rate before | after | note |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {f.name} | {f.kind} | {'n/a' if f.psi is None else f'{f.psi:.4f}'} | "
              f"{f.null_rate_before:.2%} | {f.null_rate_after:.2%} | {f.note} |"
              for f in report.features]
    return "\n".join(lines)


def promotion_lines(registration: Mapping[str, Any] | None) -> list[str]:
    """For the summaries: both scores, the rows they were computed on, the reasons."""
    if not registration or "reasons" not in registration:
        return []
    lines = []
    same = registration.get("same_rows")
    if same is not None:
        champion_score = same["champion_score"]
        lines.append(f"  same rows ({SameRows(**same).describe()}): challenger macro-F1 "
                     f"{registration['score']:.4f}, champion v{same['champion_version']} "
                     f"{'cannot read them' if champion_score is None else f'{champion_score:.4f}'}")
    lines += [f"  because: {reason}" for reason in registration["reasons"]]
    return lines


def log_drift_line(arm: str, report: DriftReport | None) -> None:
    """The drift against the parent version; the registration's own line (its alias, the
    same rows, the reasons) is flows/runlog.py's `log_registration`."""
    if report is not None:
        get_run_logger().info("drift[%s]: version %s against %s: class mix PSI %.4f, source "
                              "mix PSI %.4f, rows %s", arm, report.version, report.parent,
                              report.class_psi, report.source_psi, report.rows)
