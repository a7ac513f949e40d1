"""What a ballast command prints, and the log file that keeps everything it logged.

The console holds ballast's own progress (the lines the flows log, flows/runlog.py, and
what their tasks print), every warning and error, and the result at the end. Libraries'
INFO lines (Dask's clusters starting and stopping, Prefect's task states and temporary
server, MLflow's store set-up) go to the command's log file only, and to the console too
with `-v`. A quiet console shows each line it keeps as one line, without a traceback
(Prefect logs a failed task's and flow's, the same error twice): a refused or failed run
ends in a few lines, the cause last (flows/cli/main.py); the log file keeps every
traceback. Dask's worker processes configure their logging when they start, from their
environment: `DASK_DISTRIBUTED__LOGGING` (a `logging.dictConfig`, set here for the
command's duration) sends their lines to the same file. ballast's own packages below the
flows log INFO into the file too (which SLURM jobs a step ran as).
"""

from __future__ import annotations

import copy
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOG_DIR_ENV = "BALLAST_LOG_DIR"
DASK_LOGGING_ENV = "DASK_DISTRIBUTED__LOGGING"
PROGRESS_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
OWN_PACKAGES = ("preprocessing", "training", "tracking")  # below the flows
LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Prefect's state line of every task and flow run: the result and runlog say more. A
# failed or crashed state is logged as an error, and errors always reach the console.
STATE_PREFIX = "Finished in state "


def log_dir() -> Path:
    """$BALLAST_LOG_DIR, or a `ballast` directory in the system's temporary directory."""
    return Path(os.environ.get(LOG_DIR_ENV) or Path(tempfile.gettempdir()) / "ballast")


def new_log_path(command: str) -> Path:
    """A new log file's path for one invocation of `command`."""
    directory = log_dir()
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


class ProgressOnly(logging.Filter):
    """A quiet console's filter: warnings and errors, and ballast's own INFO lines (those
    of the flow and task run loggers, Prefect's state lines left out). Dask's warnings
    are about its own housekeeping (a worker killed at shutdown after 4 s) and reach the
    console only as errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("distributed"):
            return record.levelno >= logging.ERROR
        if record.levelno >= logging.WARNING:
            return True
        return record.name.startswith(PROGRESS_LOGGERS) and not str(record.msg).startswith(
            STATE_PREFIX
        )


class FirstLineOnly(logging.Formatter):
    """A quiet console's formatter around a handler's own: the record's first line, its
    traceback left out (the log file's handler formats the record whole)."""

    def __init__(self, inner: logging.Formatter | None = None, fmt: str | None = None) -> None:
        super().__init__()
        self.inner = inner  # put back when the command's logging ends
        self._fallback = logging.Formatter(fmt)  # a handler without a formatter of its own

    def format(self, record: logging.LogRecord) -> str:
        short = copy.copy(record)
        short.msg, short.args = record.getMessage().split("\n", 1)[0], None
        short.exc_info = short.exc_text = short.stack_info = None
        return (self.inner or self._fallback).format(short)


def _console_handlers(logger: logging.Logger) -> list[logging.Handler]:
    return [
        handler
        for handler in logger.handlers
        if isinstance(handler, logging.StreamHandler)
        and not isinstance(handler, logging.FileHandler)
    ]


def _loggers_with_handlers() -> list[logging.Logger]:
    """The root logger and every logger that does not pass its records up to it."""
    named = [
        logger
        for logger in logging.Logger.manager.loggerDict.values()
        if isinstance(logger, logging.Logger) and logger.handlers and not logger.propagate
    ]
    return [logging.getLogger(), *named]


def worker_logging(path: Path, verbose: bool) -> dict[str, object]:
    """The dictConfig Dask workers start with: their INFO lines to `path`, errors (INFO
    with `verbose`) to their stderr, which is the command's (each on one line, without
    its traceback, unless `verbose`). A LocalCluster started
    meanwhile keeps these levels (preprocessing/driver/cluster.py turns its `silence_logs`
    off when the environment holds this config)."""
    first_line = {"()": f"{__name__}.FirstLineOnly", "fmt": LINE_FORMAT}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "line": {"format": LINE_FORMAT},
            "console": {"format": LINE_FORMAT} if verbose else first_line,
        },
        "handlers": {
            "file": {"class": "logging.FileHandler", "filename": str(path), "formatter": "line"},
            "console": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "console",
                "level": "INFO" if verbose else "ERROR",
            },
        },
        "loggers": {
            "distributed": {"level": "INFO", "handlers": ["file", "console"], "propagate": False}
        },
    }


@contextmanager
def command_logging(path: Path, verbose: bool, stay_quiet: bool = False) -> Iterator[Path]:
    """While the block runs: every logged line into `path`, the console quiet unless
    `verbose`, Dask workers started meanwhile configured alike; `stay_quiet`: the console
    stays quiet after the block too (a command's process: Prefect stops its temporary
    server at exit). Call it once the libraries are imported (each sets up its own
    console handler at import)."""
    file_handler = logging.FileHandler(path)
    file_handler.setFormatter(logging.Formatter(LINE_FORMAT))
    quiet = ProgressOnly()
    loggers = _loggers_with_handlers()
    for logger in loggers:
        logger.addHandler(file_handler)
        for handler in _console_handlers(logger) if not verbose else []:
            handler.addFilter(quiet)
            if not isinstance(handler.formatter, FirstLineOnly):
                handler.setFormatter(FirstLineOnly(handler.formatter))
    before = os.environ.get(DASK_LOGGING_ENV)
    os.environ[DASK_LOGGING_ENV] = repr(worker_logging(path, verbose))
    try:
        with own_info_lines():
            yield path
    finally:
        _restore_env(before)
        for logger in loggers:
            logger.removeHandler(file_handler)
            for handler in _console_handlers(logger) if not stay_quiet else []:
                handler.removeFilter(quiet)
                if isinstance(handler.formatter, FirstLineOnly):
                    handler.setFormatter(handler.formatter.inner)
        file_handler.close()


@contextmanager
def own_info_lines() -> Iterator[None]:
    """ballast's own packages log their INFO lines (e.g. the SLURM jobs a step ran as)
    while the block runs: into the log file; a quiet console keeps only their warnings."""
    loggers = [logging.getLogger(name) for name in OWN_PACKAGES]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def _restore_env(before: str | None) -> None:
    if before is None:
        os.environ.pop(DASK_LOGGING_ENV, None)
    else:
        os.environ[DASK_LOGGING_ENV] = before
