"""What `dataset.csv_empty_text: missing` costs a read of CSV files
(preprocessing/storage/csv_reading.py), beside the old reading and what a user would use
instead: each reader reads every file under `--inputs` whole, `--repeat` rounds, round robin,
best time; the figures printed are seconds, the ratio to the old reading, the rows, and the
nulls each reader found in text columns (pandas' `object`/`str` columns, Polars' `String`).

- ballast `empty_string`: `iter_batches` under the old reading (pyarrow's defaults);
- ballast `missing`: the same, with each text column's empty values made null;
- polars.read_csv and pandas.read_csv, with their defaults.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/csv_reading_cost.py --inputs DIR
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python benchmarks/NAME.py` puts benchmarks/ first on sys.path: the repository root goes first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import time
from collections.abc import Callable

import pandas as pd
import polars as pl
import pyarrow as pa

from preprocessing.storage.csv_reading import CsvReading
from preprocessing.storage.sources import iter_batches


def ballast(reading: CsvReading) -> Callable[[Path], tuple[int, int]]:
    """Rows and text nulls of a file read by ballast under `reading`."""

    def read(path: Path) -> tuple[int, int]:
        table = pa.Table.from_batches(list(iter_batches(str(path), reading=reading)))
        text = [c for c in table.columns if pa.types.is_string(c.type)]
        return table.num_rows, sum(column.null_count for column in text)

    return read


def polars_read(path: Path) -> tuple[int, int]:
    frame = pl.read_csv(path)
    text = [frame[name] for name, kind in frame.schema.items() if kind == pl.String]
    return frame.height, sum(column.null_count() for column in text)


def pandas_read(path: Path) -> tuple[int, int]:
    frame = pd.read_csv(path)
    text = frame.select_dtypes(include=["object", "string"])
    return len(frame), int(text.isna().sum().sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", required=True, help="a folder of .csv files")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    files = sorted(Path(args.inputs).glob("*.csv"))
    readers = {
        "ballast empty_string (before)": ballast(CsvReading("empty_string")),
        "ballast missing": ballast(CsvReading("missing")),
        "polars.read_csv": polars_read,
        "pandas.read_csv": pandas_read,
    }
    best = dict.fromkeys(readers, float("inf"))
    found: dict[str, tuple[int, int]] = {}
    for _ in range(args.repeat):
        for name, read in readers.items():
            started = time.perf_counter()
            counts = [read(path) for path in files]
            best[name] = min(best[name], time.perf_counter() - started)
            found[name] = (sum(c[0] for c in counts), sum(c[1] for c in counts))
    before = best["ballast empty_string (before)"]
    print(f"{len(files)} files, best of {args.repeat}")
    for name, seconds in best.items():
        rows, nulls = found[name]
        print(f"{name:<32} {seconds:7.3f} s  {seconds / before:5.2f}x  {rows} rows  {nulls} nulls")


if __name__ == "__main__":
    main()
