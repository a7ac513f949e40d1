"""MLflow's console output on a quiet ballast console.

MLflow prints some events itself, past the logging module (`Successfully registered model
...`, `Created version ...`: its `eprint`), to the stream its own loggers write to. On a
quiet console that stream is off; its loggers' warnings and errors still reach stderr,
and every record still reaches the handlers ballast adds (the command's log file).
Its artifact progress bars (a model loaded from a tracking server) are off too: tqdm's
redraws are a console line each.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR
from mlflow.utils.logging_utils import MLFLOW_LOGGING_STREAM

BARS = MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name


@contextmanager
def quiet_mlflow_events() -> Iterator[None]:
    """While the block runs: MLflow's event prints and progress bars off (also in the
    processes it starts), its warnings on stderr."""
    logger = logging.getLogger("mlflow")
    warnings_handler = logging.StreamHandler(sys.stderr)
    warnings_handler.setLevel(logging.WARNING)
    warnings_handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    enabled = MLFLOW_LOGGING_STREAM.enabled
    MLFLOW_LOGGING_STREAM.enabled = False
    logger.addHandler(warnings_handler)
    try:
        with _environ(BARS, "false"):
            yield
    finally:
        logger.removeHandler(warnings_handler)
        MLFLOW_LOGGING_STREAM.enabled = enabled


@contextmanager
def _environ(name: str, value: str) -> Iterator[None]:
    """`name=value` in this process's environment (so in the processes it starts) for the
    block, then as it was."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before
