"""The shape of the exchange: map tasks, fan-in, merge rounds and destination blocks (pure).

Rows travel from pieces to destinations (shards of every split, numbered globally) in
rounds. Round 0 has one map task per group of consecutive pieces holding about
`task_bytes` of input; each writes one staged object covering every destination. Merge
round r groups the previous round's objects F at a time (F = fan-in) and splits each of
their destination blocks F ways, by the digits of the destination in base F: task
(group, block) reads one contiguous range from each of its F inputs and writes one
object for its block. The write tasks then read one range from each of the last round's
at most F objects that cover their shard. Every task of a round holds about
`task_bytes` (F ranges of 1/F of an object each), every read moves a whole block range,
and a round has about as many tasks as the map round, so the requests of the exchange
are O((pieces + shards) x F x rounds), never pieces x shards. Which objects a task reads
follows from this layout alone, and where rows sit inside an object is that object's own
index (`preprocessing/exchange/staged_objects.py`): the driver sends a merge or write task a
few integers and keeps nothing per object.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Reads of less than this many bytes are dominated by per-request latency on object
# stores; the default fan-in keeps a merge read (task bytes / fan-in) above it.
MIN_READ_BYTES = 1 << 20
MAX_DEFAULT_FAN_IN = 64
# On local staging a read is a memory map with no request to pay for, and a merge round
# copies every staged row once more: the default fan-in there (the exchange's caller
# knows where the staging is, `exchange/tasks.py: default_fan_in`).
LOCAL_DEFAULT_FAN_IN = 1024


@dataclass(frozen=True)
class Round:
    """One round of staged objects: `num_groups` x `num_blocks`, object id
    `group * num_blocks + block`; block b covers destinations
    [block_bounds[b], block_bounds[b + 1]) and lies inside block `parent_block[b]` of the
    round before."""

    num_groups: int
    block_bounds: np.ndarray
    parent_block: np.ndarray

    @property
    def num_blocks(self) -> int:
        return len(self.block_bounds) - 1

    @property
    def num_objects(self) -> int:
        return self.num_groups * self.num_blocks

    def block_of(self, destination: int) -> int:
        return int(np.searchsorted(self.block_bounds, destination, side="right")) - 1


@dataclass(frozen=True)
class ExchangeLayout:
    """Every round of one exchange: `rounds[0]` the maps, the rest merges. `map_bounds`
    cuts the pieces into map tasks (task t reads pieces [map_bounds[t], map_bounds[t+1]));
    `write_bounds` cuts the destinations into write tasks, each inside one block of the
    last round, so that it reads one range of each object it needs."""

    num_destinations: int
    fan_in: int
    map_bounds: np.ndarray
    rounds: list[Round]
    write_bounds: np.ndarray

    @property
    def num_map_tasks(self) -> int:
        return len(self.map_bounds) - 1

    @property
    def num_read_rounds(self) -> int:
        """Rounds that read staged objects: the merges plus the shard writes."""
        return len(self.rounds)

    def object_destinations(self, round_index: int, object_id: int) -> tuple[int, int]:
        """The destinations [first, stop) that object `object_id` of a round covers."""
        this = self.rounds[round_index]
        block = object_id % this.num_blocks
        return int(this.block_bounds[block]), int(this.block_bounds[block + 1])

    def merge_inputs(self, round_index: int, task: int) -> list[int]:
        """Ids of the objects of round `round_index - 1` that merge task `task` reads."""
        this, previous = self.rounds[round_index], self.rounds[round_index - 1]
        group, block = divmod(task, this.num_blocks)
        parent = int(this.parent_block[block])
        first = group * self.fan_in
        return [
            member * previous.num_blocks + parent
            for member in range(first, min(first + self.fan_in, previous.num_groups))
        ]

    def write_inputs(self, destination: int) -> list[int]:
        """Ids of the last round's objects that hold rows of `destination`."""
        last = self.rounds[-1]
        block = last.block_of(destination)
        return [group * last.num_blocks + block for group in range(last.num_groups)]


