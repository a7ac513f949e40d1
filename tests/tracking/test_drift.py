"""The drift math (tracking/lifecycle/drift.py) and the promotion rule
(tracking/lifecycle/promotion.py): pure functions, no services."""

from __future__ import annotations

from dataclasses import replace

import pytest

from preprocessing.contract.manifest import Manifest
from tracking.lifecycle.drift import drift_report, normal_psi, psi, psi_terms
from tracking.lifecycle.promotion import PromotionConfig, SameRows, decide, drift_breaches


def test_psi_of_identical_distributions_is_zero_and_grows_with_the_shift() -> None:
    """Invariants: identical shares (also as different counts of the same shares) give 0;
    moving share from one class to another gives a PSI that grows with how much moved."""
    assert psi({"a": 50, "b": 50}, {"a": 5, "b": 5}) == pytest.approx(0.0)
    shifts = [psi({"a": 50, "b": 50}, {"a": 50 - d, "b": 50 + d}) for d in (5, 15, 30, 45)]
    assert shifts[0] > 0 and shifts == sorted(shifts) and len(set(shifts)) == 4


def test_psi_handles_new_gone_and_empty_categories() -> None:
    """Invariants: a category only on one side costs a finite, large term (its share is
    floored, never log(0)); a side with no rows at all compares as no change (0), not NaN."""
    terms = psi_terms({"a": 10, "b": 10}, {"a": 10, "b": 10, "new": 20})
    assert 0 < terms["new"] < 10 and terms["new"] == max(terms.values())
    gone = psi({"a": 10, "gone": 10}, {"a": 10})
    assert 0.5 < gone < 10
    assert psi({}, {"a": 3}) == 0.0 and psi({"a": 0}, {"a": 0}) == 0.0


def test_normal_psi_is_zero_for_equal_moments_and_grows_with_mean_and_spread() -> None:
    """Invariants: the same (mean, std) gives 0; a larger mean shift or a wider spread
    gives a larger PSI; a constant column equal on both sides gives 0, not NaN."""
    assert normal_psi((1.0, 2.0), (1.0, 2.0)) == pytest.approx(0.0, abs=1e-9)
    by_mean = [normal_psi((0.0, 1.0), (shift, 1.0)) for shift in (0.1, 0.5, 1.0)]
    assert by_mean == sorted(by_mean) and by_mean[0] > 0
    assert normal_psi((0.0, 1.0), (0.0, 2.0)) > normal_psi((0.0, 1.0), (0.0, 1.2)) > 0
    assert normal_psi((3.0, 0.0), (3.0, 0.0)) == pytest.approx(0.0, abs=1e-9)


def _manifest(
    version_id: str, classes: dict[str, int], mean: float = 0.0, nulls: int = 0
) -> Manifest:
    profile = {
        "arrow_type": "double",
        "kind": "numeric",
        "null_rows": nulls,
        "count": sum(classes.values()),
        "mean": mean,
        "m2": float(sum(classes.values())),
        "max_length": 0,
        "size": 0,
        "values": [],
    }
    return Manifest(
        version_id=version_id,
        label_column="label",
        source_column="source",
        id_column="id",
        feature_columns=["x"],
        classes=sorted(classes),
        sources=["s"],
        arrow_schema=[],
        splits={},
        seed=0,
        config={},
        input_fingerprint="f",
        input_class_counts=classes,
        input_source_counts={"s": sum(classes.values())},
        features={
            "columns": [{"name": "x", "kind": "numeric"}],
            "profiles": {"x": profile},
            "dropped_rows": {},
        },
    )


def test_a_shifted_class_mix_passes_the_threshold_naming_the_class() -> None:
    """Invariants: a child whose input rows moved from half 'b' to 5/6 'b' has a class
    PSI above 0.25, the breach names 'b' (the class whose share moved most) and its shares;
    the numeric column's mean shift of one std shows as a feature breach; rows added are
    the difference in input rows; an unchanged child passes nothing."""
    parent = _manifest("v1", {"a": 100, "b": 100})
    child = _manifest("v2", {"a": 100, "b": 500}, mean=1.0)
    report = drift_report(parent, child)
    assert report.class_psi > 0.25 and report.rows["added"] == 400
    breaches = drift_breaches(report, PromotionConfig())
    assert any("class mix" in b and "'b'" in b and "83.3%" in b for b in breaches)
    assert any("feature 'x'" in b for b in breaches)
    same = drift_report(parent, replace(parent, version_id="v3"))
    assert drift_breaches(same, PromotionConfig()) == [] and same.class_psi == 0.0


