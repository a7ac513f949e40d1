"""What a person sees of a chain: `ballast status` lists its versions with parent, rows
added and time; the reshard artifact's text says what was read and what was skipped;
the MLflow dataset input and run tags carry the version's parent."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from flows.cli.status import describe_status
from flows.report import increment_summary
from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import ReshardResult, run_reshard
from preprocessing.synthetic.tabular import SampleSpec, sample_table, write_sample
from tracking.run.runs import dataset_input

pytestmark = pytest.mark.slow  # every test here uses the session Dask cluster

SPEC = SampleSpec(
    num_rows=2_000,
    num_files=8,
    num_classes=3,
    num_sources=2,
    num_features=4,
    class_ratio=4.0,
    seed=5,
)


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory, dask_client) -> tuple[Path, ReshardResult, ReshardResult]:
    """A flat base, then a child appending one file of 200 rows."""
    base = tmp_path_factory.mktemp("lineage")
    raw, root = base / "raw", base / "out"
    write_sample(raw, SPEC)
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(raw)]),
        output_root=str(root),
        target_shard_rows=400,
        rows_per_row_group=64,
        mode="incremental",
    )
    first = run_reshard(config, dask_client)
    table = sample_table(np.random.default_rng(1), 50_000, 200, 0, SPEC)
    pq.write_table(table, raw / "night-0.parquet")
    return root, first, run_reshard(config, dask_client)


def test_status_shows_the_chain(two_versions, tmp_path) -> None:
    """Invariants: the child is marked current and says whom it appends to; the lineage
    lists base then child, each with its parent, training rows added, files and time."""
    root, first, child = two_versions
    preset = tmp_path / "preset.yaml"
    preset.write_text(yaml.safe_dump({"reshard": {"output_root": str(root)}}))
    text = describe_status(str(preset), str(tmp_path))
    base_id, child_id = first.manifest.version_id, child.manifest.version_id
    assert f"* {child_id}" in text and f"(appends to {base_id})" in text
    lineage = text.split(f"lineage of {child_id}:\n", 1)[1].splitlines()
    assert lineage[0].split()[:3] == [base_id, "parent", "-"]
    assert lineage[1].split()[:3] == [child_id, "parent", base_id]
    added = child.manifest.deltas[-1].added_rows()
    assert f"+{added} training rows from 1 files  {child.manifest.created_at}" in lineage[1]
    assert f"from {SPEC.num_files} files  {first.manifest.created_at}" in lineage[0]


def test_the_artifact_says_what_was_read_and_skipped(two_versions) -> None:
    """Invariants: the child read 1 file and skipped the base's; its bytes read are the new
    file's; the base's shards are reused, not written."""
    _, first, child = two_versions
    text = increment_summary(child.manifest)
    new_bytes = child.manifest.deltas[-1].num_bytes
    skipped = sum(record.num_bytes for record in first.manifest.inputs)
    assert f"1 read (new), {SPEC.num_files} skipped of {SPEC.num_files + 1}" in text
    assert f"input bytes: {new_bytes} read, {skipped} skipped" in text
    num_reused = len(first.manifest.split("train").shards)
    assert f"training shards: {num_reused} reused" in text
    assert "parent: none (a full reshard)" in increment_summary(first.manifest)


def test_mlflow_lineage_records_the_parent(two_versions) -> None:
    """Invariants: the dataset input's digest is the child's id, its tags and profile name
    the parent; a flat version's parent is recorded as none."""
    _, first, child = two_versions
    entry = dataset_input(child.manifest, child.manifest_uri)
    tags = {tag.key: tag.value for tag in entry.tags}
    assert entry.dataset.digest == child.manifest.version_id
    assert tags["ballast.parent_version"] == first.manifest.version_id
    assert f'"parent_version": "{first.manifest.version_id}"' in entry.dataset.profile
    flat = dataset_input(first.manifest, first.manifest_uri)
    assert {tag.key: tag.value for tag in flat.tags}["ballast.parent_version"] == "none"
