"""The Prefect run log's registration line (flows/runlog.py): one line per arm saying the
version, its alias, its held-out score and why, where two lines used to say half each."""

from __future__ import annotations

from flows.results import Registration
from flows.runlog import registration_line

SAME_ROWS = {
    "champion_version": 1,
    "dataset_version": "v-abc",
    "split": "holdout",
    "num_rows": 120,
    "champion_score": 0.5,
    "problem": None,
}


def test_one_line_holds_the_alias_the_same_rows_and_every_reason() -> None:
    """Invariant: the one line names `<model> v<n> is `<alias>``, the new model's held-out
    macro-F1, the champion's score on the same rows (which rows) and each reason."""
    registration = {
        "name": "m",
        "version": 2,
        "alias": "champion",
        "score": 0.75,
        "beats_class_prior": True,
        "same_rows": SAME_ROWS,
        "reasons": ["drift: x", "beats champion v1"],
    }
    line = registration_line("rebalanced", Registration.model_validate(registration))
    assert "\n" not in line
    assert line.startswith("register[rebalanced]: m v2 is `champion` (held-out macro-F1 0.7500)")
    assert (
        "same rows (version v-abc, split holdout, 120 rows): challenger macro-F1 0.7500, "
        "champion v1 0.5000"
    ) in line
    assert line.endswith("because: drift: x; because: beats champion v1")


def test_a_registration_without_the_promotion_step_says_the_champion_score() -> None:
    """Invariant: without reasons (a registration outside the pipeline's promotion) the line
    says the champion's score, that it was not scored, or that there was none."""
    base = {"name": "m", "version": 3, "alias": "challenger", "score": 0.4}
    base["beats_class_prior"] = True  # a field every registration has
    with_score = Registration.model_validate({**base, "previous_champion_score": 0.6})
    assert registration_line("a", with_score).endswith(
        "(held-out macro-F1 0.4000); champion's held-out macro-F1 was 0.6000"
    )
    not_scored = Registration.model_validate({**base, "previous_champion": 2})
    assert registration_line("a", not_scored).endswith("champion v2 was not scored")
    assert registration_line("a", Registration.model_validate(base)).endswith("no champion before")
