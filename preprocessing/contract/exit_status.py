"""What a failed command of ballast exits with, and the one line that says why.

`python -m preprocessing`, `ballast run` and `ballast verify` map every failure through
`exit_status`, so a scheduler or a person reads the same code for the same cause from any;
every S3 URI each is given (config file, inputs, output root) is probed first by
preprocessing/storage/reach.py, so a dead endpoint is 4 and a missing bucket 5 wherever
the URI sits:

- 2 `BAD_INPUT`: the config, a flag or the input data is wrong; fix it, then rerun
  (a config error, a permanent input error, a missing config or input, a hostile
  manifest, inputs an incremental run refuses).
- 3 `CONFLICT`: another run moved `_CURRENT` during this one; rerun.
- 4 `TRANSIENT`: storage or a service failed for a reason that may pass (S3 503s, resets,
  an endpoint that does not answer) and outlasted the retries; nothing is committed; rerun.
- 5 `STORAGE_REFUSED`: storage refused for a reason only a person fixes (no space, quota,
  permission, a read-only file system, a missing bucket); nothing is committed.
- 1 `INTERNAL`: anything else (a bug): the traceback in the log says where.

The first error wins: a cleanup that fails while a run is failing logs its own error and
lets the cause through (preprocessing/versions/attempt.py), so the line is the cause's.
The traceback goes to a log file (`write_traceback`), the line to stderr.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from pathlib import Path

from pydantic import ValidationError

from preprocessing.contract.commit import CommitConflict
from preprocessing.toolbox.faults import (
    RetriesExhausted,
    TransientError,
    classify,
    storage_refusal,
)
from preprocessing.toolbox.secrets import redact

INTERNAL, BAD_INPUT, CONFLICT, TRANSIENT, STORAGE_REFUSED = 1, 2, 3, 4, 5
LOG_DIR_ENV = "BALLAST_LOG_DIR"
MAX_LINE_CHARS = 600


def exit_status(error: BaseException) -> int:
    """The documented exit status of a command that failed with `error` (see the module)."""
    if isinstance(error, CommitConflict):
        return CONFLICT
    if storage_refusal(error) is not None:
        return STORAGE_REFUSED
    if isinstance(error, RetriesExhausted | TransientError | OSError):
        return BAD_INPUT if isinstance(error, FileNotFoundError) else TRANSIENT
    if classify(error) != "transient":  # config and permanent: fails the same way again
        return BAD_INPUT
    return INTERNAL


def cause_line(error: BaseException) -> str:
    """The cause on one redacted line: a validation error's problems each with its field,
    a storage refusal's path, any other error's message (its type when it has none)."""
    refusal = storage_refusal(error)
    if refusal is not None:
        text = str(refusal)
    elif isinstance(error, ValidationError):
        text = f"invalid {error.title}: " + "; ".join(
            f"{'.'.join(str(part) for part in problem['loc'])}: {problem['msg']}"
            for problem in error.errors(include_url=False)
        )
    else:
        text = str(error) or type(error).__name__
    line = " ".join(text.split())
    return redact(line if len(line) <= MAX_LINE_CHARS else f"{line[:MAX_LINE_CHARS]}...")


def write_traceback(command: str, error: BaseException) -> Path:
    """The full traceback, redacted, in a new file under $BALLAST_LOG_DIR (default: a
    `ballast` directory in the system's temporary directory); its path."""
    directory = Path(os.environ.get(LOG_DIR_ENV) or Path(tempfile.gettempdir()) / "ballast")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    with path.open("a") as log:
        log.write(redact("".join(traceback.format_exception(error))))
    return path
