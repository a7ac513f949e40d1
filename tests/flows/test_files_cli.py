"""`ballast files ROOT [--split] [--version]` (flows/cli/files.py) on tiny versions written
in this process: the exact shard paths, and bad flags answered naming the flag's value."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli.main import main as ballast
from preprocessing.contract.manifest import read_current_version, shard_name
from preprocessing.versions.attempt import VersionAttempt
from tests.preprocessing.version_writer import manifest_of, write_test_shard


def write_version(root: Path, version_id: str) -> None:
    previous = read_current_version(str(root))
    with VersionAttempt(str(root), version_id) as attempt:
        entries = [
            write_test_shard(attempt.shard_uri(shard_name("train", index)), version_id, index)
            for index in range(2)
        ]
        attempt.commit(manifest_of(version_id, entries), expected=previous)


def test_files_prints_the_absolute_paths_of_current_or_the_named_version(
    tmp_path, monkeypatch, capsys
) -> None:
    """Invariants: a relative root gives absolute paths; without --version the version
    `_CURRENT` names, with it the named one; every printed path is a file."""
    write_version(tmp_path, "a")
    write_version(tmp_path, "b")
    monkeypatch.chdir(tmp_path.parent)
    assert ballast(["files", tmp_path.name, "--split", "train"]) == 0
    current = capsys.readouterr().out.split()
    assert current == [str(tmp_path / "v-b" / shard_name("train", i)) for i in range(2)]
    assert ballast(["files", tmp_path.name, "--version", "a"]) == 0
    older = capsys.readouterr().out.split()
    assert older == [str(tmp_path / "v-a" / shard_name("train", i)) for i in range(2)]
    assert all(Path(path).is_file() for path in current + older)


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--split", "validation"], "no split 'validation'"),
        (["--version", "zz"], "v-zz/_MANIFEST.json: manifest not found"),
        (["--version", "../x"], "'../x' is not a version id"),
    ],
)
def test_files_refuses_a_bad_split_or_version_naming_it(tmp_path, capsys, flags, named) -> None:
    """Invariant: exit status 2 and the bad value in the one-line error."""
    write_version(tmp_path, "a")
    assert ballast(["files", str(tmp_path), *flags]) == 2
    assert named in capsys.readouterr().err
