"""The one shard writer of every version writer (preprocessing/contract/shards.py): its
entry describes the bytes it wrote, its row groups are whole whatever sizes the rows come
in, and the same rows give the same bytes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from preprocessing.contract.shards import COMPRESSION, EncodeBuffer, ShardWriter, write_shard


def table(num_rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table(
        {
            "id": pa.array(np.arange(num_rows), pa.int64()),
            "label": pa.array(rng.integers(0, 3, num_rows)),
            "source": pa.array([f"s{i % 2}" for i in range(num_rows)]),
            "x": pa.array(rng.normal(size=num_rows), pa.float32()),
        }
    )


def test_rows_written_in_pieces_make_the_bytes_of_one_write(tmp_path: Path) -> None:
    """Invariants: rows fed in uneven pieces are written as row groups of exactly
    rows_per_row_group rows (the last shorter), byte-identical to the whole table written
    at once; the entry's sizes, digest and counts are those of the file."""
    rows = table(1000)
    whole = write_shard(str(tmp_path / "whole.parquet"), rows, 128, "label", "source")
    writer = ShardWriter(str(tmp_path / "pieces.parquet"), 128, "label", "source")
    for start, stop in [(0, 3), (3, 200), (200, 201), (201, 700), (700, 1000)]:
        writer.write(rows.slice(start, stop - start))
    pieces = writer.close()
    data = (tmp_path / "pieces.parquet").read_bytes()
    assert data == (tmp_path / "whole.parquet").read_bytes()
    assert pieces.sha256 == whole.sha256 == hashlib.sha256(data).hexdigest()
    metadata = pq.read_metadata(tmp_path / "pieces.parquet")
    sizes = [metadata.row_group(i).num_rows for i in range(metadata.num_row_groups)]
    assert sizes == [128] * 7 + [104] and pieces.num_row_groups == 8
    assert pieces.row_group_sizes() == sizes and pieces.num_bytes == len(data)
    assert metadata.row_group(0).column(0).compression.lower() == COMPRESSION
    labels = pq.read_table(tmp_path / "pieces.parquet").column("label").to_pylist()
    assert pieces.class_counts == {str(k): labels.count(k) for k in set(labels)}
    assert pieces.source_counts == {"s0": 500, "s1": 500}
    assert pieces.path == "pieces.parquet"


def test_an_empty_shard_needs_its_schema(tmp_path: Path) -> None:
    """Invariant: a shard of no rows is written from the schema it was given."""
    entry = write_shard(str(tmp_path / "empty.parquet"), table(0), 16, "label")
    assert entry.num_rows == 0 and entry.num_row_groups == 0
    assert pq.read_table(tmp_path / "empty.parquet").schema.names == ["id", "label", "source", "x"]


class EveryTable(EncodeBuffer):
    """An encode buffer used for tables of any size (tiny test tables included)."""

    MIN_TABLE_BYTES = 0


class TooSmall(EncodeBuffer):
    """An encode buffer shorter than any shard: every encode overflows it."""

    def for_bytes(self, nbytes: int) -> pa.Buffer | None:
        return pa.allocate_buffer(64)


def test_a_reused_encode_buffer_writes_the_same_bytes(tmp_path: Path) -> None:
    """Invariants: shards encoded one after the other into one reused buffer (a write
    task's) are byte-identical to shards encoded into their own streams, with the same
    entries, whatever was in the buffer before; a shard that overflows the buffer is
    encoded again on its own, with the same bytes."""
    encode, small = EveryTable(), TooSmall()
    for index, rows in enumerate([1000, 300, 1000]):  # larger, smaller, larger again
        alone = write_shard(
            str(tmp_path / f"alone-{index}.parquet"), table(rows), 128, "label", "source"
        )
        reused = write_shard(
            str(tmp_path / f"reused-{index}.parquet"),
            table(rows),
            128,
            "label",
            "source",
            encode=encode,
        )
        overflowed = write_shard(
            str(tmp_path / f"small-{index}.parquet"),
            table(rows),
            128,
            "label",
            "source",
            encode=small,
        )
        data = (tmp_path / f"alone-{index}.parquet").read_bytes()
        assert (tmp_path / f"reused-{index}.parquet").read_bytes() == data
        assert (tmp_path / f"small-{index}.parquet").read_bytes() == data
        for entry in (reused, overflowed):
            assert (entry.sha256, entry.num_bytes, entry.class_counts, entry.num_row_groups) == (
                alone.sha256,
                alone.num_bytes,
                alone.class_counts,
                alone.num_row_groups,
            )
    assert EncodeBuffer().for_bytes(table(10).nbytes) is None  # small shards keep their own stream
