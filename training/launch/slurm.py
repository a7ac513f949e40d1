"""`SlurmLauncher` (`kind: slurm`): an sbatch script in which srun starts one torchrun
per node, meeting at the first node of the allocation.

The script is one attempt (no retry loop inside: training/launch/job.py retries,
resuming). The launcher submits it with `sbatch --parsable`, polls the job until SLURM
reports it ended, and ends it itself (`scancel`, then a wait until SLURM reports it ended)
when the attempt times out, on Ctrl-C or SIGTERM, or on any error here: no job outlives its
attempt, so a retry never runs beside it (preprocessing/contract/slurm.py). A submission
sbatch refuses (partition, account, limits) fails the job at once, never retried.

- The ranks run the interpreter running ballast unless `job.python` names another (the
  same path on the nodes: a shared file system or a container image).
- The job's output goes to `job.output`, by default `slurm/%x-%j.out` under the job's
  `output_dir` (when local); a failure names the job, its state and that file, with the
  file's last lines.
- sbatch passes this environment to the job (its default `--export=ALL`), which is how the
  tracking credentials reach the ranks without being written into the script, less what
  names a path only this host has (`job_environment`).
- The rendezvous port is derived from the job id unless `job.rdzv_port` fixes it, so a
  retry never meets on the port of an earlier attempt.

The job's `output_dir` must be on storage every node and the submitting host reach (a
shared file system or s3://).
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from preprocessing.contract.slurm import (
    JobState,
    SubmissionRefused,
    cancel_and_wait,
    expand_pattern,
    job_environment,
    job_state,
    submit,
    wait_for_end,
)
from training.config import load_train_config
from training.launch.command import torchrun_command
from training.launch.config import SlurmJob
from training.launch.failures import TrainingFailed
from training.launch.launchers import Launcher
from training.launch.processes import child_env

ENDPOINT = "$ENDPOINT"
# A port per job id: two attempts of one job never meet on the same port.
JOB_PORT = "$((20000 + SLURM_JOB_ID % 20000))"
POLL_S = 2.0
logger = logging.getLogger(__name__)
ENDING_LINES = 3
ENDING_CHARS = 300
TAIL_BYTES = 8000


class SlurmLauncher(Launcher[SlurmJob]):
    """An sbatch script: srun starts one torchrun per node."""

    def __init__(self, spec: SlurmJob) -> None:
        super().__init__(spec)
        self.last_state: JobState | None = None
        self.last_output = ""

    def render(self, config_uri: str, resume: bool = False, output: str | None = None) -> str:
        spec = self.spec
        srun = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
        srun += [f"--container-image={spec.image}"] if spec.image else []
        python = spec.python or sys.executable
        torchrun = torchrun_command(spec, config_uri, resume, python, ENDPOINT)
        # The endpoint is known inside the allocation only: a shell variable, double-quoted.
        run = shlex.join([*srun, *torchrun]).replace(shlex.quote(ENDPOINT), f'"{ENDPOINT}"')
        lines = [
            "#!/bin/bash",
            *sbatch_header(spec, output or spec.output or "%x-%j.out"),
            "set -euo pipefail",
        ]
        lines += [f"export {key}={shlex.quote(value)}" for key, value in spec.env.items()]
        lines += [
            'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
            f'ENDPOINT="$HEAD:{spec.rdzv_port or JOB_PORT}"',
            run,
        ]
        return "\n".join(lines) + "\n"

    def run(self, config_uri: str, resume: bool, env: dict[str, str], log: IO[bytes]) -> int | None:
        self.last_state, self.last_output, self.job_id = None, "", None
        output = self.output_pattern(config_uri)
        with tempfile.TemporaryDirectory() as scratch:
            script = os.path.join(scratch, f"{self.spec.job_name}.sbatch")
            Path(script).write_text(self.render(config_uri, resume, output))
            try:
                job_id = submit(
                    script,
                    job_environment(child_env(env)),
                    f"the training job {self.spec.job_name}",
                )
            except SubmissionRefused as refused:
                raise TrainingFailed(
                    "training not started", None, "", config_error=str(refused)
                ) from refused
        log.write(f"Submitted batch job {job_id}\n".encode())
        self.job_id = job_id
        where = expand_pattern(output, job_id, self.spec.job_name)
        logger.info(
            "training job %s: SLURM job %s, its output %s", self.spec.job_name, job_id, where
        )
        return self.wait(job_id, log)

    def wait(self, job_id: str, log: IO[bytes]) -> int | None:
        """Wait for the job's end (cancelling it at the timeout or on any interruption);
        its exit status (at least 1 for a job that did not complete), None on timeout."""
        state = None
        try:
            with sigterm_raises():
                state = wait_for_end(job_id, self.spec.timeout_s, POLL_S)
        finally:
            if state is None:  # timed out, interrupted, or an error here: end the job
                cancel_and_wait([job_id])
            self.last_state = state or job_state(job_id)
            self.last_output = read_output_tail(self.last_state)
            log.write(self.last_output.encode())
        if state is None:
            return None
        if state.state == "COMPLETED":
            return state.exit_code or 0
        return state.exit_code or 1

    def describe_attempt(self) -> str:
        state = self.last_state
        if state is None:
            return ""
        ending = output_ending(self.last_output)
        return f" in {state.describe()}" + (f", ending: {ending}" if ending else "")

    def output_pattern(self, config_uri: str) -> str:
        """The job's output file pattern: `job.output`, else `slurm/%x-%j.out` under the
        job's local output_dir, else in the working directory (an absolute path, which
        the failure names); its directory made."""
        output = self.spec.output
        if output is None:
            fs, location = url_to_fs(load_train_config(config_uri).output_dir)
            base = location if isinstance(fs, LocalFileSystem) else os.getcwd()
            output = os.path.join(base, "slurm", "%x-%j.out")
        output = os.path.abspath(output)
        os.makedirs(os.path.dirname(output), exist_ok=True)
        return output


def sbatch_header(spec: SlurmJob, output: str) -> list[str]:
    """The `#SBATCH` lines of the job: its sizes and the site's settings."""
    header = [
        f"--job-name={spec.job_name}",
        f"--nodes={spec.num_nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={spec.num_cpus_per_node}",
        f"--time={spec.time_limit}",
        f"--output={output}",
    ]
    optional: dict[str, Any] = {
        "partition": spec.partition,
        "account": spec.account,
        "qos": spec.qos,
        "mem": spec.memory,
        "constraint": spec.constraint,
        "gpus-per-node": spec.num_gpus_per_node or None,
    }
    header += [f"--{name}={value}" for name, value in optional.items() if value is not None]
    return [f"#SBATCH {option}" for option in [*header, *spec.sbatch_options]]


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """SIGTERM raises SystemExit here (in the main thread), so the wait's cleanup cancels
    the job as on Ctrl-C; the previous handler is put back on exit."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def read_output_tail(state: JobState | None) -> str:
    """The end of the job's output file, or a line saying why there is none."""
    if state is None:
        return "(the job is no longer known to SLURM: its output file is unknown)\n"
    try:
        with open(state.output_path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - TAIL_BYTES))
            return handle.read().decode(errors="replace")
    except OSError as error:
        return f"(its output {state.output_path} could not be read: {error})\n"


def output_ending(text: str) -> str:
    """The last few lines of an output that say something (torchrun's rules of `=` and
    `-` left out), joined by ` | `."""
    lines = [
        line.strip()
        for line in text.splitlines()
        if line.strip() and line.strip().strip("=-") and "Traceback" not in line
    ]
    ending = " | ".join(lines[-ENDING_LINES:])
    return ending if len(ending) <= ENDING_CHARS else "..." + ending[-ENDING_CHARS:]
