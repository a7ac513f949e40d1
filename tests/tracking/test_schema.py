"""A dataset version's columns as MLflow's UI reads them, and an arm's held-out metrics."""

from __future__ import annotations

import json

import pytest
from mlflow.types.schema import Schema

from tracking.lifecycle.holdout import holdout_metrics
from tracking.run.origin import git_sha
from tracking.run.schema import mlflow_schema_json


def test_the_schema_is_mlflow_colspec_json_with_every_column_typed() -> None:
    """Invariant: the schema logged with a dataset input is `{"mlflow_colspec": ...}`
    (MLflow's own format, which its UI renders as columns), loads back as an MLflow
    `Schema` with every column in order, and types ints, floats, strings, timestamps,
    dictionaries and fixed-size lists by their values."""
    fields = [
        {"name": "id", "type": "int64"},
        {"name": "Body Mass (g)", "type": "double"},
        {"name": "source", "type": "string"},
        {"name": "n", "type": "int32"},
        {"name": "seen", "type": "timestamp[us]"},
        {"name": "city", "type": "dictionary<values=string, indices=int32, ordered=0>"},
        {"name": "features", "type": "fixed_size_list<item: float>[16]"},
    ]
    loaded = json.loads(mlflow_schema_json(fields))
    schema = Schema.from_json(json.dumps(loaded["mlflow_colspec"]))
    assert schema.input_names() == [field["name"] for field in fields]
    types = [column["type"] for column in loaded["mlflow_colspec"]]
    assert types == ["long", "double", "string", "integer", "datetime", "string", "array"]
    assert loaded["mlflow_colspec"][-1]["items"] == {"type": "float"}


def test_holdout_metrics_hold_the_figures_and_the_class_prior_baseline() -> None:
    """Invariant: an arm's run gets its held-out macro-F1, balanced accuracy, worst-class
    recall and each class's recall (classes without support skipped), and the baseline's
    figures on the same rows."""
    evaluation = {
        "num_rows": 10,
        "macro_f1": 0.8,
        "balanced_accuracy": 0.75,
        "recall": {"a": 0.9, "b": 0.6, "c": None},
        "class_prior_baseline": {"macro_f1": 0.3, "balanced_accuracy": 0.5},
    }
    assert holdout_metrics(evaluation) == {
        "holdout_macro_f1": 0.8,
        "holdout_balanced_accuracy": 0.75,
        "holdout_worst_class_recall": 0.6,
        "holdout_class_prior_macro_f1": 0.3,
        "holdout_class_prior_balanced_accuracy": 0.5,
        "holdout_rows": 10.0,
        "holdout_recall/a": 0.9,
        "holdout_recall/b": 0.6,
    }


@pytest.mark.slow  # asks git
def test_git_sha_names_the_code_never_unknown(tmp_path, monkeypatch) -> None:
    """Invariant: the code version tag is asked of the code's checkout, whatever the
    working directory: a 40-hex commit here, never `unknown`."""
    monkeypatch.chdir(tmp_path)  # not a checkout
    sha = git_sha()
    assert len(sha) == 40 and all(c in "0123456789abcdef" for c in sha)