def test_a_null_rate_change_past_the_threshold_is_a_breach() -> None:
    """Invariant: a column whose null rate goes from 0% to 20% breaches the default 10%."""
    report = drift_report(_manifest("v1", {"a": 100}), _manifest("v2", {"a": 100}, nulls=20))
    assert report.features[0].null_rate_change == pytest.approx(0.2)
    assert any("null rate" in b for b in drift_breaches(report, PromotionConfig()))


def _rows(score: float | None, problem: str | None = None, version: int = 1) -> SameRows:
    return SameRows(version, "v2", "holdout", 100, score, problem)


def test_the_decision_compares_scores_on_the_same_rows() -> None:
    """Invariants: no champion: champion; the challenger must beat the champion's score
    on the same rows (a tie keeps the champion); below the baseline: no alias, even forced."""
    assert decide(0.5, True, None, None, [], False).alias == "champion"
    assert decide(0.91, True, 1, _rows(0.90), [], False).alias == "champion"
    kept = decide(0.91, True, 1, _rows(0.95), [], False)
    assert kept.alias == "challenger" and "0.9500" in kept.reasons[-1]
    assert decide(0.9, True, 1, _rows(0.9), [], False).alias == "challenger"
    assert decide(0.99, False, 1, _rows(0.1), [], True).alias is None


def test_holds_keep_the_challenger_unless_forced() -> None:
    """Invariants: a champion that cannot read the rows, a drift breach, or a champion
    other than the one scored holds the challenger back, each named; `force` promotes past
    the first two but never over a champion that scores better on the same rows."""
    unreadable = decide(0.9, True, 1, _rows(None, "FeatureError: x missing"), [], False)
    assert unreadable.alias == "challenger" and unreadable.held_back
    assert "cannot read the new rows" in unreadable.reasons[0]
    assert decide(0.9, True, 1, _rows(None, "x missing"), [], True).alias == "champion"
    drifted = decide(0.99, True, 1, _rows(0.5), ["class mix PSI 0.5"], False)
    assert drifted.alias == "challenger" and "drift: class mix" in drifted.reasons[0]
    assert decide(0.99, True, 1, _rows(0.5), ["class mix PSI 0.5"], True).alias == "champion"
    assert decide(0.4, True, 1, _rows(0.5), ["class mix PSI 0.5"], True).alias == "challenger"
    moved = decide(0.99, True, 2, _rows(0.5, version=1), [], False)
    assert moved.alias == "challenger" and "v2 was not scored" in moved.reasons[0]


def test_a_category_column_is_compared_by_its_shares_and_names_new_values() -> None:
    """Invariants: a category column with counted shares gets their PSI (0 for the same
    shares, > 0.25 when a new value takes half the rows), and the note names the value new
    to the vocabulary; without counts its PSI is unknown (None), never a made-up 0."""

    def with_vocabulary(version_id: str, vocabulary: list[str]) -> Manifest:
        manifest = _manifest(version_id, {"a": 100})
        column = {"name": "x", "kind": "category", "vocabulary": vocabulary}
        return replace(manifest, features={"columns": [column], "dropped_rows": {}})

    before, after = with_vocabulary("v1", ["p", "q"]), with_vocabulary("v2", ["p", "q", "r"])
    same = drift_report(before, after, {"x": ({"p": 5, "q": 5}, {"p": 50, "q": 50})})
    assert same.features[0].psi == pytest.approx(0.0) and "'r'" in same.features[0].note
    moved = drift_report(before, after, {"x": ({"p": 5, "q": 5}, {"p": 5, "q": 5, "r": 10})})
    assert moved.features[0].psi is not None and moved.features[0].psi > 0.25
    assert drift_report(before, after).features[0].psi is None
