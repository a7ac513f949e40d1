"""The class-prior baseline of an evaluation, and a model below it never made champion."""

from __future__ import annotations

import numpy as np
import pytest

from tracking.lifecycle.metrics import class_prior_baseline
from tracking.lifecycle.scoring import evaluation


def test_the_baseline_is_the_better_of_majority_and_frequency_guessing() -> None:
    """Invariant: at 90:10, always guessing the majority class gives macro-F1 0.474 and
    guessing by the frequencies 0.5 (each class's F1 is its frequency); the baseline takes
    the better, and balanced accuracy 1/2 either way."""
    baseline = class_prior_baseline(np.array([90, 10]))
    assert baseline == pytest.approx({"macro_f1": 0.5, "balanced_accuracy": 0.5})


def test_a_model_that_always_answers_the_majority_class_does_not_beat_the_baseline() -> None:
    """Invariant: a confusion matrix of always the majority class (98% accuracy) is
    reported as not beating the class prior; a model right on most rows of both is."""
    majority = np.array([[98, 0], [2, 0]])
    assert not evaluation(majority, ["a", "b"])["beats_class_prior"]
    good = np.array([[95, 3], [0, 2]])
    assert evaluation(good, ["a", "b"])["beats_class_prior"]


@pytest.mark.slow
def test_a_model_below_the_baseline_is_registered_without_an_alias(tmp_path) -> None:
    """Invariant: register_and_promote with beats_baseline=False gives the version no alias
    (it never becomes champion) and records why in a tag; the next one that beats it does."""
    from mlflow.tracking import MlflowClient

    from tests.tracking.logged_models import log_models
    from tracking.config import TrackingConfig
    from tracking.lifecycle.registry import BASELINE_TAG, register_and_promote

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    models = log_models(uri, 2)
    config = TrackingConfig(tracking_uri=uri)
    below = register_and_promote(config, models[0], "m", 0.9, beats_baseline=False)
    assert below["alias"] is None
    version = MlflowClient(uri).get_model_version("m", str(below["version"]))
    assert version.tags[BASELINE_TAG] == "false" and not version.aliases
    above = register_and_promote(config, models[1], "m", 0.5, beats_baseline=True)
    assert above["alias"] == "champion"
