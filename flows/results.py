"""The typed results the flows pass between their steps (Prefect's own examples return
dataclasses): a step names what it produced, and the flow only passes it on. A flow's own
return value stays the plain dict a person or `--output json` reads (`as_dict`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class DatasetVersion:
    """A reshard's outcome: the version's manifest URI and id, whether it was there already
    (`reused`) and whether Prefect's cache answered (`cached`)."""

    manifest_uri: str
    version_id: str
    reused: bool
    cached: bool = False

    @classmethod
    def of(cls, value: DatasetVersion | dict[str, Any]) -> DatasetVersion:
        """`value`, or a reshard result cached as a dict by an earlier release."""
        return value if isinstance(value, DatasetVersion) else cls(**value)

    def from_cache(self, cached: bool) -> DatasetVersion:
        """This version as the flow saw it: a cache hit is reused too."""
        return replace(self, reused=self.reused or cached, cached=cached)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
