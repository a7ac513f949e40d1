"""A damaged committed shard is known by its name (preprocessing/contract/integrity.py).

Cut short: the loader, evaluation's shard read and batch inference's map task raise
ShardDamaged naming the version, the shard and both sizes before decoding a byte.
Flipped bytes inside a data page's values (same size): an error naming the shard and the
row group, with `read.verify: size` (page checksums) and `sha256`, never wrong rows.
`ballast verify` exits 0 on a whole version and 1 on a damaged one, naming the shard.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.cli.main import main
from preprocessing.contract.integrity import ShardDamaged, read_shard_table, split_shards
from preprocessing.contract.manifest import ShardEntry, read_manifest, shard_uri
from preprocessing.contract.shards import write_shard
from preprocessing.driver.map_files import listed_shards, map_file
from training.config import LoaderConfig
from training.data.loader import ShardStream
from training.data.readahead import ReadConfig


def stream_ids(root: str, verify: str) -> list[int]:
    read = ReadConfig(prefetch_row_groups=2, verify=verify)  # type: ignore[arg-type]
    stream = ShardStream(root, "train", LoaderConfig(batch_size=8), seed=4, read=read)
    return [i for batch in stream for i in batch["id"].tolist()]


def first_shard(root: str) -> tuple[ShardEntry, Path, str]:
    manifest, location = read_manifest(root)
    entry = manifest.split("train").shards[0]
    return entry, Path(shard_uri(location, entry)), manifest.version_id


def cut_to_two_thirds(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    return len(data), len(data) * 2 // 3


def flip_in_values(path: Path, group: int, column: str = "features") -> None:
    """Flip one byte near the end of a column chunk's last data page: past its page header
    (headers open a page), inside the encoded values."""
    metadata = pq.read_metadata(path).row_group(group)
    chunk = next(
        metadata.column(i)
        for i in range(metadata.num_columns)
        if metadata.column(i).path_in_schema.startswith(column)
    )
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    offset = start + chunk.total_compressed_size - 16  # the chunk's pages end there
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x5A
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("verify", ["size", "sha256"])
def test_cut_shard_names_version_shard_and_sizes(
    make_dataset: Callable[..., str], verify: str
) -> None:
    """A shard cut to 2/3 fails the loader with ShardDamaged naming the version, the shard
    and both sizes (not pyarrow's 'magic bytes not found')."""
    root = make_dataset(120, num_shards=2, row_group_size=16)
    entry, path, version = first_shard(root)
    whole, cut = cut_to_two_thirds(path)
    with pytest.raises(ShardDamaged) as raised:
        stream_ids(root, verify)
    message = str(raised.value)
    assert f"version {version}" in message and entry.path in message
    assert f"{cut} bytes" in message and str(whole) in message


@pytest.mark.parametrize("verify", ["size", "sha256"])
def test_flipped_value_bytes_name_shard_and_row_group(
    make_dataset: Callable[..., str], verify: str
) -> None:
    """Flipped bytes inside a data page's values, same file size: without page checksum
    verification pyarrow would serve other rows; the loader raises ShardDamaged naming
    the shard and the row group instead."""
    root = make_dataset(120, num_shards=2, row_group_size=16)
    entry, path, version = first_shard(root)
    before = pq.ParquetFile(path).read_row_group(1)
    flip_in_values(path, group=1)
    assert not pq.ParquetFile(path).read_row_group(1).equals(before)  # the flip hit values
    with pytest.raises(ShardDamaged) as raised:
        stream_ids(root, verify)
    message = str(raised.value)
    assert entry.path in message and "row group 1" in message and version in message


def test_verify_none_skips_the_size_check(make_dataset: Callable[..., str]) -> None:
    """`read.verify: none` opens a cut shard without the check: pyarrow's own error."""
    root = make_dataset(120, num_shards=2, row_group_size=16)
    cut_to_two_thirds(first_shard(root)[1])
    with pytest.raises(Exception) as raised:
        stream_ids(root, "none")
    assert not isinstance(raised.value, ShardDamaged)


def test_evaluation_and_batch_inference_reads_check_the_size(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """Evaluation's whole-shard read and batch inference's map task refuse a cut shard of
    an input version with ShardDamaged naming it and both sizes; whole shards read."""
    root = make_dataset(120, holdout_rows=40, num_shards=2, row_group_size=16)
    refs = split_shards(root, "train")
    assert read_shard_table(refs[1]).num_rows == refs[1].entry.num_rows
    whole, cut = cut_to_two_thirds(Path(refs[0].uri))
    with pytest.raises(ShardDamaged, match=f"{cut} bytes.*{whole}"):
        read_shard_table(refs[0])
    inputs = [ref.uri for ref in refs]
    listed = listed_shards(inputs)
    assert [ref.entry if ref else None for ref in listed] == [ref.entry for ref in refs]
    with pytest.raises(ShardDamaged, match=refs[0].entry.path):
        map_file(inputs[0], str(tmp_path / "out.parquet"), listed[0], lambda t: t, "label", 16)


def test_evaluation_read_names_the_flipped_row_group(make_dataset: Callable[..., str]) -> None:
    """A whole-shard read (evaluation) of a shard with flipped value bytes names the row
    group whose page checksum fails."""
    root = make_dataset(120, num_shards=2, row_group_size=16)
    ref = split_shards(root, "train")[0]
    flip_in_values(Path(ref.uri), group=2)
    with pytest.raises(ShardDamaged, match="row group 2"):
        read_shard_table(ref)


def test_reshard_writer_writes_page_checksums(tmp_path: Path) -> None:
    """The shard writer of every version writer (preprocessing/contract/shards.py) sets page
    checksums: a flip in a data page's values of its output is a checksum error, not other
    rows."""
    rng = np.random.default_rng(0)
    flat = pa.array(rng.random(64 * 8, dtype=np.float32))
    table = pa.table(
        {
            "id": pa.array(np.arange(64)),
            "label": pa.array(["a", "b"] * 32),
            "source": pa.array(["s"] * 64),
            "features": pa.FixedSizeListArray.from_arrays(flat, 8),
        }
    )
    write_shard(str(tmp_path / "shard.parquet"), table, 32, "label", "source")
    data = bytearray((tmp_path / "shard.parquet").read_bytes())
    chunk = pq.ParquetFile(pa.BufferReader(bytes(data))).metadata.row_group(0).column(3)
    assert not chunk.has_dictionary_page  # so its data page ends the chunk
    data[chunk.data_page_offset + chunk.total_compressed_size - 16] ^= 0x5A
    with pytest.raises(OSError, match="CRC checksum verification failed"):
        pq.ParquetFile(
            pa.BufferReader(bytes(data)), page_checksum_verification=True
        ).read_row_group(0)


def test_ballast_verify_exit_status(
    make_dataset: Callable[..., str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`ballast verify` exits 0 on a whole version (also --deep) and 1 once a shard is
    damaged, naming the version and the shard; --deep names the flipped row group."""
    root = make_dataset(120, holdout_rows=40, num_shards=2, row_group_size=16)
    assert main(["verify", root]) == 0 and main(["verify", root, "--deep"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("whole")
    entry, path, version = first_shard(root)
    flip_in_values(path, group=1)
    assert main(["verify", root, "--version", version]) == 1
    out = capsys.readouterr().out
    assert f"DAMAGED version {version} shard {entry.path}: sha256" in out
    assert main(["verify", root, "--deep"]) == 1
    assert "row group 1 does not decode" in capsys.readouterr().out
    cut_to_two_thirds(path)
    assert main(["verify", root, "--deep"]) == 1
    assert "bytes, the manifest records" in capsys.readouterr().out
