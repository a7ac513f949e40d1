"""A night's run logs the same metric names every night, under MLflow's key rules: what
MLflow's chart view of an experiment compares with no setup (pure: no store)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow.utils.validation import _validate_metric_name

from preprocessing.contract.names import mlflow_key
from tests.test_names import values
from tracking.lifecycle.night import night_metrics, night_tags

FIXED = {"holdout_macro_f1", "holdout_balanced_accuracy", "holdout_worst_class_recall"}
ARMS = ("rebalanced", "natural-mix")


def evaluation(recall: dict[str, float | None], score: float) -> dict:
    return {
        "num_rows": 100,
        "macro_f1": score,
        "balanced_accuracy": score / 2,
        "recall": recall,
        "class_prior_baseline": {"macro_f1": 0.2, "balanced_accuracy": 0.25},
    }


recalls = st.dictionaries(values, st.one_of(st.none(), st.floats(0, 1)), min_size=1, max_size=8)


@settings(max_examples=150, deadline=None)
@given(recall=recalls, first=st.floats(0, 1), second=st.floats(0, 1))
def test_two_nights_of_the_same_classes_log_the_same_valid_names(recall, first, second) -> None:
    """Invariant: whatever the labels (hostile values), every name MLflow takes, the arm up
    for promotion logs the arms' own names (the fixed three and `holdout_recall/<key>` per
    class with support), each arm its own under `<arm>/`, and two nights of the same
    classes log the same names whatever their figures."""
    nights = [
        night_metrics({arm: evaluation(recall, score) for arm in ARMS}, ARMS[0], None)
        for score in (first, second)
    ]
    assert set(nights[0]) == set(nights[1])
    metrics = nights[0]
    for name in metrics:
        _validate_metric_name(name)
    supported = [label for label, value in recall.items() if value is not None]
    per_class = {mlflow_key(label, "holdout_recall/") for label in supported}
    assert (FIXED if supported else FIXED - {"holdout_worst_class_recall"}) <= set(metrics)
    assert per_class <= set(metrics)
    for label in supported:
        assert metrics[mlflow_key(label, "holdout_recall/")] == recall[label]
        assert metrics[mlflow_key(label, "natural-mix/holdout_recall/")] == recall[label]
    assert metrics["holdout_macro_f1"] == first == metrics["rebalanced/holdout_macro_f1"]


def test_the_promotion_and_drift_are_on_the_night() -> None:
    """Invariant: the night's run holds the decision and its reason as tags, the scores on
    the same rows and the drift as metrics (the names the challenger's run uses)."""
    registration = {
        "name": "clf",
        "version": 3,
        "alias": "challenger",
        "score": 0.7,
        "reasons": ["worse than champion v2 on the same rows"],
        "same_rows": {"champion_score": 0.8},
        "drift": {"class_psi": 0.01, "source_psi": 0.3},
    }
    metrics = night_metrics({"rebalanced": evaluation({"a": 1.0}, 0.7)}, "rebalanced", registration)
    assert metrics["promotion.champion_macro_f1"] == 0.8
    assert metrics["promotion.challenger_macro_f1"] == 0.7
    assert metrics["promotion.promoted"] == 0.0 and metrics["drift.source_psi"] == 0.3
    tags = night_tags("v-1", registration)
    assert tags["ballast.promotion"] == "clf v3: challenger"
    assert tags["ballast.promotion_reason"] == "worse than champion v2 on the same rows"
    assert tags["ballast.dataset_version"] == "v-1"
