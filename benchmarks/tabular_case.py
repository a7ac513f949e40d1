"""The loader benchmark's tabular case: what the feature codec costs in rows/s.

Two versions of the same number of rows, each resharded by `run_reshard`: a tabular
one (20 scalar columns, int32/int64/float32/float64 in turn, 10% nulls in each under
`fill_mean` or `indicator`, plus 2 string categories of 8 and 50 values with nulls under
`fill_zero`) and a fixed-size-list one whose one float32 column has the width the codec
gives the tabular rows. Both are read by the training loader (0 workers, default
read-ahead, 1024-row batches); the best of `repeat` passes is kept. The target: the
codec costs at most 10% of the fixed-size-list path's rows/s.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.codec import FeatureCodec
from preprocessing.contract.manifest import read_manifest
from preprocessing.driver.reshard import run_reshard
from training.config import LoaderConfig
from training.data.loader import ShardStream

NUM_SCALARS, NUM_FILES, BATCH = 20, 8, 1024
SCALAR_TYPES = (pa.int32(), pa.int64(), pa.float32(), pa.float64())
CATEGORIES = {"city": 8, "product": 50}


def tabular_file(rng: np.random.Generator, first_id: int, num_rows: int) -> pa.Table:
    """One raw file of the tabular case: ids, 4 classes, 20 scalars, 2 categories."""
    columns = {
        "id": pa.array(np.arange(first_id, first_id + num_rows)),
        "label": pa.array(rng.integers(0, 4, num_rows)),
        "source": pa.array(np.full(num_rows, "bench")),
    }
    for index in range(NUM_SCALARS):
        values = rng.normal(index * 10.0, 1.0 + index, num_rows)
        arrow_type = SCALAR_TYPES[index % len(SCALAR_TYPES)]
        columns[f"x{index}"] = pa.array(values, mask=rng.random(num_rows) < 0.1).cast(
            arrow_type, safe=False
        )
    for name, size in CATEGORIES.items():
        values = np.array([f"{name}-{k}" for k in range(size)])[rng.integers(0, size, num_rows)]
        columns[name] = pa.array(values, mask=rng.random(num_rows) < 0.05)
    return pa.table(columns)


def tabular_spec(raw: Path) -> DatasetSpec:
    scalars = [f"x{index}" for index in range(NUM_SCALARS)]
    nulls = {name: "indicator" if i % 5 == 0 else "fill_mean" for i, name in enumerate(scalars)}
    return DatasetSpec(
        inputs=[str(raw)],
        id_column="id",
        feature_columns=[*scalars, *CATEGORIES],
        nulls={**nulls, **dict.fromkeys(CATEGORIES, "fill_zero")},
    )


def write_raw(raw: Path, num_rows: int, width: int | None) -> None:
    """The tabular files, or (`width` given) as many rows of one fixed-size list."""
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    per_file = num_rows // NUM_FILES
    for index in range(NUM_FILES):
        table = tabular_file(rng, index * per_file, per_file)
        if width is not None:
            values = pa.array(rng.normal(size=per_file * width).astype(np.float32))
            table = table.select(["id", "label", "source"]).append_column(
                "features", pa.FixedSizeListArray.from_arrays(values, width)
            )
        pq.write_table(table, raw / f"part-{index}.parquet")


def prepare(work: Path, name: str, num_rows: int, spec_of: object, width: int | None) -> str:
    """A committed version of the case (reused from `work` when there)."""
    raw = work / f"{name}-raw-{num_rows}"
    if not raw.exists():
        write_raw(raw, num_rows, width)
    spec = spec_of(raw) if callable(spec_of) else DatasetSpec(inputs=[str(raw)], id_column="id")
    config = ReshardConfig(
        dataset=spec,
        output_root=str(work / f"{name}-{num_rows}"),
        target_shard_rows=65_536,
        rows_per_row_group=8_192,
        holdout_fraction=0.0,
        num_workers=2,
        shuffle="global",
    )
    return run_reshard(config).manifest_uri


def rows_per_s(root: str, repeat: int) -> float:
    """Best rows/s of the training loader over one epoch of the train split."""
    best = 0.0
    for _ in range(repeat):
        stream = ShardStream(root, "train", LoaderConfig(batch_size=BATCH), seed=0)
        started, rows = time.perf_counter(), 0
        for batch in stream.iterate(rank_world=(0, 1)):
            rows += len(batch["label"])
        best = max(best, rows / (time.perf_counter() - started))
    return best


def tabular_report(work: Path, num_rows: int, repeat: int) -> float:
    """Print both cases' rows/s; the codec path's share of the fixed-size-list path's."""
    tabular = prepare(work, "tabular", num_rows, tabular_spec, None)
    width = FeatureCodec.from_manifest(read_manifest(tabular)[0]).width
    plain = prepare(work, f"fsl{width}", num_rows, None, width)
    coded, listed = rows_per_s(tabular, repeat), rows_per_s(plain, repeat)
    print(f"\ntabular case, {num_rows:,} rows, {width} floats a row:")
    print(
        f"  codec ({NUM_SCALARS} scalars with nulls filled, {len(CATEGORIES)} categories)"
        f" {coded:12,.0f} rows/s"
    )
    print(f"  fixed-size list<float32>[{width}]{'':28} {listed:12,.0f} rows/s")
    return coded / listed
