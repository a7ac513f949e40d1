"""Registering a logged model and moving the `champion` alias.

The model was logged into its job's run by tracking/run/model.py (a pyfunc
`CodecClassifier`, or saved in the run's spool while the server was away: delivered here
first). A new version's alias is decided by the one rule, tracking/lifecycle/promotion.py's
`decide`: the pipeline passes a `Promotion` (the champion scored on the same held-out rows,
the drift against the parent version); a caller without one compares with the score the
champion was registered with (tracking.lifecycle.champion.SCORE_TAG). Below the class-prior
baseline a version gets no alias.

Registration is idempotent: a retry (after a reply lost on the way) finds the version its
run registered and reuses it, so one run never has two versions of a model.

A new version carries the checksums recorded when the model was logged (the sha256 of
its weights and one over all its files, tracking.run.model.WEIGHTS_TAG and FILES_TAG,
tags of the logged model): what tracking/lifecycle/trust.py checks before ballast loads
the version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
from mlflow.entities.model_registry import ModelVersion
from mlflow.tracking import MlflowClient

from tracking.config import TrackingConfig
from tracking.lifecycle.champion import SCORE_TAG, champion
from tracking.lifecycle.promotion import Promotion, SameRows, apply_decision, decide
from tracking.run.model import FILES_TAG, WEIGHTS_TAG
from tracking.run.runs import deliver
from tracking.run.spool import Spool
from tracking.server import TrackingUnavailable

BASELINE_TAG = "ballast.beats_class_prior"
PREVIOUS_SCORE_TAG = "ballast.previous_champion_heldout_macro_f1"


def sent_model_uri(config: TrackingConfig, model_uri: str) -> str:
    """`model_uri`, or for a model kept in a spool, the URI it has on the server once the
    spool is delivered (delivering it now if it was not)."""
    path = Path(model_uri)
    if not (path.is_absolute() and (path.parent / "run.json").exists()):
        return model_uri
    spool = Spool(path.parent)
    if spool.progress().get("model_uri") is None:
        deliver(spool, config)
    sent = spool.progress().get("model_uri")
    if sent is None:
        raise TrackingUnavailable(
            f"the model at {model_uri} is not on {spool.run['tracking_uri']} "
            f"yet; once the server is back, `{spool.upload_command()}` sends "
            "it, then register it again"
        )
    return str(sent)


def register_and_promote(
    config: TrackingConfig,
    model_uri: str,
    name: str,
    score: float,
    beats_baseline: bool = True,
    promotion: Promotion | None = None,
    description: str = "",
) -> dict[str, Any]:
    """Register `model_uri` as a version of `name` (the version its run registered
    already, on a retry), with `description` (what the registry's UI shows on the version);
    alias it champion if it wins. A model that does not beat the class-prior baseline gets
    no alias at all. With `promotion` (the champion scored on the same rows, the drift),
    it is decided on those; without, on the scores the versions were registered with."""
    model_uri = sent_model_uri(config, model_uri)
    client = MlflowClient(config.tracking_uri)
    run_id = source_run_id(client, model_uri)
    current = champion(config.tracking_uri, name)
    version = registered_version(client, name, run_id) or _register(
        config, model_uri, name, score, beats_baseline, current
    )
    if description:
        client.update_model_version(name, version.version, description=description)
    ours = current is not None and current["version"] == int(version.version)
    if promotion is not None:
        return apply_decision(
            client,
            name,
            version.version,
            score,
            beats_baseline,
            _champion_before(promotion) if ours else current,
            promotion,
        )
    previous = _previous_score(version) if ours else (current["score"] if current else None)
    alias = _by_stored_scores(score, beats_baseline, None if ours else current, previous)
    if alias is not None:
        client.set_registered_model_alias(name, alias, version.version)
    return {
        "name": name,
        "version": int(version.version),
        "alias": alias,
        "score": score,
        "beats_class_prior": beats_baseline,
        "previous_champion_score": previous,
    }


def _by_stored_scores(
    score: float, beats_baseline: bool, current: dict[str, Any] | None, previous: float | None
) -> str | None:
    """The alias by the one rule (`decide`), the champion's registered score standing in
    for its score on the same rows (`current` None: no champion, or a retry that finds its
    own version champion already)."""
    if current is None:
        return decide(score, beats_baseline, None, None, [], force=False).alias
    stored = SameRows(current["version"], "the champion's own", "holdout", 0, previous)
    return decide(score, beats_baseline, current["version"], stored, [], force=False).alias


def source_run_id(client: MlflowClient, model_uri: str) -> str | None:
    """The run a logged model came from: `runs:/<run>/...`, or a `models:/m-...` logged
    model's source run; None for any other URI."""
    if model_uri.startswith("runs:/"):
        return model_uri.removeprefix("runs:/").split("/", 1)[0]
    model_id = model_uri.removeprefix("models:/")
    if model_uri.startswith("models:/m-") and "/" not in model_id:
        return client.get_logged_model(model_id).source_run_id
    return None


def registered_version(client: MlflowClient, name: str, run_id: str | None) -> ModelVersion | None:
    """The version of `name` that run `run_id` registered already, if any (the oldest)."""
    if run_id is None:
        return None
    versions = client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'")
    return min(versions, key=lambda v: int(v.version), default=None)


def _register(
    config: TrackingConfig,
    model_uri: str,
    name: str,
    score: float,
    beats_baseline: bool,
    current: dict[str, Any] | None,
) -> ModelVersion:
    """A new version, tagged with its score and the champion's score it was compared with
    (what a retry reports when this version has become the champion meanwhile)."""
    mlflow.set_tracking_uri(config.tracking_uri)
    previous = current["score"] if current else None
    tags = {
        SCORE_TAG: str(score),
        BASELINE_TAG: str(beats_baseline).lower(),
        PREVIOUS_SCORE_TAG: "none" if previous is None else str(previous),
    }
    # A model logged by ballast has both; any other is refused when ballast loads it.
    tags.update(recorded_checksums(MlflowClient(config.tracking_uri), model_uri))
    return mlflow.register_model(model_uri, name, tags=tags)


def recorded_checksums(client: MlflowClient, model_uri: str) -> dict[str, str]:
    """The checksum tags recorded when ballast logged the model `models:/m-...`; none for
    any other URI or a model logged without them."""
    model_id = model_uri.removeprefix("models:/")
    if not model_uri.startswith("models:/m-") or "/" in model_id:
        return {}
    tags = client.get_logged_model(model_id).tags
    return {tag: tags[tag] for tag in (WEIGHTS_TAG, FILES_TAG) if tag in tags}


def _champion_before(promotion: Promotion) -> dict[str, Any] | None:
    """On a retry that finds its own version champion already: the champion it was
    compared with (scored on the same rows before the first try), not itself."""
    same = promotion.same_rows
    return {"version": same.champion_version} if same is not None else None


def _previous_score(version: ModelVersion) -> float | None:
    text = version.tags.get(PREVIOUS_SCORE_TAG, "none")
    return None if text == "none" else float(text)