def plan_exchange(
    piece_bytes: np.ndarray,
    destination_bytes: np.ndarray,
    task_bytes: int,
    min_tasks: int = 1,
    fan_in: int | None = None,
    rounds: int | None = None,
) -> ExchangeLayout:
    """The exchange of pieces of `piece_bytes` into destinations of `destination_bytes`:
    map and write tasks of about `task_bytes` each, at least `min_tasks` of each.

    `rounds` (read rounds, 1 = the writes read the map outputs) and `fan_in` default to
    the fewest rounds whose reads stay within the fan-in, and a fan-in that keeps merge
    reads above MIN_READ_BYTES; given both, the writes read what the rounds leave.
    """
    map_bounds = group_pieces(piece_bytes, task_bytes, min_tasks)
    num_maps, num_destinations = len(map_bounds) - 1, len(destination_bytes)
    if fan_in is None:
        fan_in = (
            smallest_fan_in(num_maps, rounds)
            if rounds is not None
            else int(np.clip(task_bytes // MIN_READ_BYTES, 2, MAX_DEFAULT_FAN_IN))
        )
    if rounds is None:
        rounds = 1 + merge_rounds_needed(num_maps, fan_in)
    layout = [Round(num_maps, np.array([0, num_destinations]), np.zeros(1, dtype=np.int64))]
    for _ in range(rounds - 1):
        layout.append(_merge_round(layout[-1], fan_in))
    writes = np.union1d(
        group_pieces(destination_bytes, task_bytes, min_tasks), layout[-1].block_bounds
    )
    return ExchangeLayout(num_destinations, fan_in, map_bounds, layout, writes)


def group_pieces(piece_bytes: np.ndarray, task_bytes: int, min_tasks: int) -> np.ndarray:
    """Bounds of consecutive piece groups of about `task_bytes` each (a larger piece is a
    group of its own): max(min_tasks, total / task_bytes) groups, at most one per piece."""
    num_pieces = len(piece_bytes)
    if num_pieces == 0:
        return np.zeros(1, dtype=np.int64)
    sizes = np.maximum(np.asarray(piece_bytes, dtype=np.float64), 1.0)
    ends = np.cumsum(sizes)
    num_groups = min(num_pieces, max(min_tasks, int(np.ceil(ends[-1] / task_bytes))))
    # Cut after the piece that crosses each k/num_groups of the bytes, then push cuts
    # apart so that every group keeps at least one piece.
    rank = np.arange(1, num_groups)
    cuts = np.searchsorted(ends, ends[-1] * rank / num_groups, side="left") + 1
    slack = np.clip(np.maximum.accumulate(cuts - rank), 0, num_pieces - num_groups)
    return np.r_[0, slack + rank, num_pieces].astype(np.int64)


def merge_rounds_needed(num_objects: int, fan_in: int) -> int:
    """Merge rounds after which at most `fan_in` objects cover each destination."""
    rounds = 0
    while num_objects > fan_in:
        num_objects = -(-num_objects // fan_in)
        rounds += 1
    return rounds


def smallest_fan_in(num_objects: int, rounds: int) -> int:
    """The smallest fan-in F >= 2 with F ** rounds >= num_objects."""
    fan_in = max(2, int(np.floor(num_objects ** (1.0 / rounds))))
    while fan_in**rounds < num_objects:
        fan_in += 1
    return fan_in


def _merge_round(previous: Round, fan_in: int) -> Round:
    """Groups of `fan_in` of the previous round's groups; every block split `fan_in` ways
    (narrower blocks into single destinations)."""
    bounds = previous.block_bounds
    widths = np.diff(bounds)
    splits = bounds[:-1, None] + widths[:, None] * np.arange(fan_in + 1) // fan_in
    children = np.unique(splits)
    parent = np.searchsorted(bounds, children[:-1], side="right") - 1
    return Round(-(-previous.num_groups // fan_in), children, parent.astype(np.int64))
