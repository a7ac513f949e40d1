"""The pipeline's promotion step, composed: drift against the parent and the champion on
the same rows (tracking/lifecycle/challenge.py), then the registration that decides
(tracking/lifecycle/registry.py by tracking/lifecycle/promotion.py's rule), both under the
model name's lease on the output root (concurrent nights decide in turn), and what a
person reads of it: the Prefect markdown artifact `drift`, the run log, the run's
metrics and tags, the training summary.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from prefect.runtime import flow_run

from flows.results import Challenger, DriftSummary, Evaluation, Registration
from flows.tasks import TRANSIENT_RETRIES, dask_map
from preprocessing.contract.manifest import read_manifest
from preprocessing.driver.cluster import Executor
from preprocessing.versions.lease import LeaseBusy, NamedLease
from tracking.config import TrackingConfig
from tracking.lifecycle.challenge import champion_on_same_rows, drift_against, parent_of
from tracking.lifecycle.drift import DriftReport, ShareChange
from tracking.lifecycle.promotion import (
    Promotion,
    PromotionConfig,
    SameRows,
    drift_breaches,
    log_promotion,
)
from tracking.lifecycle.registry import register_and_promote


@task(cache_policy=NO_CACHE, task_run_name="drift[{arm}]", **TRANSIENT_RETRIES)
def drift(location: str, parent: str, arm: str) -> DriftReport:
    """The new version against its parent, category shares counted on held-out rows."""
    return drift_against(location, parent)


@task(cache_policy=NO_CACHE, task_run_name="score-champion[{arm}]", **TRANSIENT_RETRIES)
def score_champion(
    tracking: TrackingConfig, name: str, location: str, dask: Executor, arm: str
) -> SameRows | None:
    """The current champion's macro-F1 on the version's held-out rows (None: no champion);
    in a pipeline run, its figures on a run of their own, a child of the night's run."""
    scoring_run = None
    if tracking.parent_run_id is not None:
        scoring_run = tracking.model_copy(update={"run_name": flow_run.get_name()})
    return champion_on_same_rows(
        tracking.tracking_uri, name, location, partial(dask_map, dask, [location]), scoring_run
    )


@task(cache_policy=NO_CACHE, task_run_name="register[{arm}]", **TRANSIENT_RETRIES)
def register(
    tracking: TrackingConfig,
    name: str,
    model_uri: str,
    evaluation: Evaluation,
    promotion: Promotion,
    arm: str,
    description: str = "",
) -> Registration:
    """Register the model (with `description`); tracking/lifecycle/promotion.py decides its
    alias on the same rows."""
    registration = register_and_promote(
        tracking,
        model_uri,
        name,
        evaluation.macro_f1,
        evaluation.beats_class_prior,
        promotion,
        description,
    )
    return Registration.model_validate(registration)


@task(cache_policy=NO_CACHE, task_run_name="record-promotion[{arm}]", **TRANSIENT_RETRIES)
def record(
    tracking: TrackingConfig,
    run_id: str,
    registration: Registration,
    report: DriftReport | None,
    markdown: str | None,
    arm: str,
) -> None:
    """Scores, rows, reasons and drift metrics on the new model's MLflow run."""
    metrics = report.metrics() if report else {}
    log_promotion(tracking, run_id, registration.model_dump(), metrics, markdown)


def promote(
    tracking: TrackingConfig,
    config: PromotionConfig,
    dask: Executor,
    challenger: Challenger,
    current_before: str | None,
    arm: str,
    description: str = "",
) -> Registration:
    """Drift, champion on the same rows, registration (with `description`) of the
    `challenger`: the registration, with the drift."""
    name = str(tracking.registered_model_name)
    location = challenger.manifest_uri
    manifest, _ = read_manifest(location)
    parent = parent_of(manifest, current_before)
    report = drift(location, parent, arm) if parent else None
    breaches = drift_breaches(report, config) if report else []
    markdown = drift_markdown(report, breaches) if report else None
    if report is not None and markdown is not None:
        create_markdown_artifact(
            markdown,
            key="drift",
            description=f"dataset version {report.version} against its parent {report.parent}",
        )
    with decision_lease(location, name, arm):
        same_rows = score_champion(tracking, name, location, dask, arm)
        registration = register(
            tracking,
            name,
            challenger.model_uri,
            challenger.evaluation,
            Promotion(same_rows, breaches, config.force),
            arm,
            description,
        )
    record(tracking, challenger.run_id, registration, report, markdown, arm)
    log_drift_line(arm, report)
    drift_seen = drift_summary(report, breaches) if report else None
    return registration.model_copy(update={"drift": drift_seen})


