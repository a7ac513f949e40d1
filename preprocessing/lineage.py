"""The lineage records a manifest carries (preprocessing/manifest.py re-exports them).

`InputRecord`: one input file as it was listed, so a later run can tell new files from
rewritten or removed ones (preprocessing/increment.py). `Delta`: what one version of a
chain added; a flat version is one delta of every input, a chain's child lists its
ancestors' deltas and its own last. Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class InputRecord:
    """One input file as listed when the version was made; (uri, num_bytes, content_tag)
    identify its content, as in the input fingerprint (preprocessing/scan.py)."""

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

    def added_rows(self, split: str = "train") -> int:
        return sum(int(stratum[3]) for stratum in self.strata.get(split, []))
