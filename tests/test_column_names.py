"""Any column name Parquet, CSV or JSON allows survives the pure pieces it passes through:
MLflow param keys (valid and one to one), the feature codec and its JSON (the manifest's
`features`), and the registered model's signature and input casting."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow.utils.validation import _validate_param

from preprocessing.contract.codec import FeatureCodec
from preprocessing.contract.column_spec import ColumnSpec
from preprocessing.contract.names import MAX_MLFLOW_KEY_CHARS, is_plain, mlflow_key, mlflow_params
from tracking.run.pyfunc import dataset_types, signature
from tracking.run.runs import flatten

HOSTILE = [
    "Body Mass (g)",
    "a.b",
    "a/b",
    "../up",
    "/root",
    "it's",
    'say "hi"',
    "x|y",
    "naïve",
    "重量",
    "tab\tname",
    "new\nline",
    "",
    " ",
    ".",
    "..",
    "a//b",
    "x" * 260,
    "Mass",
    "mass",
    "MASS",
    "dataset.nulls.x",
    "-h1234abcd",
    "emoji 🐧",
    "SECRET",  # a column named like a credential: its policy is data, not redacted
    "api_token",
]
names = st.one_of(st.sampled_from(HOSTILE), st.text(min_size=0, max_size=260))
name_sets = st.lists(names, min_size=1, max_size=12, unique=True)


@settings(max_examples=200, deadline=None)
@given(keys=name_sets)
def test_mlflow_keys_are_valid_and_distinct_even_ignoring_case(keys: list[str]) -> None:
    """Invariant: every key maps to one MLflow accepts (its own validator, 250 characters
    at most); distinct keys map to keys distinct even ignoring case; a key of lowercase
    ASCII letters, digits, `_ - .` and spaces is kept unchanged (a key with capitals gets
    a digest whatever other keys exist: the rule is stable, tests/test_names.py)."""
    mapping = {key: mlflow_key(key) for key in keys}
    for original, key in mapping.items():
        _validate_param(key, "value")
        assert len(key) <= MAX_MLFLOW_KEY_CHARS
        if is_plain(original, MAX_MLFLOW_KEY_CHARS):
            assert key == original
    assert len({key.casefold() for key in mapping.values()}) == len(keys)


@settings(max_examples=100, deadline=None)
@given(columns=name_sets)
def test_nulls_params_of_any_column_names_are_valid_and_keep_the_name(columns) -> None:
    """Invariant: the flattened config of `dataset.nulls` over any column names has only
    valid MLflow keys, one param per column, and each renamed key's value holds the
    original key and value."""
    flat = flatten({"dataset": {"nulls": {name: "fill_mean" for name in columns}}})
    assert len(flat) == len(columns)
    for key, value in flat.items():
        _validate_param(key, value)
        if not key.startswith("dataset.nulls.") or key[len("dataset.nulls.") :] not in columns:
            record = json.loads(value)
            assert record["value"] == "fill_mean"
            assert record["key"][len("dataset.nulls.") :] in columns


def test_params_keep_valid_keys_and_values_as_they_were() -> None:
    """Invariant: params whose keys MLflow takes pass through unchanged."""
    params = {"loader.batch_size": "64", "dataset.label_column": "Species name"}
    assert mlflow_params(params, 6000) == params


@settings(max_examples=60, deadline=None)
@given(
    columns=st.lists(names.filter(bool), min_size=1, max_size=6, unique=True),
    seed=st.integers(0, 2**16),
)
def test_codec_encodes_and_round_trips_columns_of_any_name(columns, seed) -> None:
    """Invariant: a codec over columns of any names survives its JSON (as the manifest
    stores it), encodes a table with those columns exactly as the same codec over plain
    names encodes the same values, and the model's signature and input casting keep
    every name."""
    rng = np.random.default_rng(seed)
    kinds = [("numeric", "double"), ("category", "string"), ("boolean", "bool")]
    specs, plain, values = [], [], {}
    for index, name in enumerate(columns):
        kind, arrow_type = kinds[index % len(kinds)]
        extra = {"vocabulary": ["a", "b|c"]} if kind == "category" else {}
        specs.append(ColumnSpec(name, kind, arrow_type, shift=0.5, **extra))
        plain.append(ColumnSpec(f"c{index}", kind, arrow_type, shift=0.5, **extra))
        values[index] = {
            "numeric": rng.normal(size=5).tolist(),
            "category": rng.choice(["a", "b|c", "z"], 5).tolist(),
            "boolean": rng.integers(0, 2, 5).astype(bool).tolist(),
        }[kind]
    codec = FeatureCodec(tuple(specs))
    stored = FeatureCodec.from_json(json.loads(json.dumps(codec.to_json())))
    assert stored == codec
    table = pa.table({name: values[i] for i, name in enumerate(columns)})
    reference = FeatureCodec(tuple(plain)).encode(
        pa.table({f"c{i}": values[i] for i in range(len(columns))})
    )
    np.testing.assert_array_equal(stored.encode(table), reference)
    assert signature(stored, ["a", "b"]).inputs.input_names() == columns
    assert dataset_types(table, stored).column_names == columns


@settings(max_examples=30, deadline=None)
@given(label=names)
def test_a_class_label_of_any_text_stays_in_its_markdown_table_cell(label: str) -> None:
    """Invariant: in the arms' comparison table (a Prefect markdown artifact) the worst
    class, whatever its label, adds no column: every row splits into the same cells on
    unescaped `|`, and no line break ends the row early."""
    import re

    from flows.report import comparison_lines
    from flows.results import Evaluation

    evaluation = Evaluation.model_validate(
        {
            "num_rows": 3,
            "dataset_version": "0123456789abcdef",
            "macro_f1": 0.5,
            "balanced_accuracy": 0.5,
            "recall": {label: 0.1, "other": 0.9},
            "class_prior_baseline": {},
            "beats_class_prior": True,
        }
    )
    lines = comparison_lines({"rebalanced": evaluation, "natural-mix": evaluation})
    assert all("\n" not in line and "\r" not in line for line in lines)
    cells = {len(re.split(r"(?<!\\)\|", line)) for line in lines if line.startswith("|")}
    assert cells == {5}  # two arms: "| figure | arm | arm |"
