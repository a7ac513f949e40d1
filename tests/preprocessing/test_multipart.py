"""Large objects go to S3 (moto's server on loopback) as multipart uploads in parts of the
configured size, small ones in one PUT, and either reads back byte for byte; the part
size is a checked setting that never changes a version id."""

from __future__ import annotations

import fsspec
import numpy as np
import pyarrow as pa
import pytest
from pydantic import ValidationError

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.exchange.staged_objects import (
    StagedObject,
    StagedWriter,
    read_batches,
    read_destinations,
)
from preprocessing.storage.objects import MIN_PART_BYTES, write_object
from tests.preprocessing.s3_requests import Request, counted_s3


def uploads_of(requests: list[Request], key: str) -> tuple[int, list[int], int, int]:
    """(multipart starts, bytes of each part sent, completions, plain PUTs) for `key`."""
    mine = [r for r in requests if r.path.endswith(key)]
    starts = sum(r.method == "POST" and r.query.startswith("uploads") for r in mine)
    parts = [r.bytes_moved for r in mine if r.method == "PUT" and "partNumber" in r.query]
    completions = sum(r.method == "POST" and "uploadId" in r.query for r in mine)
    plain = sum(r.method == "PUT" and "partNumber" not in r.query for r in mine)
    return starts, parts, completions, plain


def test_an_object_of_twice_the_part_size_goes_up_in_parts() -> None:
    """Invariant: with 5 MiB parts, an object of 10 MiB + 12,345 bytes is one multipart
    upload of three parts (5, 5 MiB and the rest) and one completion, a byte shorter than
    10 MiB is one plain PUT, and both read back equal to what was written."""
    big = np.random.default_rng(0).bytes(2 * MIN_PART_BYTES + 12_345)
    small = big[: 2 * MIN_PART_BYTES - 1]
    with counted_s3() as log:
        fs = fsspec.filesystem("s3")
        fs.mkdir("multipart")
        log.clear()
        write_object(fs, "multipart/big.bin", big, MIN_PART_BYTES)
        write_object(fs, "multipart/small.bin", memoryview(small), MIN_PART_BYTES)
        requests = list(log.requests)
        assert fs.cat_file("multipart/big.bin") == big
        assert fs.cat_file("multipart/small.bin") == small
    starts, parts, completions, plain = uploads_of(requests, "/big.bin")
    assert (starts, completions, plain) == (1, 1, 0)
    assert len(parts) == 3 and min(parts) >= 12_345 and sum(parts) >= len(big)
    assert uploads_of(requests, "/small.bin") == (0, [], 0, 1)


def test_a_large_staged_object_is_a_multipart_upload_read_back_by_range() -> None:
    """Invariant: a staged object of two destinations and about 12 MiB, with the smallest
    part size, is written as a multipart upload, and each destination's ranged read
    gives back exactly the rows written for it."""
    schema = pa.schema([("id", pa.int64()), ("values", pa.list_(pa.float32(), 8))])
    rng = np.random.default_rng(1)
    tables = [
        pa.table(
            [
                pa.array(np.arange(n, dtype=np.int64)),
                pa.FixedSizeListArray.from_arrays(
                    pa.array(rng.standard_normal(8 * n, dtype=np.float32)), 8
                ),
            ],
            schema=schema,
        )
        for n in (150_000, 190_000)
    ]
    with counted_s3() as log:
        fsspec.filesystem("s3").mkdir("staged")
        log.clear()
        staged = StagedObject("s3://staged/round-0/part-0000000.arrow", 4, 2, MIN_PART_BYTES)
        writer = StagedWriter(staged, schema)
        for table in tables:
            writer.add_batches(table.to_batches())
        size = writer.close()
        requests = list(log.requests)
        read = []
        for destination in (4, 5):
            data, offsets = read_destinations(staged, destination, destination + 1)
            read.append(pa.Table.from_batches(read_batches(data[: offsets[1]], schema), schema))
    starts, parts, completions, _ = uploads_of(requests, "/part-0000000.arrow")
    assert size > 2 * MIN_PART_BYTES
    assert (starts, completions) == (1, 1) and len(parts) == 3
    assert [table.equals(back) for table, back in zip(tables, read, strict=True)] == [True, True]


def test_the_part_size_is_checked_and_never_changes_the_version_id() -> None:
    """Invariant: `upload_part_bytes` below S3's 5 MiB part is refused naming the field,
    and another part size leaves the settings a version id hashes unchanged."""
    base = ReshardConfig(dataset=DatasetSpec(inputs=["s3://b/raw"]), output_root="s3://b/out")
    with pytest.raises(ValidationError, match="upload_part_bytes"):
        base.model_validate({**base.model_dump(), "upload_part_bytes": MIN_PART_BYTES - 1})
    other = base.model_copy(update={"upload_part_bytes": MIN_PART_BYTES})
    assert other.output_settings() == base.output_settings()
