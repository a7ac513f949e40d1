"""Fuzzed readers: mutated manifests, configs and staged objects end cleanly.

Property tests (hypothesis, bounded examples) feed the manifest reader
(`read_manifest`), the config loaders (`load_config` of a `ReshardConfig`, `load_train_config`)
and the staged-object reader (`read_destinations` + `read_batches` or `destination_batches`)
inputs made from a valid one by truncation, flipped bytes, values of the wrong type, huge
numbers and deep nesting. The only outcomes allowed: a clean result or the reader's own
error type with a message; never another exception, a hang (each example runs under an
alarm) or a path outside the root.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preprocessing.config import ReshardConfig
from preprocessing.contract.lineage import Delta, InputRecord
from preprocessing.contract.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestError,
    ShardEntry,
    SplitEntry,
    read_manifest,
    shard_uri,
)
from preprocessing.exchange.staged_objects import (
    StagedObject,
    StagedObjectError,
    StagedWriter,
    destination_batches,
    read_batches,
    read_destinations,
)
from preprocessing.toolbox.config_files import ConfigFileError, load_config
from training.config import load_train_config

FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
ALARM_S = 10


@contextmanager
def no_hang(seconds: int = ALARM_S) -> Iterator[None]:
    """Fail an example that runs past `seconds` (a hang) instead of blocking the suite."""

    def expire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"reader still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def entry(index: int, version: str | None = None) -> ShardEntry:
    return ShardEntry(
        path=f"shard-{index:05d}.parquet",
        num_rows=100,
        num_bytes=4096,
        num_row_groups=4,
        rows_per_row_group=25,
        sha256=f"{index:064x}",
        class_counts={"a": 60, "b": 40},
        source_counts={"s": 100},
        version=version,
    )


def sample_manifest() -> Manifest:
    """A chain's child: one shard of its own, one held by its parent."""
    deltas = [
        Delta("parent1", None, "2026-01-01T00:00:00+00:00", 1, 10, 1),
        Delta("child1", "parent1", "", 1, 10, 1, {"train": [["a", "s", 5, 5]]}),
    ]
    return Manifest(
        version_id="child1",
        label_column="label",
        source_column="source",
        id_column="id",
        feature_columns=["features"],
        classes=["a", "b"],
        sources=["s"],
        arrow_schema=[{"name": "id", "type": "int64"}],
        splits={"train": SplitEntry(200, [entry(0, "parent1"), entry(1)])},
        seed=3,
        config={"k": [1, 2]},
        input_fingerprint="f",
        input_class_counts={"a": 1},
        input_source_counts={"s": 1},
        created_at="2026-01-02T00:00:00+00:00",
        parent_version="parent1",
        inputs=[InputRecord("/in/a.parquet", 10, "t", [0, 9])],
        deltas=deltas,
    )


# Raw JSON text put in place of a value: numbers no int64 holds (or no Python int parses
# without raising the digit limit), and nesting deeper than the parser's recursion.
HUGE = st.sampled_from(
    [
        "1" + "0" * 30,
        "-1" + "0" * 30,
        "9223372036854775808",
        "-1",
        "1e999",
        "1e308",
        "1" + "0" * 5000,
    ]
)
DEEP = st.sampled_from(["[" * n + "1" + "]" * n for n in (100, 2_000, 20_000)])
HOLE = "\u0000hole\u0000"
WRONG = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=8),
    st.just([]),
    st.just({}),
    st.just([[1]]),
    st.just("../../../etc/passwd"),
    st.just("/etc/passwd"),
)


