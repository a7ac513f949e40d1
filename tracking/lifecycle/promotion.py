"""Whether a newly registered model version becomes `champion`: decided on the same rows.

A night's model (the challenger) and the current champion are both scored on the new
dataset version's held-out rows (the champion through its own logged codec, by
tracking/lifecycle/scoring.py on Dask, in flows/promotion.py), so an easier night cannot promote a
worse model. `decide` is the rule, a pure function:

- below the class-prior baseline: no alias (as before);
- the champion could not read the new rows (a schema change its codec refuses): `challenger`,
  unless `force`;
- the drift report against the parent version (tracking/lifecycle/drift.py) passes a threshold of
  `PromotionConfig`: `challenger`, unless `force`;
- otherwise `champion` when there is none, or when the challenger's macro-F1 on these rows
  beats the champion's on the same rows; else `challenger`.

`apply_decision` (called by tracking/lifecycle/registry.py's `register_and_promote`) moves the
alias and records on the new version the rows both were scored on, both scores, the
reasons and, when it becomes champion, the version it replaced (`PREVIOUS_CHAMPION_TAG`,
which `ballast rollback --model` moves the alias back to: tracking/lifecycle/rollback.py).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

from mlflow.tracking import MlflowClient
from pydantic import BaseModel, ConfigDict, Field

from tracking.config import TrackingConfig
from tracking.lifecycle.drift import DriftReport
from tracking.run.spool import Spool, is_local_run

PREVIOUS_CHAMPION_TAG = "ballast.previous_champion"
DECISION_TAG = "ballast.promotion"
SAME_ROWS_TAG = "ballast.promotion.rows"
CHAMPION_SCORE_TAG = "ballast.promotion.champion_macro_f1"


class PromotionConfig(BaseModel):
    """When a night's model may become `champion` (None: that check is off)."""

    model_config = ConfigDict(extra="forbid")

    force: bool = Field(
        False,
        description="Promote even when the champion cannot read the "
        "new rows or the data drifted past a threshold (never below the "
        "class-prior baseline, never when the champion scores better).",
    )
    max_class_psi: float | None = Field(
        0.25,
        ge=0,
        description="Largest PSI of the input rows' class shares against the parent version.",
    )
    max_source_psi: float | None = Field(
        0.25, ge=0, description="Largest PSI of the source shares against the parent version."
    )
    max_feature_psi: float | None = Field(
        0.25, ge=0, description="Largest PSI of any one feature column against the parent version."
    )
    max_null_rate_change: float | None = Field(
        0.1, ge=0, le=1, description="Largest change of any feature column's null rate."
    )


@dataclass(frozen=True)
class SameRows:
    """The champion scored on the challenger's held-out rows; `problem`: why it could not."""

    champion_version: int
    dataset_version: str
    split: str
    num_rows: int
    champion_score: float | None
    problem: str | None = None

    def describe(self) -> str:
        return f"version {self.dataset_version}, split {self.split}, {self.num_rows} rows"


@dataclass(frozen=True)
class Decision:
    """The alias a new version gets and every reason that decided it."""

    alias: str | None
    reasons: list[str] = field(default_factory=list)
    held_back: bool = False  # a drift or unreadable-champion hold decided it


def drift_breaches(report: DriftReport, config: PromotionConfig) -> list[str]:
    """Each threshold the report passes, as a sentence naming what moved."""
    found = []
    checks = [
        ("class mix", report.class_psi, config.max_class_psi, report.classes),
        ("source mix", report.source_psi, config.max_source_psi, report.sources),
    ]
    for what, value, limit, changes in checks:
        if limit is not None and value > limit:
            top = sorted(changes, key=lambda change: -change.term)[:3]
            moved = ", ".join(f"{c.name!r} {c.before:.1%} -> {c.after:.1%}" for c in top)
            found.append(
                f"{what} PSI {value:.3f} > {limit} against version "
                f"{report.parent} (most moved: {moved})"
            )
    for column in report.features:
        if config.max_feature_psi is not None and (column.psi or 0.0) > config.max_feature_psi:
            found.append(f"feature {column.name!r} PSI {column.psi:.3f} > {config.max_feature_psi}")
        limit = config.max_null_rate_change
        if limit is not None and abs(column.null_rate_change) > limit:
            found.append(
                f"feature {column.name!r} null rate {column.null_rate_before:.1%} -> "
                f"{column.null_rate_after:.1%} (change > {limit:.0%})"
            )
    return found


