"""Talking to SLURM: submit a job, read its state, cancel it and wait for its end; the one
home of what a training job (training/launch/slurm.py) and the Dask workers of
`dask.kind: slurm` (preprocessing/driver/cluster.py) share.

- `submit` runs `sbatch --parsable` and returns the job id. A submission sbatch refuses
  for a reason of the job itself (a partition, account or QOS that does not exist, a
  request over the limits: "Batch job submission failed: ...") raises `SubmissionRefused`,
  a config error that no retry changes; a controller that does not answer is transient.
- `job_state` reads `scontrol show job` (kept by slurmctld for MinJobAge after the end,
  with no accounting database needed): state, pending reason, exit code, output paths;
  `slurm_notice` the line slurmstepd wrote into the job's stderr when it ended the job
  (`*** JOB 7 ON node CANCELLED AT ... DUE TO TIME LIMIT ***`).
- `cancel_and_wait` is how an attempt ends early (timeout, Ctrl-C, SIGTERM, a failure):
  `scancel`, then wait until SLURM reports every job ended, so that a retry never runs
  beside the attempt it replaces.
- `job_environment`: sbatch passes the submitter's environment into the job (its default
  `--export=ALL`); the variables that name a path only the submitting host has (the log
  config of a `ballast` command, files in its /tmp, which a job with a private /tmp per job
  does not see) are left out.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from preprocessing.toolbox.faults import ConfigError, TransientError

# States after which a job runs no more (squeue's and scontrol's names).
ENDED_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)
# Set by `ballast` commands for their Dask workers (flows/console.py): a file of this host.
HOST_ONLY_VARIABLES = frozenset({"DASK_DISTRIBUTED__LOGGING"})
REFUSAL_MARK = "Batch job submission failed"
CANCEL_WAIT_S = 120.0
COMMAND_TIMEOUT_S = 60.0
NOTICE_BYTES = 64_000  # the end of a job's stderr, where slurmstepd says why it ended it


class SubmissionRefused(ConfigError, RuntimeError):
    """sbatch refused the job as asked for (never retried): `reason` is sbatch's error."""

    def __init__(self, reason: str, what: str) -> None:
        self.reason = reason
        super().__init__(f"sbatch refused {what}: {reason}")


class SlurmUnavailable(TransientError, RuntimeError):
    """A SLURM command failed for a reason of the cluster (the controller did not answer)."""


@dataclass(frozen=True)
class JobState:
    """What `scontrol show job` says of one job."""

    job_id: str
    state: str
    reason: str
    exit_code: int | None
    output_path: str
    time_limit: str
    error_path: str = ""  # where the job's stderr goes (its output file unless set apart)

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    def describe(self) -> str:
        """`SLURM job 7 (FAILED, exit code 1; its output: /out/ballast-train-7.out)`."""
        if self.state == "PENDING":
            what = f"PENDING: {self.reason}"
        elif self.state == "TIMEOUT":
            what = f"TIMEOUT: it reached its time limit of {self.time_limit}"
        elif self.exit_code:
            what = f"{self.state}, exit code {self.exit_code}"
        else:
            what = self.state
        return f"SLURM job {self.job_id} ({what}; its output: {self.output_path})"


def check_sbatch_options(options: list[str], field: str) -> list[str]:
    """`options` if each item is one sbatch option (`--name=value`), so that a value is
    never taken for an option; else a ValueError naming `field` and the item."""
    for option in options:
        if not option.startswith("-"):
            raise ValueError(
                f"{field}: {option!r} is not an sbatch option (write --name=value, one per item)"
            )
    return options


def require_command(name: str) -> str:
    """The path of a SLURM command, or a clear error where SLURM is not installed."""
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"`{name}` is not on PATH: render the job and submit it where it is")
    return path