def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path (keys and list indices) into a JSON value."""
    paths = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            paths += json_paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            paths += json_paths(item, (*prefix, index))
    return paths


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = replaced(value[path[0]], path[1:], new)
    return copy


def mutated_text(draw: st.DrawFn, text: str, as_object: Any) -> bytes:
    """One mutation of a document: truncated, a flipped byte, a value replaced by one of
    the wrong type, a huge number or deep nesting, or the whole nested deeply."""
    kind = draw(st.sampled_from(["truncate", "flip", "wrong", "huge", "deep", "wrap"]))
    data = text.encode()
    if kind == "truncate":
        return data[: draw(st.integers(0, len(data) - 1))]
    if kind == "flip":
        at, bit = draw(st.integers(0, len(data) - 1)), draw(st.integers(0, 7))
        return data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1 :]
    if kind == "wrap":
        depth = draw(st.sampled_from([50, 5_000, 20_000]))
        return b"[" * depth + data + b"]" * depth
    path = draw(st.sampled_from(json_paths(as_object)))
    if kind == "wrong":
        return json.dumps(replaced(as_object, path, draw(WRONG))).encode()
    raw = draw(HUGE if kind == "huge" else DEEP)
    return json.dumps(replaced(as_object, path, HOLE)).replace(json.dumps(HOLE), raw).encode()


@st.composite
def manifest_bytes(draw: st.DrawFn) -> bytes:
    manifest = sample_manifest()
    return mutated_text(draw, manifest.to_json(), json.loads(manifest.to_json()))


def inside(root: Path, uri: str) -> bool:
    return os.path.realpath(uri).startswith(os.path.realpath(root) + os.sep)


@FUZZ
@given(data=manifest_bytes())
def test_mutated_manifest_reads_or_fails_with_manifest_error(tmp_path: Path, data: bytes) -> None:
    """A mutated manifest is read (every shard it names inside the root, its row groups
    as many as it says) or refused with a ManifestError with a message."""
    directory = tmp_path / "v-child1"
    directory.mkdir(exist_ok=True)
    (directory / MANIFEST_NAME).write_bytes(data)
    with no_hang():
        try:
            manifest, location = read_manifest(str(directory))
        except ManifestError as error:
            assert str(error)
            return
        for split in manifest.splits.values():
            for shard in split.shards:
                assert inside(tmp_path, shard_uri(location, shard))
                assert len(shard.row_group_sizes()) == shard.num_row_groups


RESHARD = {
    "dataset": {"inputs": ["/in"], "label_column": "label"},
    "output_root": "/out",
    "target_shard_rows": 1000,
    "rows_per_row_group": 100,
    "holdout_fraction": 0.1,
    "seed": 3,
}
TRAIN = {
    "dataset": "/out",
    "max_epochs": 1,
    "loader": {"batch_size": 16},
    "read": {"verify": "size", "prefetch_row_groups": 2},
}


@st.composite
def config_bytes(draw: st.DrawFn, base: dict[str, Any]) -> bytes:
    return mutated_text(draw, yaml.safe_dump(base), base)


def check_config(path: Path, load: Callable[[Path], Any]) -> None:
    """`load(path)`: a config, or a ValueError (ValidationError naming the field, or
    ConfigFileError naming the file) with a message; nothing else."""
    with no_hang():
        try:
            load(path)
        except ValueError as error:  # pydantic's ValidationError and ConfigFileError
            assert str(error)
            if isinstance(error, ConfigFileError):
                assert str(path) in str(error)


@FUZZ
@given(data=config_bytes(RESHARD))
def test_mutated_reshard_config_loads_or_names_the_problem(tmp_path: Path, data: bytes) -> None:
    """A mutated reshard config loads or fails with a ValueError that has a message."""
    path = tmp_path / "reshard.yaml"
    path.write_bytes(data)
    check_config(path, lambda location: load_config(ReshardConfig, location))


@FUZZ
@given(data=config_bytes(TRAIN))
def test_mutated_train_config_loads_or_names_the_problem(tmp_path: Path, data: bytes) -> None:
    """A mutated training config loads or fails with a ValueError that has a message."""
    path = tmp_path / "train.yaml"
    path.write_bytes(data)
    check_config(path, load_train_config)


SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string())])


@pytest.fixture(scope="module")
def staged_bytes(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A valid staged object of 4 destinations (one empty) written by StagedWriter."""
    path = tmp_path_factory.mktemp("staged") / "object"
    writer = StagedWriter(StagedObject(str(path), 10, 4), SCHEMA)
    for rows in (3, 0, 5, 2):
        ids = np.arange(rows)
        writer.add_batches(
            [pa.record_batch([pa.array(ids), pa.array([f"n{i}" for i in ids])], schema=SCHEMA)]
            if rows
            else []
        )
    writer.close()
    return path.read_bytes()


@st.composite
def staged_mutation(draw: st.DrawFn, data: bytes) -> bytes:
    kind = draw(st.sampled_from(["truncate", "flip", "flip_index", "huge_index"]))
    if kind == "truncate":
        return data[: draw(st.integers(0, len(data) - 1))]
    at = draw(
        st.integers(0, 16 + 5 * 8 - 1) if kind == "flip_index" else st.integers(0, len(data) - 1)
    )
    if kind == "huge_index":
        at = 16 + 8 * draw(st.integers(0, 4))
        value = draw(st.sampled_from([2**62, -(2**62), len(data) + 1, 0, 15]))
        return data[:at] + np.int64(value).tobytes() + data[at + 8 :]
    return data[:at] + bytes([data[at] ^ (1 << draw(st.integers(0, 7)))]) + data[at + 1 :]


@FUZZ
@given(st.data())
def test_mutated_staged_object_reads_or_fails_with_its_error(
    tmp_path: Path, staged_bytes: bytes, data: st.DataObject
) -> None:
    """A mutated staged object yields record batches of the schema whose buffers fit
    their lengths for every destination, or fails with StagedObjectError naming the
    object (a flipped value byte may pass: staged objects carry no checksums)."""
    path = tmp_path / "object"
    path.write_bytes(data.draw(staged_mutation(staged_bytes)))
    staged = StagedObject(str(path), 10, 4)
    with no_hang():
        try:
            raw, offsets = read_destinations(staged, 10, 14)
            for batches in destination_batches(raw, offsets, SCHEMA, str(path)):
                for batch in batches:  # the one-pass reader of write tasks: the same checks
                    batch.validate()
                    assert batch.schema.equals(SCHEMA)
            for index in range(4):
                for batch in read_batches(
                    raw[offsets[index] : offsets[index + 1]], SCHEMA, str(path)
                ):
                    batch.validate()  # buffers fit the lengths: nothing reads past them
                    assert batch.schema.equals(SCHEMA)
        except StagedObjectError as error:
            assert str(path) in str(error)
