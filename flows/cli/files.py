"""`ballast files ROOT [--split train] [--version ID]`: the exact shard URIs of a version.

One URI a line, in the manifest's order, each in the directory that holds it (a chain's
child lists its ancestors' shards where they are), for readers that take a file list:

    ballast files data/datasets --split train > train.txt
    python -c "import datasets; datasets.load_dataset('parquet',
        data_files=open('train.txt').read().split())"
"""

from __future__ import annotations

import argparse
import os


def add_files_command(commands: argparse._SubParsersAction) -> None:
    """Register `files` with the CLI's sub-commands."""
    files = commands.add_parser("files", help="print the shard URIs of a version, one a line")
    files.add_argument("root", help="the output root of the dataset")
    files.add_argument(
        "--split", help="only this split (train, holdout, validation); default: every split"
    )
    files.add_argument("--version", help="the version (default: the one _CURRENT names)")


def list_files(root: str, split: str | None = None, version: str | None = None) -> str:
    """The shard URIs of `version` (default `_CURRENT`'s) of `root`, one a line; a local
    root's as absolute paths."""
    from fsspec.core import url_to_fs  # here: `ballast --help` loads no storage library

    from preprocessing.contract.manifest import is_local, manifest_uri, read_manifest, shard_uri

    fs, path = url_to_fs(root.rstrip("/"))
    if is_local(fs):
        root = os.path.abspath(path)
    manifest, location = read_manifest(manifest_uri(root, version) if version else root)
    splits = [manifest.split(split)] if split else list(manifest.splits.values())
    return "\n".join(shard_uri(location, entry) for entries in splits for entry in entries.shards)
