"""Which route a reshard takes (pure): one pass in memory, or the staged exchange.

A reshard whose rows fit `single_pass_bytes` reads every input once, routes the rows in
memory and writes each shard straight away (`single_pass`); a larger one stages its rows
grouped by destination and reads them back (`staged`, preprocessing/plan/layout.py). Both
routes route rows by the same fates and order each shard by the same keys, so the shards,
and the version id, are the same whichever runs: the choice is a matter of speed and
memory, never of content, and its budget is an output-neutral setting.

What a single pass holds is estimated from the plan, in input bytes as stored (what every
task size of the exchange is counted in): every input row it reads, held until the last
shard is written, plus the ordered copy of the largest shard being written.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SINGLE_PASS = "single_pass"
STAGED = "staged"


@dataclass(frozen=True)
class Route:
    """The route a run takes, the bytes its rows need held and the budget it was held to."""

    name: str
    held_bytes: int
    budget_bytes: int

    def line(self) -> str:
        """The choice in one line, for the run's log."""
        relation = "fit" if self.name == SINGLE_PASS else "exceed"
        return (
            f"route {self.name}: the rows to hold ({self.held_bytes / 2**20:.1f} MiB as stored) "
            f"{relation} single_pass_bytes ({self.budget_bytes / 2**20:.1f} MiB)"
        )

    def record(self) -> dict[str, int | str]:
        """What the manifest keeps of it (output-neutral: not in the version id)."""
        return {
            "route": self.name,
            "held_bytes": self.held_bytes,
            "budget_bytes": self.budget_bytes,
        }


def plan_route(piece_bytes: np.ndarray, shard_bytes: np.ndarray, budget_bytes: int) -> Route:
    """The route of a reshard whose pieces hold `piece_bytes` and whose shards
    `shard_bytes` (input bytes as stored), under a budget of `budget_bytes` (0: always
    staged)."""
    largest = float(shard_bytes.max()) if len(shard_bytes) else 0.0
    held = int(np.ceil(float(piece_bytes.sum()) + largest))
    fits = budget_bytes > 0 and held <= budget_bytes
    return Route(SINGLE_PASS if fits else STAGED, held, budget_bytes)