def run_command(command: list[str], env: Mapping[str, str] | None = None) -> str:
    """Run a SLURM command; its stdout, or `SlurmUnavailable` with its stderr."""
    done = subprocess.run(
        [require_command(command[0]), *command[1:]],
        capture_output=True,
        text=True,
        env=None if env is None else dict(env),
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise SlurmUnavailable(f"{' '.join(command[:2])} failed: {error_line(done.stderr)}")
    return done.stdout


def error_line(stderr: str) -> str:
    """sbatch's most telling error line: the refusal's, else the last one."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    refusals = [line for line in lines if REFUSAL_MARK in line or "failure:" in line]
    return (refusals or lines or ["(no output)"])[-1]


def submit(script: str, env: Mapping[str, str], what: str, test_only: bool = False) -> str:
    """Submit the job script `script` (a path) with environment `env`; its job id.
    `test_only`: ask sbatch whether it would accept the job, submitting nothing (returns
    ""). A refusal of the job itself raises `SubmissionRefused` naming `what`."""
    flag = "--test-only" if test_only else "--parsable"
    done = subprocess.run(
        [require_command("sbatch"), flag, script],
        capture_output=True,
        text=True,
        env=dict(env),
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        line = error_line(done.stderr)
        if REFUSAL_MARK in line or "failure:" in line:
            raise SubmissionRefused(line.rsplit(":", 1)[-1].strip(), what)
        raise SlurmUnavailable(f"sbatch could not submit {what}: {line}")
    return "" if test_only else done.stdout.strip().split(";", 1)[0]


def job_state(job_id: str) -> JobState | None:
    """The job's state, or None once slurmctld has forgotten it (MinJobAge after its end)."""
    done = subprocess.run(
        [require_command("scontrol"), "show", "job", "-o", job_id],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0 or not done.stdout.strip():
        return None
    fields = dict(re.findall(r"(\w+)=(\S*)", done.stdout))
    code = fields.get("ExitCode", "")
    name = fields.get("JobName", "")
    output = expand_pattern(fields.get("StdOut", "(unknown)"), job_id, name)
    return JobState(
        job_id,
        fields.get("JobState", "UNKNOWN"),
        fields.get("Reason", "None"),
        int(code.split(":", 1)[0]) if code[:1].isdigit() else None,
        output,
        fields.get("TimeLimit", "(unknown)"),
        expand_pattern(fields.get("StdErr", output), job_id, name),
    )


def slurm_notice(state: JobState) -> str | None:
    """What SLURM itself wrote into the job's stderr when it ended the job, e.g.
    `*** JOB 68 ON vm CANCELLED AT 2026-12-03T12:05:13 DUE TO TIME LIMIT ***`; None when
    the file holds no such line or cannot be read."""
    try:
        with open(state.error_path or state.output_path, "rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - NOTICE_BYTES))
            text = handle.read().decode(errors="replace")
    except OSError:
        return None
    notices = re.findall(r"\*\*\* JOB \S+ ON .*? \*\*\*", text)
    return notices[-1] if notices else None


def expand_pattern(path: str, job_id: str, job_name: str) -> str:
    """An output file pattern of sbatch with the job's own values (%j, %J, %A, %x);
    scontrol shows some of them unexpanded."""
    values = {"j": job_id, "J": job_id, "A": job_id, "x": job_name, "%": "%"}
    return re.sub(r"%([jJAx%])", lambda match: values[match.group(1)], path)


def wait_for_end(job_id: str, timeout_s: float, poll_s: float = 1.0) -> JobState | None:
    """Poll until the job ended; its last state, or None if it still runs at `timeout_s`
    (a job slurmctld no longer knows is taken as ended)."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = job_state(job_id)
        if state is None or state.ended:
            return state
        if time.monotonic() >= deadline:
            return None
        time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))


def cancel_and_wait(job_ids: Iterable[str], timeout_s: float = CANCEL_WAIT_S) -> list[str]:
    """`scancel` the jobs, then wait until SLURM reports each ended; the ids of those still
    running at `timeout_s` (empty when all ended)."""
    ids = [job_id for job_id in job_ids if job_id]
    if not ids:
        return []
    subprocess.run(
        [require_command("scancel"), *ids],
        capture_output=True,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    deadline = time.monotonic() + timeout_s
    return [
        job_id
        for job_id in ids
        if wait_for_end(job_id, max(0.0, deadline - time.monotonic())) is None
    ]


def host_only_variables(environ: Mapping[str, str]) -> list[str]:
    """The variables of `environ` that name a path only this host has: ballast's own
    (HOST_ONLY_VARIABLES) and any whose value holds a path in this host's temporary
    directory (a job with a private /tmp does not see it)."""
    temporary = tempfile.gettempdir().rstrip("/") + "/"
    return sorted(
        name for name, value in environ.items() if name in HOST_ONLY_VARIABLES or temporary in value
    )


def job_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`environ` (default: this process's) without its host-only variables: what sbatch
    may pass into a job."""
    environ = os.environ if environ is None else environ
    dropped = set(host_only_variables(environ))
    return {name: value for name, value in environ.items() if name not in dropped}
