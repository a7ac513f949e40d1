"""A raw table with what real tables hold and a first config trips on: an integer key and
a string key (one value per row), an ISO 8601 timestamp string, NaN in a float column, a
null category, rows without a label and a string of 10,000 values. Read by the tests of
`ballast init` (tests/flows/test_init_proposal.py) and of unlabelled rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

NUM_FILES = 4
WIDE_VALUES = 10_000


def messy_table(num_rows: int, seed: int = 0) -> pa.Table:
    """The table, labels `yes` / `no` decided by `x` and the timestamp's hour (so a model
    can learn them), about 1 row in 12 unlabelled."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=num_rows)
    seconds = 1_700_000_000 + rng.integers(0, 86_400 * 60, num_rows)
    hour = (seconds % 86_400) / 3_600
    label = np.where(x + (hour > 12) - 0.5 + rng.normal(0, 0.3, num_rows) > 0, "yes", "no")
    stamps = np.datetime_as_string(seconds.astype("datetime64[s]"), unit="s")
    colour = rng.choice(["red", "green", "blue"], num_rows)
    return pa.table(
        {
            "order_no": pa.array(rng.permutation(num_rows) + 10_000),
            "ticket": pa.array([f"T-{value:08d}" for value in rng.permutation(num_rows)]),
            "created": pa.array([f"{stamp}Z" for stamp in stamps]),
            "x": pa.array(np.where(rng.random(num_rows) < 0.05, np.nan, x)),  # NaN, not null
            "colour": pa.array(colour, mask=rng.random(num_rows) < 0.05),
            "shop": pa.array([f"shop-{k}" for k in rng.integers(0, WIDE_VALUES, num_rows)]),
            "label": pa.array(label, mask=rng.random(num_rows) < 1 / 12),
        }
    )


def write_messy_files(directory: Path, num_rows: int, seed: int = 0) -> pa.Table:
    """The table as `NUM_FILES` Parquet files of uneven size; the whole table."""
    table = messy_table(num_rows, seed)
    directory.mkdir(parents=True)
    bounds = np.sort(
        np.random.default_rng(seed).choice(np.arange(1, num_rows), NUM_FILES - 1, replace=False)
    )
    for index, (low, high) in enumerate(zip([0, *bounds], [*bounds, num_rows], strict=True)):
        pq.write_table(table.slice(low, high - low), directory / f"part-{index}.parquet")
    return table
