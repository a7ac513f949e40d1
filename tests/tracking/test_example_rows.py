"""The input example logged with a model is read from the version's first train shard
through the contract's integrity reader (tracking/lifecycle/registry.py `example_rows`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from preprocessing.contract.codec import FeatureCodec
from preprocessing.contract.integrity import ShardDamaged
from preprocessing.contract.manifest import read_manifest, shard_uri
from tests.training.conftest import write_dataset
from tracking.run.model import NUM_EXAMPLE_ROWS, example_rows


def test_example_rows_of_a_cut_short_shard_name_the_shard_and_both_sizes(tmp_path: Path) -> None:
    """Invariant: the example rows come from a whole first train shard; once that shard
    is cut to 2/3 of its size, reading them is ShardDamaged naming the version, the shard
    and both sizes (the manifest's size check), not pyarrow's footer error."""
    manifest, location = read_manifest(write_dataset(tmp_path / "data", 60, num_shards=2))
    codec = FeatureCodec.from_manifest(manifest)
    assert len(example_rows(manifest, location, codec)) == NUM_EXAMPLE_ROWS
    first = manifest.split("train").shards[0]
    path = Path(shard_uri(location, first))
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) * 2 // 3])
    with pytest.raises(ShardDamaged) as raised:
        example_rows(manifest, location, codec)
    message = str(raised.value)
    assert f"version {manifest.version_id}" in message and first.path in message
    assert f"{len(whole) * 2 // 3} bytes" in message and str(len(whole)) in message
