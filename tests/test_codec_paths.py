"""Property: the feature codec gives bit-identical arrays to the training loader, to
evaluation (tracking.lifecycle.scoring.evaluate_classifier) and inside the registered model
(`CodecClassifier.predict` on a pandas DataFrame of the raw rows), for any mix of column
kinds, widths, nulls and null policies."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec
from preprocessing.contract.codec import FeatureCodec
from preprocessing.contract.manifest import Manifest, ShardEntry, SplitEntry, shard_name
from preprocessing.contract.shards import write_shard
from preprocessing.scan.feature_stats import (
    build_codec,
    drop_row_columns,
    features_record,
    new_profiles,
    null_rows,
    profile_batch,
)
from preprocessing.versions.attempt import VersionAttempt
from tests.feature_data import loader_rows
from tracking.lifecycle.scoring import evaluate_classifier
from tracking.run.pyfunc import CodecClassifier

Maker = Callable[[np.random.Generator, int, np.ndarray], pa.Array]

COLUMNS: dict[str, tuple[Maker, tuple[str, ...]]] = {
    "i8": (
        lambda rng, n, null: pa.array(rng.integers(-128, 127, n), pa.int8(), mask=null),
        ("drop_row", "fill_zero", "fill_mean", "indicator"),
    ),
    "u32": (
        lambda rng, n, null: pa.array(rng.integers(0, 2**32 - 1, n), pa.uint32(), mask=null),
        ("fill_zero", "fill_mean"),
    ),
    "f32": (
        lambda rng, n, null: pa.array(np.where(null, np.nan, rng.normal(0, 1e4, n)), pa.float32()),
        ("drop_row", "fill_mean", "indicator"),
    ),
    "flag": (
        lambda rng, n, null: pa.array(rng.random(n) < 0.5, mask=null),
        ("fill_zero", "indicator"),
    ),
    "day": (
        lambda rng, n, null: pa.array(rng.integers(0, 30_000, n).astype(np.int32), mask=null).cast(
            pa.date32()
        ),
        ("fill_mean",),
    ),
    "at": (
        lambda rng, n, null: pa.array(rng.integers(0, 2**40, n), pa.timestamp("us"), mask=null),
        ("drop_row", "indicator"),
    ),
    "city": (
        lambda rng, n, null: pa.array(rng.choice(["a", "b", "c", "d"], n), mask=null),
        ("drop_row", "fill_zero"),
    ),
    "tokens": (
        lambda rng, n, null: pa.array(
            [None if z else rng.integers(0, 500, rng.integers(0, 6)).tolist() for z in null],
            pa.list_(pa.int16()),
        ),
        ("drop_row", "fill_zero"),
    ),
    "emb": (
        lambda rng, n, null: pa.FixedSizeListArray.from_arrays(
            pa.array(rng.normal(size=3 * n), pa.float32(), mask=np.repeat(null, 3)), 3
        ),
        ("fill_zero",),
    ),
}


@st.composite
def datasets(draw: st.DrawFn) -> tuple[pa.Table, dict[str, str], int | None]:
    """A table of 1-60 rows with 1-5 feature columns, nulls in some, a policy for each."""
    names = draw(st.lists(st.sampled_from(sorted(COLUMNS)), min_size=1, max_size=5, unique=True))
    num_rows = draw(st.integers(1, 60))
    null_fraction = draw(st.sampled_from([0.0, 0.25, 0.7]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    columns = {
        "id": pa.array(rng.permutation(10 * num_rows)[:num_rows]),
        "label": pa.array(rng.integers(0, 3, num_rows)),
    }
    for name in names:
        columns[name] = COLUMNS[name][0](rng, num_rows, rng.random(num_rows) < null_fraction)
    policies = {name: draw(st.sampled_from(COLUMNS[name][1])) for name in names}
    sequence_length = draw(st.one_of(st.none(), st.integers(1, 8)))
    return pa.table(columns), policies, sequence_length


def write_version(root: Path, table: pa.Table, spec: DatasetSpec) -> tuple[str, FeatureCodec]:
    """A committed version of `table`'s kept rows (2 shards, row groups of 7 rows) whose
    codec is built from the rows' profiles, as the reshard builds it."""
    profiles = new_profiles(table.schema, spec.feature_columns)
    kept = ~null_rows(table, drop_row_columns(spec))
    for batch in table.to_batches():
        profile_batch(profiles, batch, kept[: batch.num_rows])
    codec = build_codec(profiles, {name: ["generated"] for name in profiles}, spec)
    rows = table.filter(pa.array(kept))
    half = -(-rows.num_rows // 2)
    with VersionAttempt(str(root), "prop") as attempt:
        entries = [
            write_shard(attempt.shard_uri(shard_name("train", index)), part, 7, "label")
            for index, part in enumerate([rows.slice(0, half), rows.slice(half)])
        ]
        attempt.commit(prop_manifest(table.schema, spec, rows.num_rows, entries, codec))
    return str(root), codec


def prop_manifest(
    schema: pa.Schema,
    spec: DatasetSpec,
    num_rows: int,
    entries: list[ShardEntry],
    codec: FeatureCodec,
) -> Manifest:
    return Manifest(
        version_id="prop",
        label_column="label",
        source_column="source",
        id_column="id",
        feature_columns=spec.feature_columns,
        classes=[0, 1, 2],
        sources=[],
        arrow_schema=[{"name": f.name, "type": str(f.type)} for f in schema],
        splits={"train": SplitEntry(num_rows, entries)},
        seed=0,
        config={},
        input_fingerprint="generated",
        input_class_counts={},
        input_source_counts={},
        features=features_record(codec, {}),
    )


class RecordingNetwork(torch.nn.Module):
    """Keeps every matrix it is given; answers class 0 for every row."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[np.ndarray] = []

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        self.inputs.append(features.numpy().copy())
        return torch.zeros(len(features), 3)


def seen_rows(network: RecordingNetwork, ids: list[int]) -> dict[int, np.ndarray]:
    """The rows the network was given, by id (`ids` in the order they were passed)."""
    matrix = np.concatenate(network.inputs)
    network.inputs.clear()
    return dict(zip(ids, matrix, strict=True))


# Found by the property: raw rows whose sequence column holds only nulls reach the model
# as a pandas column that Arrow types as null.
ALL_NULL_SEQUENCE = (
    pa.table(
        {
            "id": pa.array([8], pa.int64()),
            "label": pa.array([0], pa.int64()),
            "at": pa.array([590_000_000_000], pa.timestamp("us")),
            "tokens": pa.array([None], pa.list_(pa.int16())),
        }
    ),
    {"at": "drop_row", "tokens": "fill_zero"},
    None,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(datasets())
@example(ALL_NULL_SEQUENCE)
def test_loader_evaluation_and_raw_rows_encode_identically(
    dataset: tuple[pa.Table, dict[str, str], int | None],
) -> None:
    """Property: for every kept row, the loader's features, evaluation's features and the
    codec on the raw input row are the same float32 bits."""
    table, policies, sequence_length = dataset
    spec = DatasetSpec(
        inputs=["generated"],
        feature_columns=list(policies),
        nulls=policies,
        sequence_length=sequence_length,
    )
    dropped = null_rows(table, drop_row_columns(spec))
    assume(not dropped.all())
    kept = table.filter(pa.array(~dropped))  # the raw rows a version holds
    with tempfile.TemporaryDirectory() as work:
        root, codec = write_version(Path(work), table, spec)
        loaded = loader_rows(root, "train")
        network = RecordingNetwork()
        model = CodecClassifier(network, codec, ["0", "1", "2"])
        evaluate_classifier(model, root, "train")
        shard_ids = [row_id for shard in split_ids(root) for row_id in shard]
        evaluated = seen_rows(network, shard_ids)
    model.predict(None, kept.to_pandas())
    served = seen_rows(network, kept.column("id").to_pylist())
    assert set(loaded) == set(evaluated)
    for row_id, (features, _) in loaded.items():
        assert features.dtype == np.float32 and features.shape == (codec.width,)
        assert features.tobytes() == evaluated[row_id].tobytes() == served[row_id].tobytes()


def split_ids(root: str) -> list[list[int]]:
    """The ids of each train shard of the version, in shard order."""
    from preprocessing.contract.manifest import read_manifest, shard_uri

    manifest, location = read_manifest(root)
    return [
        pq.read_table(shard_uri(location, entry)).column("id").to_pylist()
        for entry in manifest.split("train").shards
    ]
