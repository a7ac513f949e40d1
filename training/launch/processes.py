"""The process group of one launch attempt: start it, bound its time, stop all of it.

torchrun (or sbatch, or kubectl) runs in a session of its own with its output in a
log file; at the timeout the launcher and every descendant are stopped, since
torchrun starts each rank in a session of its own and killing the launcher's
group alone would leave the ranks running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path
from typing import IO

TAIL_CHARS = 8000
STOP_GRACE_S = 15


def run_process_group(
    command: list[str], log: IO[bytes], timeout_s: float, env: dict[str, str]
) -> int | None:
    """Run `command` in its own session, output to `log`; None if it had to be killed."""
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_process_group(process)
        return None


def stop_process_group(process: subprocess.Popen) -> None:
    """SIGTERM the launcher and every descendant, then SIGKILL what is left."""
    import psutil

    try:
        ranks = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        ranks = []
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    for rank in ranks:
        with contextlib.suppress(psutil.NoSuchProcess):
            rank.kill()


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment plus `extra` (secrets never written to disk), with the directory
    this ballast is imported from on PYTHONPATH."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ) | (extra or {})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def read_tail(log: IO[bytes]) -> str:
    """The last TAIL_CHARS bytes of a log, decoded leniently."""
    size = log.seek(0, os.SEEK_END)
    log.seek(max(0, size - TAIL_CHARS))
    return log.read().decode(errors="replace")
