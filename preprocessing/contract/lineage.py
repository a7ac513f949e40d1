"""The lineage records a manifest carries (preprocessing/contract/manifest.py re-exports them).

`InputRecord`: one input file as it was listed, so a later run can tell new files from
rewritten or removed ones (preprocessing/versions/incremental.py). `Delta`: what one version of a
chain added; a flat version is one delta of every input, a chain's child lists its
ancestors' deltas and its own last; `lineage_problem` is the rule a manifest's lineage
keeps. Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class InputRecord:
    """One input file as listed when the version was made; (uri, num_bytes, content_tag)
    identify its content, as in the input fingerprint (preprocessing/scan/inputs.py)."""

    uri: str
    num_bytes: int
    content_tag: str
    id_range: list[int] | None = None  # [lowest, highest] id of an accepted file


@dataclass(frozen=True)
class Delta:
    """What one version of a chain added: how much it read, and per stratum what it wrote."""

    version_id: str
    parent_version: str | None
    created_at: str  # "" in the manifest's own delta: the manifest's created_at
    num_files: int  # input files this version read
    num_bytes: int
    num_pieces: int
    # Per split, one [label, source, input rows, output rows] per stratum of the delta.
    strata: dict[str, list[list[Any]]] = field(default_factory=dict)
    # With dataset.group_column or duplicates set, per split of the delta's own inputs:
    # `rows`, `groups`, `largest_group_share`, `duplicate_rows`, and `estimated_from` when
    # past a sample's size (preprocessing/plan/key_tally.py); empty otherwise.
    split_values: dict[str, dict[str, float]] = field(default_factory=dict)
    # With dataset.holdout_by: newest, the delta's time cut (preprocessing/plan/time_cut.py
    # `TimeCut.record`): its column, level, cutoff cell and cutoff bucket; empty otherwise.
    time_cut: dict[str, Any] = field(default_factory=dict)

    def added_rows(self, split: str = "train") -> int:
        return sum(int(stratum[3]) for stratum in self.strata.get(split, []))


def lineage_problem(
    version_id: str,
    parent_version: str | None,
    deltas: list[Delta],
    shards: Iterable[tuple[str, str | None]],
) -> str | None:
    """What breaks the lineage of a version, or None: its own delta must come last, its
    parent be the delta before, and every shard (path, version) held elsewhere name an
    ancestor of that lineage (never the version itself, never another)."""
    chain = [delta.version_id for delta in deltas]
    if chain and chain[-1] != version_id:
        return f"the last delta names {chain[-1]!r}, not the version {version_id!r} itself"
    if parent_version is not None and chain[-2:-1] != [parent_version]:
        return (
            f"parent_version {parent_version!r} is not the delta before this version's "
            f"in its lineage {chain}"
        )
    ancestors = set(chain[:-1])
    for path, version in shards:
        if version is not None and version not in ancestors:
            return (
                f"shard {path!r} is said to be in version {version!r}, which is not an "
                f"ancestor in its lineage {chain}"
            )
    return None
