"""The registered model's input types as a serving host sends them: JSON and CSV files read
back by pandas hold dates and timestamps as ISO 8601 strings (benchmarks/first_hour.py's
cars table was refused by MLflow's own check: "Can not safely convert str to datetime64")."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from mlflow.models.utils import _enforce_schema

from preprocessing.contract.codec import FeatureCodec
from preprocessing.contract.column_spec import ColumnSpec
from tracking.run.pyfunc import rows_table, signature

TEMPORAL = [
    ColumnSpec("day", "temporal", "date32[day]", shift=3_000.0, scale=10.0, nulls="fill_mean"),
    ColumnSpec("seen", "temporal", "timestamp[s]", shift=1e9, scale=1e6, nulls="fill_mean"),
]


@pytest.mark.parametrize(
    "rows",
    [
        pd.DataFrame({"day": ["1978-03-01", None], "seen": ["2001-09-09T01:46:40", None]}),
        pd.DataFrame(
            {
                "day": pd.to_datetime(["1978-03-01", None]),
                "seen": pd.to_datetime(["2001-09-09T01:46:40", None]),
            }
        ),
    ],
    ids=["iso-strings", "datetimes"],
)
def test_date_and_timestamp_columns_take_iso_strings_and_datetimes_alike(rows) -> None:
    """Invariants: MLflow's input check of the model's signature lets ISO 8601 strings and
    pandas datetimes through for date and timestamp feature columns, and both encode to
    the same matrix (a null filled by its policy)."""
    codec = FeatureCodec(tuple(TEMPORAL))
    checked = _enforce_schema(rows, signature(codec, [0, 1]).inputs)
    encoded = codec.encode(rows_table(codec, checked))
    strings = pd.DataFrame({"day": ["1978-03-01", None], "seen": ["2001-09-09T01:46:40", None]})
    assert np.array_equal(encoded, codec.encode(rows_table(codec, strings)))
    assert np.isfinite(encoded).all()
