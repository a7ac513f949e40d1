"""What one of ballast's loggers logged while a block ran, caught on that logger itself.

pytest's `caplog` listens on the root logger, whose handlers any library in the process
may replace (Prefect's logging set-up configures `root` when pytest's handler is the only
one there). In one CI run a resume test read nothing at all although the rerun had logged
its line; a handler on the logger that logs the line sees it whatever the root holds."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def records_of(name: str, level: int = logging.INFO) -> Iterator[list[logging.LogRecord]]:
    """The records logger `name` (and its children) logs at `level` or above in the block."""
    logger, handler = logging.getLogger(name), _Records()
    before = logger.level
    logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)


def messages(records: list[logging.LogRecord]) -> str:
    """The records' messages, one per line."""
    return "\n".join(record.getMessage() for record in records)