def decide(
    score: float,
    beats_baseline: bool,
    champion_version: int | None,
    same_rows: SameRows | None,
    breaches: list[str],
    force: bool,
) -> Decision:
    """The alias of a new version of macro-F1 `score` (see the module docstring)."""
    if not beats_baseline:
        return Decision(None, ["below the class-prior baseline on held-out rows"])
    holds = [f"drift: {breach}" for breach in breaches]
    if champion_version is not None:
        if same_rows is None or same_rows.champion_version != champion_version:
            holds.append(f"champion v{champion_version} was not scored on these rows")
        elif same_rows.problem is not None:
            holds.append(
                f"champion v{champion_version} cannot read the new rows: {same_rows.problem}"
            )
    if holds and not force:
        return Decision("challenger", [*holds, "not promoted without force"], held_back=True)
    reasons = [f"forced past: {hold}" for hold in holds]
    if champion_version is None:
        return Decision("champion", [*reasons, "no champion before"])
    other = same_rows.champion_score if same_rows is not None else None
    if other is None or score > other:
        versus = "unscored" if other is None else f"{other:.4f}"
        return Decision(
            "champion",
            [
                *reasons,
                f"macro-F1 {score:.4f} beats champion "
                f"v{champion_version}'s {versus} on the same rows",
            ],
        )
    return Decision(
        "challenger",
        [
            *reasons,
            f"macro-F1 {score:.4f} does not beat champion "
            f"v{champion_version}'s {other:.4f} on the same rows",
        ],
    )


@dataclass(frozen=True)
class Promotion:
    """What `register_and_promote` needs besides the score: the champion on the same
    rows (None: there was no champion to score) and the drift holds."""

    same_rows: SameRows | None
    breaches: list[str]
    force: bool = False


def apply_decision(
    client: MlflowClient,
    name: str,
    version: str,
    score: float,
    beats_baseline: bool,
    current: dict[str, Any] | None,
    promotion: Promotion,
) -> dict[str, Any]:
    """Decide, move the alias, tag the version; the registration's summary."""
    champion_version = current["version"] if current else None
    decision = decide(
        score,
        beats_baseline,
        champion_version,
        promotion.same_rows,
        promotion.breaches,
        promotion.force,
    )
    same = promotion.same_rows
    tags = {DECISION_TAG: "; ".join(decision.reasons)}
    if same is not None:
        tags[SAME_ROWS_TAG] = same.describe()
        tags[CHAMPION_SCORE_TAG] = str(same.champion_score)
    if decision.alias == "champion" and champion_version is not None:
        tags[PREVIOUS_CHAMPION_TAG] = str(champion_version)
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value[:5000])
    if decision.alias is not None:
        client.set_registered_model_alias(name, decision.alias, version)
    return {
        "name": name,
        "version": int(version),
        "alias": decision.alias,
        "score": score,
        "beats_class_prior": beats_baseline,
        "previous_champion": champion_version,
        "previous_champion_score": same.champion_score if same else None,
        "same_rows": asdict(same) if same else None,
        "reasons": decision.reasons,
        "held_back": decision.held_back,
    }


def server_run_id(config: TrackingConfig, run_id: str) -> str | None:
    """The run's id on the server: a `local-...` run's once its spool was delivered (the
    registration delivers it), else None."""
    if not is_local_run(run_id):
        return run_id
    spool = Spool.of_run(config, run_id)
    sent = spool.run.get("run_id") if spool.exists() else None
    return str(sent) if sent else None


def log_promotion(
    config: TrackingConfig,
    run_id: str,
    registration: dict[str, Any],
    metrics: dict[str, float],
    report_markdown: str | None,
) -> None:
    """Both scores, the rows they were computed on, the drift metrics and the report on
    the new model's run (a run not on the server gets them on the registered version's
    tags only, with a warning)."""
    found = server_run_id(config, run_id)
    if found is None:
        warnings.warn(
            f"run {run_id} is not on the tracking server: the promotion's scores "
            "are on the registered model version's tags only",
            RuntimeWarning,
            stacklevel=2,
        )
        return
    run_id, client = found, MlflowClient(config.tracking_uri)
    same = registration.get("same_rows")
    values = {"promotion.challenger_macro_f1": registration["score"], **metrics}
    if same is not None:
        values["promotion.rows"] = float(same["num_rows"])
        if same["champion_score"] is not None:
            values["promotion.champion_macro_f1"] = same["champion_score"]
    for key, value in values.items():
        client.log_metric(run_id, key, float(value))
    client.set_tag(
        run_id,
        DECISION_TAG,
        f"{registration['alias']}: {'; '.join(registration['reasons'])}"[:5000],
    )
    if same is not None:
        client.set_tag(run_id, SAME_ROWS_TAG, SameRows(**same).describe())
    client.log_text(
        run_id, json.dumps(registration, indent=1, default=str), "promotion/decision.json"
    )
    if report_markdown is not None:
        client.log_text(run_id, report_markdown, "promotion/drift.md")
