"""Data of the incremental tests: a base sample of 10 files, nightly files of 10% more
rows, and how to make old inputs unreadable without changing their listing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.synthetic.tabular import SampleSpec, sample_table

SPEC = SampleSpec(
    num_rows=3_000,
    num_files=10,
    num_classes=4,
    num_sources=2,
    num_features=4,
    class_ratio=8.0,
    seed=3,
)
NIGHT_ROWS, NIGHT_ROW_GROUP = 300, 100  # 10% of the rows, in one file of 3 row groups


def config_for(raw: Path, root: Path, **overrides) -> ReshardConfig:
    values = {
        "dataset": DatasetSpec(inputs=[str(raw)], id_column="id"),
        "output_root": str(root),
        "target_shard_rows": 300,
        "rows_per_row_group": 64,
        "mode": "incremental",
        **overrides,
    }
    return ReshardConfig(**values)


def add_night(raw: Path, night: int) -> Path:
    """One new input file: 10% more rows, ids after every earlier file's."""
    rng = np.random.default_rng(100 + night)
    path = raw / f"night-{night}.parquet"
    pq.write_table(
        sample_table(rng, 100_000 * (night + 1), NIGHT_ROWS, night % 2, SPEC),
        path,
        row_group_size=NIGHT_ROW_GROUP,
    )
    return path


def spoil(raw: Path, pristine: Path) -> None:
    """Keep a copy of each input file, then fill it with zeros, its size and mtime kept."""
    pristine.mkdir(exist_ok=True)
    for path in sorted(raw.glob("*.parquet")):
        if (pristine / path.name).exists():
            continue
        shutil.copy2(path, pristine / path.name)
        stat = path.stat()
        path.write_bytes(bytes(stat.st_size))
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def restore(raw: Path, pristine: Path) -> None:
    for path in pristine.glob("*.parquet"):
        shutil.copy2(path, raw / path.name)
