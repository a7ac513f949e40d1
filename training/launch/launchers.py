"""The `Launcher` interface and the two torchrun launchers.

A launcher starts every rank of one attempt of `python -m training --config URI`
and waits for it; it neither retries nor decides to resume (training/launch/job.py
does both, once for every kind). None builds a Trainer in the calling process
(docs/architecture.md M1).

- `LocalTorchrunLauncher` (`kind: local`): torchrun --standalone on this machine.
- `MultiNodeTorchrunLauncher` (`kind: multinode`): this node's torchrun of
  `num_nodes` meeting at a c10d rendezvous endpoint; run the launch once per node.
- `SlurmLauncher` (training/launch/slurm.py) and `KubernetesLauncher`
  (training/launch/kubernetes.py).
"""

from __future__ import annotations

import shlex
import shutil
import sys
from abc import ABC, abstractmethod
from typing import IO, Generic, TypeVar

from training.launch.command import torchrun_command
from training.launch.config import JobBase, LocalJob, MultiNodeJob
from training.launch.processes import child_env, run_process_group

Job = TypeVar("Job", bound=JobBase)


class Launcher(ABC, Generic[Job]):
    """Starts every rank of one attempt of a job of one kind and waits for it to end."""

    def __init__(self, spec: Job) -> None:
        self.spec = spec
        self.job_id: str | None = None  # the batch system's id of the last attempt's job

    @abstractmethod
    def render(self, config_uri: str, resume: bool = False) -> str:
        """What starts one attempt: a command line, an sbatch script or manifests."""

    @abstractmethod
    def run(self, config_uri: str, resume: bool, env: dict[str, str], log: IO[bytes]) -> int | None:
        """Run one attempt to its end, its output to `log`; the exit status, or None when
        it ran past `spec.timeout_s`. `env`: secrets for the ranks' environment (never
        written to a file)."""

    def describe_attempt(self) -> str:
        """What a failure message adds about the last attempt (` in SLURM job 7 (...)`):
        where it ran and where its own output is; empty when nothing more is known."""
        return ""


class TorchrunLauncher(Launcher[Job]):
    """torchrun on this machine: what the local and the multinode launcher share."""

    @abstractmethod
    def rdzv_endpoint(self) -> str | None:
        """Where the nodes meet; None: this machine alone (a standalone rendezvous)."""

    def command(self, config_uri: str, resume: bool = False) -> list[str]:
        return torchrun_command(self.spec, config_uri, resume, sys.executable, self.rdzv_endpoint())

    def render(self, config_uri: str, resume: bool = False) -> str:
        return shlex.join(self.command(config_uri, resume))

    def run(self, config_uri: str, resume: bool, env: dict[str, str], log: IO[bytes]) -> int | None:
        return run_process_group(
            self.command(config_uri, resume), log, self.spec.timeout_s, child_env(env)
        )


class LocalTorchrunLauncher(TorchrunLauncher[LocalJob]):
    """torchrun --standalone on this machine, `num_processes_per_node` ranks."""

    def rdzv_endpoint(self) -> None:
        return None


class MultiNodeTorchrunLauncher(TorchrunLauncher[MultiNodeJob]):
    """This node's torchrun of `num_nodes`, meeting at `spec.rdzv_endpoint`."""

    def rdzv_endpoint(self) -> str:
        return self.spec.rdzv_endpoint


def require_tool(name: str) -> str:
    """The path of a command-line tool a launcher needs, or a clear error."""
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"`{name}` is not on PATH: render the job and submit it where it is")
    return path
