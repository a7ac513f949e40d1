"""Which route a reshard takes (pure): one pass in memory, or the staged exchange.

A reshard whose rows fit `single_pass_bytes` reads every input once, routes the rows in
memory and writes each shard straight away (`single_pass`); a larger one stages its rows
grouped by destination and reads them back (`staged`, preprocessing/plan/layout.py). Both
routes route rows by the same fates and order each shard by the same keys, so the shards,
and the version id, are the same whichever runs: the choice is a matter of speed and
memory, never of content, and its budget is an output-neutral setting.

What a single pass holds is estimated in decoded bytes, not bytes as stored (compressed):
the inputs' decoded size (a Parquet footer's uncompressed `total_byte_size` of each row
group; for CSV and JSON lines a bound, `scan/inputs.py: text_decoded_bytes`) times
DECODED_FACTOR, plus the largest shard decoded (its ordered copy being written), plus
ROW_INDEX_BYTES a row for the routing's index arrays (fates, positions, keys,
destinations, their sorts) and the per-piece parts. The coefficients are fitted to the
two single passes measured in benchmarks/RESULTS.md M57 (the Dask worker's peak, which
includes its imports): 1.83 GB decoded in 5.52 M rows (1.7 GB in 300 files) peaked at
3.19 GB, and 0.33 GB decoded in 10 M rows (5,000 files of 2,000 rows) at 1.60 GB. The
exact fit is 1.35 a decoded byte and 115 bytes a row; each is rounded up (1.5 and 128),
so the estimate is 3.53 GB and 1.78 GB there, about 11% above both peaks.

Both the single pass and a run on threads also need few files and shards: each input
file and each shard costs 1.5-3 ms of Python that holds the GIL (open, footer, masks,
writer), which worker processes split and one process's threads cannot. Past
ITEM_LIMIT files and shards together that outweighs what the pass saves: 5,000 files of
2,000 rows into 2,000 shards took 25.9 s on threads in one pass, 12.0 s staged on two
worker processes (benchmarks/RESULTS.md M64).

Where a standalone reshard runs (`runs_in_process`) is chosen before the scan, from the
inputs as listed: a reshard of at most ITEM_LIMIT files whose bytes, STORED_FACTOR times
over, fit the budget runs on threads in its own process (`dask.kind: threads`) instead
of starting worker processes, whose start, imports and close cost seconds that such an
input does not. The
factor bounds what a single pass holds per stored byte on the inputs measured: 6.1 for
5,000 small Parquet files (1.78 GB held of 0.29 GB), 2.0 for 1.7 GB in 300 files. Like
the route, it changes where the work runs, never what is written; an input that decodes
larger than that still gets the route its footers call for, on threads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SINGLE_PASS = "single_pass"
STAGED = "staged"
DECODED_FACTOR = 1.5  # the rows held decoded, and the readers' and writers' buffers
ROW_INDEX_BYTES = 128  # a row's index arrays and share of its piece's parts
STORED_FACTOR = 8  # what a single pass holds per input byte as stored, at most (above)
ITEM_LIMIT = 1_000  # files and shards that one process's threads handle in good time


@dataclass(frozen=True)
class Route:
    """The route a run takes, the decoded bytes its rows need held (the estimate) and
    the budget it was held to."""

    name: str
    held_bytes: int
    budget_bytes: int
    items: int = 0  # input files and shards

    def line(self) -> str:
        """The choice in one line, for the run's log."""
        fits = self.budget_bytes > 0 and self.held_bytes <= self.budget_bytes
        if self.name == STAGED and fits and self.items > ITEM_LIMIT:
            return (
                f"route staged: {self.items} input files and shards, more than one "
                f"process's threads pass in good time ({ITEM_LIMIT}: plan/route.py)"
            )
        relation = "fit" if self.name == SINGLE_PASS else "exceed"
        return (
            f"route {self.name}: the rows to hold ({self.held_bytes / 2**20:.1f} MiB decoded, "
            f"with their index arrays) {relation} single_pass_bytes "
            f"({self.budget_bytes / 2**20:.1f} MiB)"
        )

    def record(self) -> dict[str, int | str]:
        """What the manifest keeps of it (output-neutral: not in the version id)."""
        return {
            "route": self.name,
            "held_decoded_bytes": self.held_bytes,
            "budget_bytes": self.budget_bytes,
            "files_and_shards": self.items,
        }


def held_bytes(decoded_bytes: int, rows: int, shard_rows: np.ndarray) -> int:
    """The estimate of what a single pass holds (the module's docstring): the inputs'
    `decoded_bytes` in `rows` rows, shards of `shard_rows`."""
    largest = int(shard_rows.max()) if len(shard_rows) else 0
    shard_bytes = largest * (decoded_bytes / rows) if rows else 0.0
    return int(np.ceil(DECODED_FACTOR * decoded_bytes + shard_bytes + ROW_INDEX_BYTES * rows))


def plan_route(
    decoded_bytes: int, rows: int, shard_rows: np.ndarray, budget_bytes: int, files: int = 0
) -> Route:
    """The route of a reshard whose `files` inputs decode to `decoded_bytes` in `rows`
    rows, into shards of `shard_rows`, under a budget of `budget_bytes` (0: always staged):
    the single pass when what it holds fits and files and shards are at most ITEM_LIMIT."""
    held, items = held_bytes(decoded_bytes, rows, shard_rows), files + len(shard_rows)
    fits = budget_bytes > 0 and held <= budget_bytes and items <= ITEM_LIMIT
    return Route(SINGLE_PASS if fits else STAGED, held, budget_bytes, items)


def runs_in_process(stored_bytes: int, budget_bytes: int, files: int = 1) -> bool:
    """Whether a reshard of `files` inputs of `stored_bytes` (as listed) runs on threads
    in its own process: at most ITEM_LIMIT files, and STORED_FACTOR times their bytes fit
    `budget_bytes` (0: never)."""
    fits = budget_bytes > 0 and STORED_FACTOR * stored_bytes <= budget_bytes
    return fits and files <= ITEM_LIMIT
