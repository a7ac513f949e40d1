"""Run `python -m training` under torchrun as a subprocess, retry it, read its summary.

A flow calls `launch_local` or `launch_with_retries`; it never builds a
multi-process Trainer in its own process (docs/architecture.md M1). Ranks are
started with `--max-restarts 0`: torchrun's in-place restarts recovered a lost
rank in 2 of 5 trials on gloo, a job-level retry that resumes from the last
checkpoint in 4 of 4 (docs/architecture.md M7). So `launch_with_retries` relaunches the
whole job with `--resume` after a failure, into the same MLflow run: when
tracking is configured without a run id, the run is created once, before the
first attempt (which also creates a fresh sqlite store before any rank races
on it, docs/architecture.md M6). `torchrun_command` also gives the command line of one
node of several, each node running it with the same c10d rendezvous endpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from training.config import TrainConfig, dump_train_config, load_train_config
from training.summary import read_summary

TAIL_CHARS = 8000


class TrainingFailed(RuntimeError):
    """The training job exited non-zero or timed out; `output_tail` is the end of its log."""

    def __init__(self, message: str, returncode: int | None, output_tail: str) -> None:
        super().__init__(f"{message}\n--- last output ---\n{output_tail}")
        self.returncode = returncode
        self.output_tail = output_tail
        self.attempts: list[dict[str, Any]] = []


def torchrun_command(
    config_path: str | Path,
    nproc_per_node: int,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    resume: bool = False,
    rdzv_id: str = "ballast",
) -> list[str]:
    """The torchrun command line: standalone on one node, c10d rendezvous across several."""
    command = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes == 1 and rdzv_endpoint is None:
        command.append("--standalone")
    elif rdzv_endpoint is None:
        raise ValueError(f"{nnodes} nodes need an rdzv_endpoint (host:port of one of them)")
    else:
        command += ["--nnodes", str(nnodes), "--rdzv-backend", "c10d"]
        command += ["--rdzv-endpoint", rdzv_endpoint, "--rdzv-id", rdzv_id]
    command += ["--nproc-per-node", str(nproc_per_node), "--max-restarts", "0"]
    command += ["-m", "training", "--config", str(config_path)]
    return [*command, "--resume"] if resume else command


def launch_local(
    config_path: str | Path,
    nproc_per_node: int = 2,
    timeout_s: float = 3600.0,
    resume: bool = False,
) -> dict[str, Any]:
    """Train with `nproc_per_node` ranks on this machine; return the parsed summary.json.
    `resume` continues from the last checkpoint when there is one (a retry). A tracked
    config without a run id gets its run created here, before any rank starts."""
    config_path = pin_tracking_run(config_path)
    cfg = load_train_config(config_path)
    command = torchrun_command(config_path, nproc_per_node, resume=resume)
    with tempfile.TemporaryFile() as log:
        returncode = run_process_group(command, log, timeout_s)
        tail = read_tail(log)
    if returncode is None:
        raise TrainingFailed(f"training timed out after {timeout_s} s", None, tail)
    if returncode != 0:
        raise TrainingFailed(f"training exited with status {returncode}", returncode, tail)
    return read_summary(cfg.output_dir)


def launch_with_retries(
    config_path: str | Path,
    nproc_per_node: int = 2,
    retries: int = 1,
    timeout_s: float = 3600.0,
) -> dict[str, Any]:
    """`launch_local`, relaunched with resume after a failure, up to `retries` times.
    The summary gains `attempts`: returncode, seconds, end time (Unix seconds) and the
    error tail of each attempt."""
    config_path = pin_tracking_run(config_path)
    resume = load_train_config(config_path).resume
    attempts: list[dict[str, Any]] = []
    for attempt in range(retries + 1):
        started = time.monotonic()
        try:
            summary = launch_local(config_path, nproc_per_node, timeout_s, resume or attempt > 0)
        except TrainingFailed as error:
            attempts.append({"returncode": error.returncode, "error": error.output_tail[-2000:],
                             "elapsed_s": round(time.monotonic() - started, 3),
                             "ended_at": time.time()})
            if attempt == retries:
                error.attempts = attempts
                raise
            continue
        attempts.append({"returncode": 0, "elapsed_s": round(time.monotonic() - started, 3),
                         "ended_at": time.time()})
        return summary | {"attempts": attempts}
    raise AssertionError("unreachable")


def pin_tracking_run(config_path: str | Path) -> str | Path:
    """The config to launch: itself, or, when it tracks without a run id, a copy under its
    output_dir naming a run created now, so that every attempt logs into that run."""
    cfg = load_train_config(config_path)
    if cfg.tracking is None or cfg.tracking.run_id is not None:
        return config_path
    pinned = cfg.model_copy(update={"tracking": cfg.tracking.model_copy(
        update={"run_id": create_tracking_run(cfg)})})
    return dump_train_config(pinned, f"{cfg.output_dir.rstrip('/')}/train-config.pinned.yaml")


def create_tracking_run(cfg: TrainConfig) -> str:
    """Create the job's MLflow run (and the store's schema) before any rank starts."""
    from tracking.run import create_run

    assert cfg.tracking is not None
    return create_run(cfg.tracking)


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
    """SIGTERM the launcher and every descendant, then SIGKILL what is left. torchrun starts
    each rank in a session of its own, so killing the launcher's group alone misses them."""
    import psutil

    try:
        ranks = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        ranks = []
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    for rank in ranks:
        with contextlib.suppress(psutil.NoSuchProcess):
            rank.kill()


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
