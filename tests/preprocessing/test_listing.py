"""The inputs are listed once per reshard: the caller that needs the version id first (the
flow, for its cache key) lists them and hands the listing to `run_reshard`, which lists
nothing again (at a petabyte a listing takes minutes and costs requests)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs

import fsspec
import pytest

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import list_once, run_reshard, version_id_for
from tests.preprocessing.s3_requests import Request, RequestLog, counted_s3

BUCKET = "listed-once"


def input_listings(log: RequestLog) -> list[Request]:
    """The LIST requests (ListObjects, either version) of the bucket's `raw/` prefix."""
    return [
        r
        for r in log.requests
        if r.method == "GET"
        and r.path.strip("/") == BUCKET
        and parse_qs(r.query).get("prefix", [""])[0].startswith("raw")
    ]


@pytest.mark.slow
def test_a_reshard_lists_its_inputs_once(tiny_raw: Path, s3_endpoint: str) -> None:
    """Invariants: listing the inputs, naming the version and making it issue one LIST of
    the input prefix in all; a run without a listing lists them itself (so the count sees
    a listing when there is one); the version made is the one named."""
    with counted_s3() as log:
        fs = fsspec.filesystem("s3")
        fs.mkdir(BUCKET)  # its own bucket: the exchange's request test uses `counted`
        fs.put(f"{tiny_raw}/", f"{BUCKET}/raw/", recursive=True)
        config = ReshardConfig(
            dataset=DatasetSpec(inputs=[f"s3://{BUCKET}/raw/*.parquet"]),
            output_root=f"s3://{BUCKET}/out",
            target_shard_rows=300,
            num_workers=1,
        )
        # s3fs keeps listings it made: forgotten, so every listing below reaches the store.
        fs.invalidate_cache()
        log.clear()
        listing = list_once(config)
        version_id = version_id_for(config, listing)
        fs.invalidate_cache()  # as in another process: a listing again would reach the store
        result = run_reshard(config, listing=listing)
        listed_once = len(input_listings(log))
        fs.invalidate_cache()
        log.clear()
        again = run_reshard(config)
        listed_again = len(input_listings(log))
    assert listed_once == 1, listed_once
    assert listed_again >= 1
    assert result.manifest.version_id == version_id == again.manifest.version_id
    assert again.reused
