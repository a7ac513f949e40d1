"""Read whole row groups ahead of the batch that needs them, in background threads.

`ReadConfig` holds the reading settings (read-ahead depth and the optional
disk cache); `ReadAhead` runs the reads. A stream knows, before it yields a
batch, the exact sequence of row groups its batches will need, so `ReadAhead`
is given that sequence and keeps the next `depth` reads in flight in a thread
pool while the caller works on the current one. Reading and decoding happen in
pyarrow, which releases the GIL, so the threads overlap I/O and decoding with
batch assembly and the training step. Depth 0 reads in the caller's thread.

Memory: at most `depth + 1` decoded row groups per stream iterator (one per
DataLoader worker). The values and their order are the same for any depth;
only when reads happen changes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")


class ReadConfig(BaseModel):
    """How shards are read: read-ahead depth and an optional local disk cache."""

    model_config = ConfigDict(extra="forbid")

    prefetch_row_groups: int = Field(
        2, ge=0, description="Row groups read ahead in background threads; 0 reads on demand."
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


class ReadAhead(Generic[T]):
    """`get(key)` for keys requested in exactly the order of `keys`, `depth` reads ahead."""

    def __init__(self, load: Callable[[int], T], keys: Iterable[int], depth: int) -> None:
        if depth < 0:
            raise ValueError(f"read-ahead depth must be >= 0, got {depth}")
        self._load, self._keys, self._depth = load, iter(keys), depth
        self._pending: deque[tuple[int, Future[T]]] = deque()
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
        future = self._pending.popleft()[1]
        self._fill(self._pool)
        return future.result()

    def _fill(self, pool: ThreadPoolExecutor) -> None:
        while len(self._pending) < self._depth:
            key = next(self._keys, None)
            if key is None:
                return
            self._pending.append((key, pool.submit(self._load, key)))

    def close(self) -> None:
        """Cancel reads not yet started and wait for those running (at most `depth`), so no
        read outlives the iterator that planned it."""
        self._current = None
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending.clear()

    def __enter__(self) -> ReadAhead[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
