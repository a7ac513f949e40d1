"""Output and inputs kept apart (preprocessing/storage/roots.py): an output root inside an
input root, or the reverse, is refused when the config is read, naming both; a directory
input that holds an old output of ballast lists only the data beside it."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import CURRENT_NAME, MANIFEST_NAME
from preprocessing.storage.roots import OWN_MARKERS, STAGING_NAME
from preprocessing.storage.sources import list_inputs
from preprocessing.versions.attempt import STAGING_DIR


@pytest.mark.parametrize(
    ("inputs", "output", "inside"),
    [
        (["/data/raw"], "/data/raw/out", "output_root /data/raw/out is inside dataset.inputs[0]"),
        (["/data/raw/*.parquet"], "/data/raw/v", "output_root /data/raw/v is inside"),
        (
            ["/data/a", "/data/raw/**"],
            "/data/raw",
            "output_root /data/raw is inside dataset.inputs[1]",
        ),
        (["/data/out/raw"], "/data/out", "dataset.inputs[0] /data/out/raw is inside output_root"),
        (["s3://b/raw"], "s3://b/raw/out", "output_root s3://b/raw/out is inside"),
    ],
)
def test_an_output_inside_an_input_or_the_reverse_is_refused_naming_both(
    inputs: list[str], output: str, inside: str
) -> None:
    """Invariant: the config does not validate, and its error names both roots."""
    with pytest.raises(ValidationError, match=re.escape(inside)):
        ReshardConfig(dataset=DatasetSpec(inputs=inputs), output_root=output)


@pytest.mark.parametrize(
    ("inputs", "output"),
    [
        (["/data/raw"], "/data/raw-out"),
        (["/data/raw/*.parquet"], "/data/out"),
        (["s3://b/raw"], "/data/raw/out"),
        (["s3://b/raw"], "s3://c/raw/out"),
    ],
)
def test_roots_that_only_share_a_prefix_or_differ_in_store_are_accepted(
    inputs: list[str], output: str
) -> None:
    """Invariant: whole path components on one store decide, not a shared string prefix."""
    assert ReshardConfig(dataset=DatasetSpec(inputs=inputs), output_root=output)


def test_a_symlinked_output_inside_an_input_is_refused(tmp_path: Path) -> None:
    """Invariant: a local root is compared once its links are resolved."""
    (tmp_path / "raw").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "raw")
    with pytest.raises(ValidationError, match=r"is inside dataset\.inputs"):
        ReshardConfig(
            dataset=DatasetSpec(inputs=[str(tmp_path / "raw")]),
            output_root=str(tmp_path / "link" / "out"),
        )


def test_a_listing_skips_ballasts_own_folders_under_an_input(tmp_path: Path) -> None:
    """Invariant: under a directory input, the files of an old output root (with
    `_CURRENT`, versions with manifests, staging) are not listed; the data beside them is,
    and a version named as the input itself is read."""
    table = pa.table({"label": ["a", "b"], "features": [1.0, 2.0]})
    raw = tmp_path / "raw"
    for name in (
        "day-1.parquet",
        "old/_CURRENT",
        "old/v-1/part-0.parquet",
        "old/v-1/_MANIFEST.json",
        "old/_staging/v-2/a/part-0.parquet",
        "run/_staging/v-3/b/part-1.parquet",
        "nested/day-2.parquet",
    ):
        path = raw / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".parquet"):
            pq.write_table(table, path)
        else:
            path.write_text("v-1\n")
    listed = [f.relative_path for f in list_inputs(DatasetSpec(inputs=[str(raw)]))]
    assert listed == ["day-1.parquet", "nested/day-2.parquet"]
    version = [f.relative_path for f in list_inputs(DatasetSpec(inputs=[str(raw / "old/v-1")]))]
    assert version == ["part-0.parquet"]


def test_the_marker_names_are_those_ballast_writes() -> None:
    """Invariant: roots.py's copies of the names (not imported: see there) do not drift."""
    assert set(OWN_MARKERS) == {CURRENT_NAME, MANIFEST_NAME} and STAGING_NAME == STAGING_DIR
