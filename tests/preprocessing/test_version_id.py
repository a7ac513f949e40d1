"""Which settings name a version: the fields marked output-neutral on ReshardConfig leave
the version id unchanged, every other field changes it, and a config unchanged since
the fields moved under `incremental:` keeps the id it had before (so cached versions are
reused and shards stay byte-identical)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

import preprocessing.versions.incremental as incremental
from preprocessing.config import ReshardConfig
from preprocessing.toolbox.secrets import redact_value
from preprocessing.toolbox.setting_marks import output_neutral_fields
from preprocessing.versions.incremental import Increment, version_id_of

FIXED = {
    "dataset": {
        "inputs": ["s3://bucket/raw/*.parquet"],
        "feature_columns": ["x", "y"],
        "nulls": {"x": "fill_mean"},
        "id_column": "id",
    },
    "output_root": "/data/out",
    "mix": {"class_weighting": "temperature", "temperature": 3.0},
    "shuffle": "block",
    "seed": 7,
    "target_shard_rows": 1000,
    "holdout_fraction": 0.2,
    "num_workers": 4,
    "mode": "incremental",
    "incremental": {
        "max_chain_length": 5,
        "on_changed_inputs": "rebuild",
        "max_small_shard_fraction": 0.5,
    },
    "exchange_task_bytes": 1 << 20,
}
# Computed on commit bd107bc (before the incremental section), with the same settings
# written flat: the digest of the settings hashed, and the id with a fixed code version.
PINNED_SETTINGS_SHA256 = "b140d96196e9b7b92291783869d7bff41981c98ba0e05cd30be751a637eb7181"
PINNED_VERSION_ID = "c19de5e0f102af3d"
FINGERPRINT = "f" * 64
NEUTRAL = {
    "output_root",
    "num_workers",
    "retry",
    "mode",
    "incremental",
    "exchange_task_bytes",
    "single_pass_bytes",
    "exchange_fan_in",
    "exchange_rounds",
    "max_tasks_in_flight",
    "upload_part_bytes",
    "progress_deadline_s",
    "progress_deadline_factor",
    "resume_max_age_s",
}
# One other value per field: a neutral one must keep the id, an output one must change it.
CHANGES: dict[str, Any] = {
    "output_root": "/elsewhere",
    "num_workers": 9,
    "retry": {"attempts": 7},
    "mode": "incremental",
    "incremental": {"max_chain_length": 2},
    "exchange_task_bytes": 3 << 20,
    "single_pass_bytes": 0,
    "exchange_fan_in": 5,
    "exchange_rounds": 2,
    "max_tasks_in_flight": 3,
    "upload_part_bytes": 16 << 20,
    "progress_deadline_s": 30.0,
    "progress_deadline_factor": 7.0,
    "resume_max_age_s": 60.0,
    "dataset": {**FIXED["dataset"], "feature_columns": ["x"], "nulls": {}},
    "mix": {"class_weighting": "uniform"},
    "shuffle": "global",
    "seed": 8,
    "num_output_rows": 5000,
    "target_shard_rows": 999,
    "target_shard_bytes": 1 << 20,
    "rows_per_row_group": 512,
    "max_piece_rows": 77,
    "holdout_fraction": 0.3,
    "max_rejected_fraction": 0.5,
}


@pytest.fixture
def fixed_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(incremental, "code_version", lambda: "ballast-pinned-format2")


def version_id(config: ReshardConfig) -> str:
    return version_id_of(FINGERPRINT, config, Increment("full", "test"))


def test_an_unchanged_config_keeps_its_version_id(fixed_code: None) -> None:
    """Invariant: the bytes hashed for a fixed config, and so its version id, are the ones
    the code before the incremental section hashed for the same settings."""
    config = ReshardConfig.model_validate(FIXED)
    settings = json.dumps(redact_value(config.output_settings()), sort_keys=True)
    assert hashlib.sha256(settings.encode()).hexdigest() == PINNED_SETTINGS_SHA256
    assert version_id(config) == PINNED_VERSION_ID


def test_the_output_neutral_fields_are_declared_on_existing_fields() -> None:
    """Invariants: the fields the version id skips are exactly the marked ones, each a
    field of ReshardConfig, and every other field is in the hashed settings."""
    neutral = output_neutral_fields(ReshardConfig)
    assert neutral == NEUTRAL
    assert neutral <= set(ReshardConfig.model_fields)
    config = ReshardConfig.model_validate(FIXED)
    assert set(config.output_settings()) == set(ReshardConfig.model_fields) - neutral
    assert set(CHANGES) == set(ReshardConfig.model_fields)


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_a_neutral_field_keeps_the_id_and_an_output_field_changes_it(
    name: str, fixed_code: None
) -> None:
    """Invariant: changing one field keeps the version id if and only if it is marked
    output-neutral."""
    base = ReshardConfig.model_validate({**FIXED, "mode": "full"})
    changed = ReshardConfig.model_validate({**FIXED, "mode": "full", name: CHANGES[name]})
    assert getattr(changed, name) != getattr(base, name)
    same = version_id(changed) == version_id(base)
    assert same == (name in NEUTRAL), f"{name}: id {'kept' if same else 'changed'}"


def test_no_validation_split_keeps_the_id_and_one_changes_it(fixed_code: None) -> None:
    """Invariant: `dataset.validation_fraction` added later: 0 written out keeps an existing
    config's version id (pinned above), another value changes it."""
    for fraction, kept in ((0, True), (0.0, True), (0.1, False)):
        dataset = {**FIXED["dataset"], "validation_fraction": fraction}
        config = ReshardConfig.model_validate({**FIXED, "dataset": dataset})
        assert (version_id(config) == PINNED_VERSION_ID) == kept


def test_duplicates_keep_written_out_keeps_the_id_and_each_other_value_has_its_own(
    fixed_code: None,
) -> None:
    """Invariant: `dataset.duplicates` added later: `keep` written out keeps an existing
    config's version id (pinned above); `same_split` and `drop` (a value added later
    still) each change it, to ids of their own."""
    ids = {}
    for value in ("keep", "same_split", "drop"):
        dataset = {**FIXED["dataset"], "duplicates": value}
        ids[value] = version_id(ReshardConfig.model_validate({**FIXED, "dataset": dataset}))
    assert ids["keep"] == PINNED_VERSION_ID
    assert len(set(ids.values())) == 3