@contextmanager
def decision_lease(manifest_uri: str, name: str, arm: str) -> Iterator[NamedLease]:
    """Hold the lease of model `name` on the version's output root while the champion is
    scored and the alias decided, so concurrent nights decide one after the other, each
    against the champion the last one left (preprocessing/versions/lease.py)."""
    root = manifest_uri.rsplit("/", 2)[0]  # <root>/v-<id>/_MANIFEST.json
    with NamedLease(root, f"model:{name}") as lease:
        if lease.waited_s > 1:
            get_run_logger().info(
                "promotion[%s]: waited %.0f s for another run's decision on %s",
                arm,
                lease.waited_s,
                name,
            )
        yield lease
        if not lease.held():
            raise LeaseBusy(f"model:{name}: this run's lease expired while it decided")


def drift_summary(report: DriftReport, breaches: list[str]) -> DriftSummary:
    return DriftSummary(
        parent=report.parent,
        class_psi=report.class_psi,
        source_psi=report.source_psi,
        rows=report.rows,
        breaches=breaches,
    )


def _share_rows(title: str, changes: list[ShareChange]) -> list[str]:
    lines = [f"| {title} | share before | share after | PSI term |", "|---|---|---|---|"]
    return lines + [
        f"| {c.name} | {c.before:.2%} | {c.after:.2%} | {c.term:.4f} |" for c in changes
    ]


def drift_markdown(report: DriftReport, breaches: list[str]) -> str:
    """The report as Markdown: thresholds passed, classes, sources, features, rows."""
    rows = report.rows
    lines = [
        f"# Drift: version {report.version} against {report.parent}",
        "",
        *([f"- **held back**: {b}" for b in breaches] or ["- no threshold passed"]),
        f"- class mix PSI {report.class_psi:.4f}, source mix PSI {report.source_psi:.4f}",
        f"- input rows {rows['before']} -> {rows['after']} (added {rows['added']}, "
        f"removed {rows['removed']}); dropped for nulls {rows['dropped_before']} -> "
        f"{rows['dropped_after']}; rejected files {rows['rejected_files_before']} -> "
        f"{rows['rejected_files_after']}",
        *[f"- newly rejected: {path}" for path in report.new_rejected_files[:5]],
        "",
        *_share_rows("class", report.classes),
        "",
        *_share_rows("source", report.sources),
        "",
        "| feature | kind | PSI | null rate before | after | note |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {f.name} | {f.kind} | {'n/a' if f.psi is None else f'{f.psi:.4f}'} | "
        f"{f.null_rate_before:.2%} | {f.null_rate_after:.2%} | {f.note} |"
        for f in report.features
    ]
    return "\n".join(lines)


def promotion_lines(registration: Registration | None) -> list[str]:
    """For the summaries: both scores, the rows they were computed on, the reasons."""
    if registration is None or registration.reasons is None:
        return []
    lines = []
    same = registration.same_rows
    if same is not None:
        champion_score = same.champion_score
        lines.append(
            f"  same rows ({same.describe()}): challenger macro-F1 "
            f"{registration.score:.4f}, champion v{same.champion_version} "
            f"{'cannot read them' if champion_score is None else f'{champion_score:.4f}'}"
        )
    lines += [f"  because: {reason}" for reason in registration.reasons]
    return lines


def log_drift_line(arm: str, report: DriftReport | None) -> None:
    """The drift against the parent version; the registration's own line (its alias, the
    same rows, the reasons) is flows/runlog.py's `log_registration`."""
    if report is not None:
        get_run_logger().info(
            "drift[%s]: version %s against %s: class mix PSI %.4f, source mix PSI %.4f, rows %s",
            arm,
            report.version,
            report.parent,
            report.class_psi,
            report.source_psi,
            report.rows,
        )
