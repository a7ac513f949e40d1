"""How the text of a CSV input becomes values: the setting `dataset.csv_empty_text`, carried
to every reader of an input file as one frozen `CsvReading`.

pyarrow's CSV reader, with its default options, reads an empty field of a text column as
the string "" (it already reads one as null in a column of numbers, dates or booleans);
pandas.read_csv and polars.read_csv read it as null. Under `missing` ballast reads as they
do; under `empty_string` (the default, so that a config written before the setting keeps
its rows and its version id) as before. What `missing` reads, cell by cell, as checked
against both (tests/preprocessing/test_csv_reading.py):

- an empty field, in any column: null (pandas and Polars agree);
- a field of spaces: the spaces, as text (they agree);
- a quoted empty field `""` in a text column: null, as pandas reads it (Polars reads "");
  ballast reads it as null in every other column already, and pandas' `to_csv` writes a
  null and an empty string alike, so the quotes do not tell a value from a missing one;
- `NA`, `null`, `N/A` in a text column: that text, as Polars reads it (pandas reads null):
  such words are values in real tables (`NA`: North America, Namibia), and a column of
  text keeps them where a user can see them;
- `NA`, `null`, `N/A`, `NaN` in a column of numbers: null, as pandas and ballast before
  (Polars reads the whole column as text, which would make numbers categories);
- a column with no value at all: nulls (pyarrow's null type), as both.

A null read here then meets the dataset's rules as any other: in the label column
`unlabelled`, in a feature its `nulls` policy (docs/data-path.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv

if TYPE_CHECKING:
    from preprocessing.config import DatasetSpec

CsvEmptyText = Literal["missing", "empty_string"]
CSV_EMPTY_TEXT_HELP = (
    "How an empty field of a text column in a CSV input reads: `missing` (a null, as "
    "pandas.read_csv and polars.read_csv read it; `ballast init` proposes it) or "
    '`empty_string` (the default, the value "", as ballast read it before; a config '
    "written then keeps its rows and version id). Numbers read as before under both; "
    "preprocessing/storage/csv_reading.py has the reading cell by cell."
)


@dataclass(frozen=True)
class CsvReading:
    """How a CSV input's text becomes values (the module's docstring has the rules)."""

    empty_text: CsvEmptyText = "empty_string"

    @classmethod
    def of(cls, spec: DatasetSpec) -> CsvReading:
        """The reading a dataset's config asks for."""
        return cls(spec.csv_empty_text)

    def batches(self, handle: Any, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        """The record batches of a CSV file open from its start, read this way."""
        convert = pa_csv.ConvertOptions(include_columns=columns) if columns else None
        for batch in pa_csv.open_csv(handle, convert_options=convert):
            yield empty_text_as_null(batch) if self.empty_text == "missing" else batch

    def schema(self, handle: Any) -> pa.Schema:
        """The schema of a CSV file open from its start: the same under either reading,
        which changes values only (an empty text value to null), never a column's type."""
        return pa_csv.open_csv(handle).schema


def empty_text_as_null(batch: pa.RecordBatch) -> pa.RecordBatch:
    """`batch` with every empty value of its text columns null. pyarrow has read the
    quotes by then, so a quoted empty field is null too (as pandas reads it)."""
    columns = [_empty_as_null(column) for column in batch.columns]
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def _empty_as_null(column: pa.Array) -> pa.Array:
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return column
    empty = pc.fill_null(pc.equal(column, ""), False)
    if not pc.any(empty).as_py():
        return column
    return pc.if_else(empty, pa.scalar(None, column.type), column)
