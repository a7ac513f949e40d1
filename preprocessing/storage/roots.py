"""Input roots and the output root kept apart, and ballast's own output left out of a
listing.

An output root inside an input root (or the reverse) makes the next run read its own
shards as inputs (`6 of 11 input files rejected ... duplicate ids`), so a config with one
is refused before any work (`overlap_problem`, read by ReshardConfig). A root compares
by its protocol and the directory before its first glob character, resolved when local
(symbolic links followed); no file is read.

`ballast_outputs` finds, among the files listed under a directory input, the
directories ballast wrote (an output root holds `_CURRENT` or `_staging/`; a version
directory `v-<id>/` holds its manifest): the listing skips them, so an input root that
merely contains an old output (written before the refusal, or by hand) is not read as
data. A glob input is taken as written.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

GLOB_CHARS = frozenset("*?[")
# contract.manifest's CURRENT_NAME and MANIFEST_NAME, versions.attempt's STAGING_DIR: not
# imported, as the pure plan imports the config, which reads this module (a test checks).
OWN_MARKERS = ("_CURRENT", "_MANIFEST.json")
STAGING_NAME = "_staging"


def overlap_problem(output_root: str, inputs: Iterable[str]) -> str:
    """Why `output_root` and `inputs` are not kept apart, naming both; "" when they are."""
    output = _root_key(output_root)
    for index, root in enumerate(inputs):
        key = _root_key(root)
        if key[0] != output[0]:
            continue
        if _within(output[1], key[1]):
            return (
                f"output_root {output_root} is inside dataset.inputs[{index}] {root}: "
                f"a later run would read its own shards as inputs; write it elsewhere"
            )
        if _within(key[1], output[1]):
            return (
                f"dataset.inputs[{index}] {root} is inside output_root {output_root}: "
                f"a run would read shards of earlier versions as inputs"
            )
    return ""


def ballast_outputs(paths: Iterable[str], root: str) -> set[str]:
    """The directories below `root` among `paths`' parents that ballast wrote: output
    roots (holding `_CURRENT` or a `_staging` directory) and version directories (holding
    the manifest). `root` itself is never one: a version named as an input is read."""
    own: set[str] = set()
    for path in paths:
        directory, name = path.rsplit("/", 1) if "/" in path else ("", path)
        if name in OWN_MARKERS:
            own.add(directory)
        if f"/{STAGING_NAME}/" in f"/{path}":
            own.add(f"/{path}".split(f"/{STAGING_NAME}/", 1)[0][1:])
    return {
        directory
        for directory in own
        if _within(directory, root) and directory.rstrip("/") != root.rstrip("/")
    }


def is_under(path: str, directories: set[str]) -> bool:
    """Whether `path` lies in one of `directories`."""
    return any(path.startswith(f"{directory}/") for directory in directories)


def _root_key(uri: str) -> tuple[str, str]:
    """(protocol, path before the first glob character, normalised)."""
    protocol, _, path = uri.rpartition("://")
    cut = min((path.find(c) for c in GLOB_CHARS if c in path), default=len(path))
    if cut < len(path):  # the directory the glob searches
        path = path[:cut].rsplit("/", 1)[0] or "/"
    if protocol in ("", "file", "local"):
        return "file", os.path.realpath(path or ".")
    return protocol, path.rstrip("/")


def _within(inner: str, outer: str) -> bool:
    """Whether path `inner` is `outer` or lies under it (whole components only)."""
    outer = outer.rstrip("/")
    return inner == outer or inner.startswith(f"{outer}/")
