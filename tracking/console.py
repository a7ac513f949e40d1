"""MLflow's console output on a quiet ballast console.

MLflow prints some events itself, past the logging module (`Successfully registered model
...`, `Created version ...`: its `eprint`), to the stream its own loggers write to. On a
quiet console that stream is off; its loggers' warnings and errors still reach stderr,
and every record still reaches the handlers ballast adds (the command's log file).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from mlflow.utils.logging_utils import MLFLOW_LOGGING_STREAM


@contextmanager
def quiet_mlflow_events() -> Iterator[None]:
    """While the block runs: MLflow's event prints off, its warnings on stderr."""
    logger = logging.getLogger("mlflow")
    warnings_handler = logging.StreamHandler(sys.stderr)
    warnings_handler.setLevel(logging.WARNING)
    warnings_handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    enabled = MLFLOW_LOGGING_STREAM.enabled
    MLFLOW_LOGGING_STREAM.enabled = False
    logger.addHandler(warnings_handler)
    try:
        yield
    finally:
        logger.removeHandler(warnings_handler)
        MLFLOW_LOGGING_STREAM.enabled = enabled
