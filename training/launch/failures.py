"""How a training job fails, seen from its ranks and from its launcher.

A rank that stops on an error no retry can fix (`is_config_error`: the config or
permanent kinds of preprocessing/toolbox/faults.py: a ValueError of ballast's own
checks, pydantic's ValidationError, a ManifestError, storage that refuses) prints the
cause in one line, writes `<output_dir>/errors/rank-<r>.log` (that line, then the
traceback) and exits with CONFIG_ERROR_STATUS. The exit status does not reach the
launcher intact (torchrun reports any failed rank as 1, sbatch and a PyTorchJob
only that the job failed), so the launcher reads the causes from those logs, which
lie under `output_dir` where every node writes. Such an error repeats on every
attempt: the retry policy never retries it (training/launch/config.py).

A rank that wrote its log waits (at most PEER_LOG_WAIT_S) for the logs of its peers
before it exits: torchrun stops the other ranks as soon as one exits, so without
this wait the launcher would see one rank's cause where every rank had the same
error, and could not tell a deterministic error from one rank's fault.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from typing import Any

from fsspec.core import url_to_fs

from preprocessing.toolbox.faults import RetriesExhausted, classify
from preprocessing.toolbox.secrets import redact
from training.distributed.env import env_rank, env_world_size, errors_dir

CONFIG_ERROR_STATUS = 2
MAX_CAUSE_CHARS = 600
PEER_LOG_WAIT_S = 10.0


class TrainingFailed(RetriesExhausted, RuntimeError):
    """The job failed. `config_error`: the one-line cause a rank reported for a config or
    data error (never retried), else None; `output_tail`: the end of the launcher's
    output. Both are redacted (preprocessing/toolbox/secrets.py). The launcher is the one
    level that retries a job, so no level above it retries this error."""

    def __init__(
        self,
        message: str,
        returncode: int | None,
        output_tail: str,
        config_error: str | None = None,
    ) -> None:
        self.returncode = returncode
        self.message = redact(message)
        self.output_tail = redact(output_tail)
        self.config_error = config_error
        self.attempts: list[dict[str, Any]] = []
        if config_error is None:
            super().__init__(f"{redact(message)}\n--- last output ---\n{self.output_tail}")
        else:
            super().__init__(f"{redact(message)}: {config_error}")


def is_config_error(error: BaseException) -> bool:
    """A config, data or storage error that fails every attempt the same way (what
    `preprocessing.toolbox.faults.classify` calls config or permanent)."""
    return classify(error) != "transient"


def one_line_cause(error: BaseException) -> str:
    """`Type: message` on one line. An error re-raised from a DataLoader worker carries the
    worker's traceback in its message; its own `Type: message` is the last line."""
    text = str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if "Traceback" in text and lines:
        cause = lines[-1]
    else:
        cause = f"{type(error).__name__}: {' '.join(lines)}"
    return redact(cause)[:MAX_CAUSE_CHARS]


def error_log_uri(output_dir: str, rank: int) -> str:
    return f"{errors_dir(output_dir)}/rank-{rank}.log"


def report_config_error(error: BaseException, output_dir: str | None) -> int:
    """Write the error's log (under `output_dir`; a temporary file when the config itself
    did not load), print its cause in one line, and return CONFIG_ERROR_STATUS."""
    rank = env_rank()
    cause = one_line_cause(error)
    if output_dir is None:
        uri = os.path.join(tempfile.gettempdir(), f"ballast-training-{os.getpid()}.log")
    else:
        uri = error_log_uri(output_dir, rank)
    fs, path = url_to_fs(uri)
    fs.makedirs(os.path.dirname(path), exist_ok=True)
    trace = "".join(traceback.format_exception(error))
    fs.pipe_file(path, f"{cause}\n\n{redact(trace)}".encode())
    print(f"config or data error on rank {rank}: {cause} (traceback: {uri})", file=sys.stderr)
    if output_dir is not None:
        wait_for_peer_logs(output_dir, env_world_size())
    return CONFIG_ERROR_STATUS


def wait_for_peer_logs(
    output_dir: str, world_size: int, timeout_s: float = PEER_LOG_WAIT_S
) -> None:
    """Return once every rank's error log exists, or after `timeout_s` (a rank that did
    not fail never writes one, and is stopped by torchrun when this rank exits)."""
    fs, path = url_to_fs(errors_dir(output_dir))
    deadline, pause_s = time.monotonic() + timeout_s, 0.1
    # Doubling pauses: about 7 listings per rank however long the wait, so a large job's
    # ranks list the shared directory a few thousand times at most, not every 0.2 s each.
    while time.monotonic() < deadline:
        if len(fs.glob(f"{path}/rank-*.log")) >= world_size:
            return
        fs.invalidate_cache()
        time.sleep(min(pause_s, max(0.0, deadline - time.monotonic())))
        pause_s *= 2


def read_config_errors(output_dir: str) -> list[str]:
    """The causes the ranks of the last attempt reported, in rank order, each with its
    log's URI; empty when none did (or the logs cannot be read: then the failure counts
    as transient)."""
    try:
        fs, path = url_to_fs(errors_dir(output_dir))
        ranks = sorted(
            int(name.rsplit("-", 1)[1].split(".")[0]) for name in fs.glob(f"{path}/rank-*.log")
        )
        uris = [error_log_uri(output_dir, rank) for rank in ranks]
        heads = [
            fs.cat_file(url_to_fs(uri)[1]).decode(errors="replace").split("\n", 1)[0]
            for uri in uris
        ]
    except (OSError, ValueError):
        return []
    return [f"{head} (traceback: {uri})" for head, uri in zip(heads, uris, strict=True)]


def clear_error_logs(output_dir: str) -> None:
    """Remove the error logs of an earlier attempt, so that they are not read as this
    attempt's (a config error ends the job, so they describe a job already over)."""
    fs, path = url_to_fs(errors_dir(output_dir))
    for log in fs.glob(f"{path}/rank-*.log"):
        fs.rm_file(log)
