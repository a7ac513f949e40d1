"""Manifests and `_CURRENT` are untrusted input: a tampered one fails with a ManifestError
naming the bad value before anything is read, in `read_manifest` and in the loader."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.contract.manifest import (
    CURRENT_NAME,
    MANIFEST_NAME,
    ManifestError,
    ShardEntry,
    check_entry,
    read_current_version,
    read_manifest,
)
from tests.preprocessing import version_writer
from training.config import LoaderConfig
from training.data.cache import ShardCache
from training.data.loader import ShardStream
from training.data.readahead import ReadConfig

WRITER = Path(__file__).with_name("version_writer.py")
VERSION = "v1"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A committed two-shard version written by the real commit path, copied per test
    (the commit tests' writer, run in this process: these tests start no process)."""
    root = tmp_path_factory.mktemp("pristine") / "root"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", [str(WRITER), str(root), VERSION])
        assert version_writer.main() == 0
    return root


@pytest.fixture
def root(pristine: Path, tmp_path: Path) -> Path:
    """A private copy three levels below `tmp_path`, so `../../../x` from the version
    directory lands at `tmp_path / 'x'`."""
    copy = tmp_path / "a" / "b"
    shutil.copytree(pristine, copy)
    return copy


def unread_probe(path: Path) -> Callable[[], bool]:
    """`path` with an access time before its modification time, so that (with relatime or
    strictatime) any read moves it; returns whether the file is still unread. Where the
    filesystem does not record reads at all, it always answers True."""
    os.utime(path, (1, time.time()))
    return lambda: os.stat(path).st_atime == 1


def records_reads(directory: Path) -> bool:
    control = directory / "control"
    control.write_bytes(b"x")
    probe = unread_probe(control)
    control.read_bytes()
    return not probe()


def outside_file(tmp_path: Path) -> Path:
    """A real Parquet file outside the dataset root that a hostile manifest points at."""
    path = tmp_path / "outside.parquet"
    pq.write_table(pa.table({"id": [1], "label": [0], "x": pa.array([1.0], pa.float32())}), path)
    return path


def files_in(directory: Path) -> list[Path]:
    return sorted(directory.rglob("*")) if directory.exists() else []


def tamper(root: Path, change: Callable[[dict], None]) -> None:
    path = root / f"v-{VERSION}" / MANIFEST_NAME
    raw = json.loads(path.read_text())
    change(raw)
    path.write_text(json.dumps(raw))


def open_stream(root: Path, cache: Path) -> ShardStream:
    read = ReadConfig(cache_dir=str(cache), cache_bytes=2**20)
    return ShardStream(str(root), "train", LoaderConfig(batch_size=10), seed=0, read=read)


def test_untampered_copy_loads(root, tmp_path) -> None:
    """Control: the copy the hostile cases start from loads whole through the cache."""
    stream = open_stream(root, tmp_path / "cache")
    assert sum(len(batch["id"]) for batch in stream) == 100
    assert len(list((tmp_path / "cache").glob("*.parquet"))) == 2


def set_shard(field: str, value: str) -> Callable[[dict], None]:
    def change(raw: dict) -> None:
        raw["splits"]["train"]["shards"][0][field] = value

    return change


HOSTILE = {
    "parent path": (set_shard("path", "../../../outside.parquet"), "outside.parquet"),
    "absolute path": (set_shard("path", "/etc/passwd"), "/etc/passwd"),
    "absolute path to a real file": (None, "outside.parquet"),
    "other scheme": (set_shard("path", "s3://other/x"), "s3://other/x"),
    "split directory, then up": (
        set_shard("path", "split=train/../../../outside.parquet"),
        "split=train/../../../outside.parquet",
    ),
    "split named up": (set_shard("path", "split=../outside.parquet"), "split=../outside"),
    "a directory that is no split's": (set_shard("path", "a/outside.parquet"), "a/outside"),
    "another split's directory": (
        set_shard("path", "split=holdout/train-00000.parquet"),
        "is in another split",
    ),
    "digest with separators": (set_shard("sha256", "../../../outside"), "sha256"),
    "version id of another directory": (lambda raw: raw.update(version_id="v2"), "'v2'"),
    "version id with separators": (lambda raw: raw.update(version_id="v1/../v1"), "v1/../v1"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_manifest_fails_before_any_read(root, tmp_path, case) -> None:
    """Fault: the committed manifest is rewritten by hand (`case`). Invariants: both
    `read_manifest` and the loader raise ManifestError naming the bad value; the cache
    stays empty; the file outside the root is never read."""
    outside = outside_file(tmp_path)
    change, named = HOSTILE[case]
    tamper(root, change or set_shard("path", str(outside)))
    still_unread = unread_probe(outside)
    with pytest.raises(ManifestError, match=re.escape(named)):
        read_manifest(str(root))
    with pytest.raises(ManifestError, match=re.escape(named)):
        open_stream(root, tmp_path / "cache")
    assert files_in(tmp_path / "cache") == []
    if records_reads(tmp_path):
        assert still_unread(), f"{outside} was read"


def test_hostile_current_pointer_is_refused(root, tmp_path) -> None:
    """Fault: `_CURRENT` rewritten to `<id>/../../x`. Invariant: reading the root (through
    `read_current_version`, `read_manifest` and the loader) raises ManifestError naming
    the pointer and its content; nothing outside is followed."""
    (root / CURRENT_NAME).write_text(f"{VERSION}/../../x\n")
    for read in (read_current_version, read_manifest):
        with pytest.raises(ManifestError, match=r"_CURRENT: 'v1/\.\./\.\./x' is not a version"):
            read(str(root))
    with pytest.raises(ManifestError, match="_CURRENT"):
        open_stream(root, tmp_path / "cache")


def test_cache_names_files_by_validated_digests_only(tmp_path) -> None:
    """Fault: a shard entry built in code with a digest that is a path. Invariant: the
    cache refuses to name a file by it (ManifestError) and writes nothing anywhere."""
    target = tmp_path / "escaped"
    entry = ShardEntry("shard-00000.parquet", 1, 1, 1, 1, f"../{target.name}", {}, {})
    cache = ShardCache(str(tmp_path / "cache"), 2**20)
    with pytest.raises(ManifestError, match="not 64 lowercase hex digits"):
        cache.open(str(tmp_path / "source.parquet"), entry)
    assert not list(tmp_path.glob("escaped*")) and files_in(tmp_path / "cache") == []


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="split=/.abc_-\\:0", max_size=40))
def test_an_accepted_shard_path_stays_in_its_version_directory(path: str) -> None:
    """Invariant over hostile paths: a shard path `check_entry` accepts is a file name, or
    one under a `split=<name>/` directory, with no `..`, so it resolves inside the version
    directory; anything else is a ManifestError naming the path."""
    entry = ShardEntry(path, 1, 1, 1, 1, "0" * 64, {}, {})
    try:
        check_entry(entry, "m")
    except ManifestError as error:
        assert repr(path) in str(error)
        return
    *folders, name = path.split("/")
    assert ".." not in path and name and len(folders) <= 1
    assert all(re.fullmatch(r"split=[A-Za-z0-9_-]+", folder) for folder in folders)
    resolved = os.path.normpath(f"/root/v-x/{path}")
    assert resolved.startswith("/root/v-x/") and resolved.endswith(name)
