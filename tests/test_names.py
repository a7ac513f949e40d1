"""Any value of the data (a label, a source, a category, a column name) becomes a key or a
name by one rule (preprocessing/contract/names.py): valid where it lands, stable, one to
one even ignoring case, the original recoverable. Pure property tests of each boundary."""

from __future__ import annotations

import json

import numpy as np
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow.utils.validation import _validate_metric_name, _validate_param, _validate_tag_name

from preprocessing.contract.names import (
    MAX_MLFLOW_KEY_CHARS,
    digest,
    mlflow_key,
    mlflow_params,
    yaml_comment,
    yaml_text,
)

HOSTILE = [
    "Adelie Penguin (Pygoscelis adeliae)",
    "a/b",
    "a:b",
    "1.5",
    "50%",
    "3rd",
    "",
    " ",
    ".",
    "..",
    "../up",
    "/root",
    "it's",
    'say "hi"',
    "new\nline",
    "cr\rlf",
    "tab\tx",
    "x" * 300,
    "Mass",
    "mass",
    "MASS",
    "naïve",
    "重量",
    "emoji 🐧",
    "line\u2028sep",
    "kind-h0123456789abcdef",
    "a//b",
    "-",
    "_",
    "trailing.",
]
values = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(max_size=300),
    st.text(alphabet="()/:.% \n\"'0123456789aA", max_size=20),
)
value_sets = st.lists(values, min_size=1, max_size=20, unique=True)
# The prefixes and suffixes ballast puts around values (the metric families).
AROUND = [
    ("", ""),
    ("val_recall/", ""),
    ("drift.feature.", ".psi"),
    ("drift.feature.", ".null_rate_change"),
    ("dataset.nulls.", ""),
]
PLAIN = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.- ", min_size=1, max_size=40
).filter(lambda text: text[0] not in ". ")


@settings(max_examples=300, deadline=None)
@given(value=values, around=st.sampled_from(AROUND))
def test_every_value_becomes_a_key_mlflow_takes_as_metric_param_and_tag(value, around) -> None:
    """Invariant: `mlflow_key` of any value, between any of ballast's prefixes and
    suffixes, passes MLflow's own metric, param and tag key checks, keeps its prefix and
    suffix, and is at most 250 characters."""
    key = mlflow_key(value, *around)
    _validate_metric_name(key)
    _validate_param(key, "x")
    _validate_tag_name(key)
    assert len(key) <= MAX_MLFLOW_KEY_CHARS
    assert key.startswith(around[0]) and key.endswith(around[1])


@settings(max_examples=300, deadline=None)
@given(batch=value_sets, around=st.sampled_from(AROUND))
def test_distinct_values_get_keys_distinct_even_ignoring_case(batch, around) -> None:
    """Invariant: within one family, distinct values (`Mass`, `mass`, `MASS` included)
    map to keys that differ even ignoring case."""
    keys = {mlflow_key(value, *around).casefold() for value in batch}
    assert len(keys) == len(batch)


@settings(max_examples=300, deadline=None)
@given(value=values, others=value_sets)
def test_a_values_key_depends_on_that_value_alone(value, others) -> None:
    """Invariant: stable: a value's key is the same whatever values come with it (a class
    keeps its metric key from run to run), and the same in every process."""
    before = mlflow_key(value, "val_recall/")
    for other in others:
        mlflow_key(other, "val_recall/")
    assert mlflow_key(value, "val_recall/") == before
    if any(char.isupper() for char in value):  # else `Mass` and `mass` could merge
        assert before.endswith(f"-h{digest(value)}")


@settings(max_examples=300, deadline=None)
@given(value=PLAIN)
def test_a_plain_value_is_kept_as_it_is(value) -> None:
    """Invariant: lowercase ASCII letters, digits, `_ - . ` and spaces (not leading with
    `.` or a space) are kept unchanged, so ordinary class names read as they are."""
    assert mlflow_key(value, "val_recall/") == f"val_recall/{value}"


def test_the_refused_label_of_the_issue_gets_a_readable_key() -> None:
    """Invariant: the species label MLflow refused keeps its words in its key."""
    key = mlflow_key("Adelie Penguin (Pygoscelis adeliae)", "val_recall/")
    assert key.startswith("val_recall/Adelie Penguin _Pygoscelis adeliae_-h")


@settings(max_examples=300, deadline=None)
@given(columns=value_sets)
def test_params_of_any_column_names_are_valid_one_to_one_and_keep_the_name(columns) -> None:
    """Invariant: `dataset.nulls.<column>` params have valid keys, one per column, and a
    renamed key's value holds the original key and value."""
    params = {f"dataset.nulls.{column}": "fill_mean" for column in columns}
    mapped = mlflow_params(params, 6000)
    assert len({key.casefold() for key in mapped}) == len(params)
    for key, value in mapped.items():
        _validate_param(key, value)
        if key not in params:
            record = json.loads(value)
            assert record["value"] == "fill_mean" and record["key"] in params


@settings(max_examples=300, deadline=None)
@given(value=values)
def test_a_value_in_a_yaml_comment_stays_in_the_comment(value) -> None:
    """Invariant: `ballast init`'s comment lines with any value in them parse as nothing
    (the comment is one line), and a config holding the value as key and value
    (`yaml_text`, as init writes it) reads back equal."""
    line = f"# {yaml_comment(value)}: 3 nulls"
    assert "\n" not in line and yaml.safe_load(line + "\nx: 1\n") == {"x": 1}
    document = {"dataset": {"nulls": {value: value}, "label_column": value}}
    assert yaml.safe_load(line + "\n" + yaml_text(document)) == document


@settings(max_examples=40, deadline=None)
@given(
    labels=st.lists(
        st.one_of(values, st.text(alphabet="$\\{}^_ab", max_size=8)),
        min_size=2,
        max_size=4,
        unique=True,
    )
)
def test_a_plot_of_any_class_labels_draws_them_as_they_are(labels) -> None:
    """Invariant: the confusion-matrix plot logged at a run's close draws with any class
    labels (`$\\frac{$` would start mathtext, which fails), and each tick shows its label
    as it is."""
    import io

    import matplotlib.pyplot as plt

    from tracking.run.plots import confusion_figure

    figure = confusion_figure(np.eye(len(labels), dtype=int).tolist(), labels)
    figure.savefig(io.BytesIO(), format="png")
    shown = [tick.get_text() for tick in figure.axes[0].get_xticklabels()]
    plt.close(figure)
    assert [text.replace(r"\$", "$") for text in shown] == labels
