"""Fixtures of the preprocessing tests that more than one module uses."""

from __future__ import annotations

from pathlib import Path

import pytest

from preprocessing.driver.reshard import ReshardResult, run_reshard
from preprocessing.synthetic.tabular import write_sample
from tests.preprocessing.nightly import SPEC, config_for


@pytest.fixture
def base_version(tmp_path, dask_client) -> tuple[Path, Path, ReshardResult]:
    """A committed base version of the nightly sample (raw files, root, its result)."""
    raw, root = tmp_path / "raw", tmp_path / "out"
    write_sample(raw, SPEC)
    return raw, root, run_reshard(config_for(raw, root), dask_client)
