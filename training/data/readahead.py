"""Read whole row groups ahead of the batch that needs them, in background threads.

`ReadConfig` holds the reading settings (read-ahead depth and the optional
disk cache); `ReadAhead` runs the reads. A stream knows, before it yields a
batch, the exact sequence of row groups its batches will need, so `ReadAhead`
is given that sequence and keeps the next `depth` reads in flight in a thread
pool while the caller works on the current one; keys next to each other that may be read
together (row groups of one shard) are read by one call. A key of None in the sequence
means no further key is known yet (balance: speed knows a step's reads only once
its shares are final): reading ahead stops there until the next `get`. Reading and decoding happen
in pyarrow, which releases the GIL, so the threads overlap I/O and decoding with
batch assembly and the training step. Depth 0 reads in the caller's thread.

Memory: at most `depth + 1` decoded row groups per stream iterator (one per
DataLoader worker). The values and their order are the same for any depth;
only when reads happen changes.

`prefetched(items, depth)` moves the next step up: it produces whole batches
`depth` ahead in one background thread, so assembling a batch (a gather from the
decoded groups) overlaps the training step instead of adding to it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from queue import Full, Queue
from typing import Any, Generic, Literal, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field

from preprocessing.toolbox.faults import RetryPolicy

T = TypeVar("T")


class ReadConfig(BaseModel):
    """How shards are read: read-ahead depth and an optional local disk cache."""

    model_config = ConfigDict(extra="forbid")

    prefetch_row_groups: int = Field(
        2, ge=0, description="Row groups read ahead in background threads; 0 reads on demand."
    )
    prefetch_batches: int = Field(
        2,
        ge=0,
        description="Batches assembled ahead in a background thread, so assembling "
        "one overlaps the training step; 0 assembles each batch in the consumer's thread "
        "when it is asked for (measured: benchmarks/RESULTS.md M26).",
    )
    cache_dir: str | None = Field(
        None, description="Local directory for verified copies of whole shards; None: no cache."
    )
    cache_bytes: int = Field(
        10 * 2**30,
        gt=0,
        description="Most bytes the cache directory holds (LRU eviction). An epoch visits the "
        "row groups of all shards in random order: a cache smaller than the split downloads "
        "shards again within an epoch.",
    )
    verify: Literal["size", "sha256", "none"] = Field(
        "size",
        description="What is checked of a shard before its bytes are decoded: "
        "`size` (its size against the manifest's, free), `sha256` (its whole content "
        "against the manifest's digest, once per shard and process: a full read of every "
        "shard; benchmarks/loader_bench.py --verify measures it) or `none`. Page checksums "
        "are verified on every read whatever this says.",
    )
    retry: RetryPolicy = Field(
        default_factory=RetryPolicy,
        description="Tries of a row group's read that failed "
        "for a reason that may pass (a 503, a reset, a body cut short) before the rank fails.",
    )


@dataclass(frozen=True)
class Joined(Generic[T]):
    """Keys read by one call: `accepts(keys, key)` says whether `key` may join `keys` (the
    keys before it in the sequence), and `load(keys)` gives their values in that order."""

    accepts: Callable[[list[int], int], bool]
    load: Callable[[list[int]], list[T]]


class ReadAhead(Generic[T]):
    """`get(key)` for keys requested in exactly the order of `keys`, `depth` reads ahead.

    With `joined`, keys next to each other in the sequence that it accepts (the row groups
    of one shard) are read by one call, `joined.load(keys)`, when they enter the read-ahead
    together: on 5,000 columns a call costs 35-50 CPU-ms before any rows. The values, their
    order and the bound on what is held are those of one read per key."""

    def __init__(
        self,
        load: Callable[[int], T],
        keys: Iterable[int | None],
        depth: int,
        joined: Joined[T] | None = None,
    ) -> None:
        if depth < 0:
            raise ValueError(f"read-ahead depth must be >= 0, got {depth}")
        self._load, self._keys, self._depth, self._joined = load, iter(keys), depth, joined
        self._pending: deque[tuple[int, Future[list[Any]], int]] = deque()
        self._next: int | None = None  # a key taken from `keys` and not yet read
        self._current: tuple[int, T] | None = None
        self._pool = ThreadPoolExecutor(depth, "readahead") if depth else None

    def get(self, key: int) -> T:
        """The value for `key`; the previous key's value is released first."""
        if self._current is not None and self._current[0] == key:
            return self._current[1]
        self._current = None
        value = self._next_value(key)
        self._current = (key, value)
        return value

    def _next_value(self, key: int) -> T:
        if self._pool is None:
            return self._load(key)
        self._fill(self._pool)
        if not self._pending or self._pending[0][0] != key:
            expected = self._pending[0][0] if self._pending else None
            raise RuntimeError(f"read-ahead asked for key {key}, planned {expected}")
        _, future, index = self._pending.popleft()
        self._fill(self._pool)
        values = future.result()
        # Let go of it there: a joined call's values are then held no longer than one
        # read's would be.
        value, values[index] = values[index], None
        return cast(T, value)

    def _fill(self, pool: ThreadPoolExecutor) -> None:
        while len(self._pending) < self._depth and (keys := self._take()):
            if len(keys) > 1 and self._joined is not None:
                future = pool.submit(self._joined.load, keys)
            else:
                future = pool.submit(lambda key: [self._load(key)], keys[0])
            self._pending.extend((key, future, index) for index, key in enumerate(keys))

    def _take(self) -> list[int]:
        """The next keys of the sequence to read in one call (none: no key known now), as
        many as `joined` accepts and the depth leaves room for."""
        room = self._depth - len(self._pending)
        keys: list[int] = []
        while len(keys) < room:
            key = self._next if self._next is not None else next(self._keys, None)
            self._next = None
            if key is None:
                break
            if keys and not (self._joined and self._joined.accepts(keys, key)):
                self._next = key  # the first key of the next call
                break
            keys.append(key)
        return keys

    def close(self) -> None:
        """Cancel reads not yet started and wait for those running (at most `depth`), so no
        read outlives the iterator that planned it."""
        self._current = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()
        self._next = None

    def __enter__(self) -> ReadAhead[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class _Failure:
    error: BaseException


_DONE = object()


def prefetched(items: Iterator[T], depth: int) -> Generator[T, None, None]:
    """`items` in order, produced up to `depth` ahead by one background thread (0: by the
    caller). An error of the producer is raised here. Closing this generator stops the
    thread after at most the item in progress, then closes `items` from this thread."""
    if depth == 0:
        yield from items
        return
    ready: Queue[Any] = Queue(maxsize=depth)
    stop = threading.Event()
    thread = threading.Thread(
        target=_produce, args=(items, ready, stop), daemon=True, name="batch-prefetch"
    )
    thread.start()
    try:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, _Failure):
                raise item.error
            yield item
    finally:
        stop.set()
        thread.join()
        getattr(items, "close", lambda: None)()


def _produce(items: Iterator[Any], ready: Queue[Any], stop: threading.Event) -> None:
    try:
        for item in items:
            if not _put(ready, item, stop):
                return
    except BaseException as error:  # handed to the consumer, which raises it
        _put(ready, _Failure(error), stop)
    else:
        _put(ready, _DONE, stop)


def _put(ready: Queue[Any], item: Any, stop: threading.Event) -> bool:
    """Queue `item` unless the consumer stopped; False if it did."""
    while not stop.is_set():
        try:
            ready.put(item, timeout=0.05)
            return True
        except Full:
            continue
    return False
