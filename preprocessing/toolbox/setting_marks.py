"""Which settings of a config make a version's id: a field marked OUTPUT_NEUTRAL changes how
fast, where or by which route a version is made, never what it holds; a setting added after
versions were committed is hashed only when set to another value than the one those
versions have (SETTINGS_ADDED_LATER). preprocessing/config.py marks its fields with them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

# Marks a setting that changes how fast, where or by which route a version is made, never
# what a flat version holds (the chain settings decide whether a run appends, and a
# child's id hashes its parent's instead): `output_settings`, and so the version id
# (preprocessing/versions/incremental.py: version_id_of), leave it out.
OUTPUT_NEUTRAL: dict[str, Any] = {"output_neutral": True}


def output_neutral_fields(model: type[BaseModel]) -> frozenset[str]:
    """The fields of `model` marked OUTPUT_NEUTRAL."""
    return frozenset(
        name
        for name, field in model.model_fields.items()
        if isinstance(field.json_schema_extra, dict)
        and field.json_schema_extra.get("output_neutral") is True
    )


# Dataset settings added after versions were committed, with the value that makes the content
# those versions have: hashed only when set otherwise, so an unchanged config keeps its
# version id (and its cached version). `on_identifying_feature` only warns or refuses, and
# `unlabelled: drop` keeps every row of a file without null labels, the only files that
# committed before it (null labels were refused).
SETTINGS_ADDED_LATER: dict[str, Any] = {
    "unlabelled": "drop",
    "date_columns": [],
    "on_identifying_feature": "warn",
    "group_column": None,
    "duplicates": "keep",
    "validation_fraction": 0.0,
    "holdout_by": "random",
    "holdout_column": None,
    "csv_empty_text": "empty_string",
}


def comparable_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` (a dump of ReshardConfig's output fields, or a manifest's record of them)
    without the SETTINGS_ADDED_LATER that hold their earlier value: what ids and the
    comparison with a parent's settings see."""
    dataset = {
        name: value
        for name, value in settings.get("dataset", {}).items()
        if SETTINGS_ADDED_LATER.get(name, object()) != value
    }
    return {**settings, "dataset": dataset} if "dataset" in settings else settings
