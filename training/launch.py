"""Launch `python -m training` under torchrun as a subprocess and read its summary.

A flow calls `launch_local`; it never builds a multi-process Trainer in its
own process (shared/FINDINGS.md 1). Ranks are started with `--max-restarts 0`:
recovery from a lost rank is a job-level retry that resumes from the last
checkpoint (FINDINGS.md 7). `torchrun_command` also gives the command line for
several nodes, each node running it with the same c10d rendezvous endpoint.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

from training.config import load_train_config
from training.summary import read_summary

TAIL_CHARS = 8000


class TrainingFailed(RuntimeError):
    """The training job exited non-zero or timed out; `output_tail` is the end of its log."""

    def __init__(self, message: str, returncode: int | None, output_tail: str) -> None:
        super().__init__(f"{message}\n--- last output ---\n{output_tail}")
        self.returncode = returncode
        self.output_tail = output_tail


def torchrun_command(
    config_path: str | Path,
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
) -> list[str]:
    """The torchrun command line: standalone on one node, c10d rendezvous across several."""
    command = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1 and rdzv_endpoint is None:
        command.append("--standalone")
    elif rdzv_endpoint is None:
        raise ValueError(f"{nnodes} nodes need an rdzv_endpoint (host:port of one of them)")
    else:
        command += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d"]
        command += ["--rdzv-endpoint", rdzv_endpoint]
    command += ["--nproc-per-node", str(nproc_per_node), "--max-restarts", "0"]
    return [*command, "-m", "training", "--config", str(config_path)]


def launch_local(
    config_path: str | Path, nproc_per_node: int = 2, timeout_s: float = 3600.0
) -> dict[str, Any]:
    """Train with `nproc_per_node` ranks on this machine; return the parsed summary.json."""
    cfg = load_train_config(config_path)
    command = torchrun_command(config_path, nproc_per_node)
    with tempfile.TemporaryFile() as log:
        returncode = run_process_group(command, log, timeout_s)
        tail = read_tail(log)
    if returncode is None:
        raise TrainingFailed(f"training timed out after {timeout_s} s", None, tail)
    if returncode != 0:
        raise TrainingFailed(f"training exited with status {returncode}", returncode, tail)
    return read_summary(cfg.output_dir)


def run_process_group(command: list[str], log: IO[bytes], timeout_s: float) -> int | None:
    """Run `command` in its own session, output to `log`; None if it had to be killed."""
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True
    )
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        stop_process_group(process)
        return None


def stop_process_group(process: subprocess.Popen) -> None:
    """SIGTERM the launcher and its ranks (one session), then SIGKILL what is left."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def child_env() -> dict[str, str]:
    """This environment, with the directory this ballast is imported from on PYTHONPATH."""
    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    return env


def read_tail(log: IO[bytes]) -> str:
    """The last TAIL_CHARS bytes of a log, decoded leniently."""
    size = log.seek(0, os.SEEK_END)
    log.seek(max(0, size - TAIL_CHARS))
    return log.read().decode(errors="replace")
