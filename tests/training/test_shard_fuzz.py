"""A damaged shard is always ShardDamaged (preprocessing/contract/integrity.py), wherever
its bytes are flipped: the magic, a page header, a dictionary page, a data page's values,
the footer, its length, the closing magic. One byte flipped at offsets drawn from every
region of a small committed shard (seeded, the seed in the test's id), read by the
training loader with `read.verify: size` and by the contract's whole-shard reader: each
read yields the shard's rows unchanged (a byte no reader uses, a statistic) or raises
ShardDamaged naming the version and the shard; never pyarrow's or thrift's raw error, and
never other rows. Before, a flipped page header surfaced as pyarrow's `Couldn't
deserialize thrift`, retried as if it could pass."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from preprocessing.contract.integrity import ShardDamaged, read_shard_table, split_shards
from tests.training.test_damaged_shards import first_shard, stream_ids

SEED = 38
OFFSETS_PER_REGION = 3


def regions(path: Path) -> dict[str, range]:
    """Byte ranges of a Parquet file by what they hold, from its footer."""
    size = path.stat().st_size
    footer_length = int.from_bytes(path.read_bytes()[-8:-4], "little")
    found = {
        "magic": range(0, 4),
        "footer": range(size - 8 - footer_length, size - 8),
        "footer length": range(size - 8, size - 4),
        "closing magic": range(size - 4, size),
    }
    metadata = pq.read_metadata(path)
    for group in range(metadata.num_row_groups):
        for index in range(metadata.num_columns):
            chunk = metadata.row_group(group).column(index)
            name = chunk.path_in_schema.split(".")[0]
            start = chunk.data_page_offset
            if chunk.has_dictionary_page:
                found[f"dictionary page {name}"] = range(chunk.dictionary_page_offset, start)
            end = (
                chunk.dictionary_page_offset if chunk.has_dictionary_page else start
            ) + chunk.total_compressed_size
            found[f"page header {name}"] = range(start, start + 12)
            found[f"page values {name}"] = range(start + 12, end)
    return found


def flip(path: Path, offset: int, original: bytes) -> None:
    data = bytearray(original)
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def drawn_offsets(path: Path) -> list[tuple[str, int]]:
    rng = random.Random(SEED)
    return [
        (name, offset)
        for name, span in regions(path).items()
        for offset in rng.sample(list(span), min(OFFSETS_PER_REGION, len(span)))
    ]


def test_a_flipped_byte_anywhere_is_shard_damaged_or_no_change(
    make_dataset: Callable[..., str],
) -> None:
    """Invariant: see the module; every region of the shard is hit at least once."""
    root = make_dataset(48, num_shards=1, row_group_size=16)
    entry, path, version = first_shard(root)
    original = path.read_bytes()
    clean_ids = stream_ids(root, "size")
    clean_table = read_shard_table(split_shards(root, "train")[0])
    outcomes: dict[str, set[str]] = {}
    for name, offset in drawn_offsets(path):
        flip(path, offset, original)
        for reader, read in (
            ("loader", lambda: stream_ids(root, "size") == clean_ids),
            (
                "contract",
                lambda: read_shard_table(split_shards(root, "train")[0]).equals(clean_table),
            ),
        ):
            try:
                same = read()
            except ShardDamaged as error:
                assert f"version {version}" in str(error) and entry.path in str(error)
                outcomes.setdefault(name, set()).add("damaged")
                continue
            assert same, f"{reader}: other rows after flipping byte {offset} ({name})"
            outcomes.setdefault(name, set()).add("same")
    path.write_bytes(original)
    assert any("damaged" in found for found in outcomes.values())
    assert {"magic", "footer", "closing magic"} <= outcomes.keys()


@pytest.mark.parametrize("region", ["footer length", "closing magic"])
def test_every_byte_of_the_frame_is_shard_damaged(
    make_dataset: Callable[..., str], region: str
) -> None:
    """Invariant: a flipped byte of the closing magic or the footer's length always fails
    as ShardDamaged in the contract's reader (pyarrow cannot open the file; it never reads
    the leading magic, so a flip there leaves the rows, as the test above allows)."""
    root = make_dataset(48, num_shards=1, row_group_size=16)
    _, path, _ = first_shard(root)
    original = path.read_bytes()
    for offset in regions(path)[region]:
        flip(path, offset, original)
        with pytest.raises(ShardDamaged):
            read_shard_table(split_shards(root, "train")[0])
    path.write_bytes(original)
