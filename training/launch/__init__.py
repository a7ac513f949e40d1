"""Launching a training job: one `Launcher` interface, one torchrun command, one retry policy.

    from training.launch import LocalJob, run_job
    summary = run_job(train_config, LocalJob(num_processes_per_node=2))

- `config.py`: `LaunchConfig`, one model per `kind` (`LocalJob`, `MultiNodeJob`,
  `SlurmJob`, `KubernetesJob`), each with only its own settings; `retry` is ballast's
  one `RetryPolicy` (preprocessing/toolbox/faults.py).
- `job.py`: `run_job`, the one place that pins the dataset version, the MLflow run
  and the credentials, retries, and decides to resume; `make_launcher` by kind.
- `launchers.py`, `slurm.py`, `kubernetes.py`: the launchers; `command.py`: the
  torchrun command line they all run; `processes.py`: the attempt's process group.
- `failures.py`: `TrainingFailed`, and how a rank's config or data error (exit
  status 2, never retried) reaches the launcher as one line.
- `python -m training.launch render|launch --config URI --kind slurm ...`: the
  rendered examples in infra/slurm and infra/k8s are made with it.
"""

from preprocessing.toolbox.faults import RetryPolicy
from training.launch.config import (
    AnyJob,
    KubernetesJob,
    LaunchConfig,
    LocalJob,
    MultiNodeJob,
    SlurmJob,
    parse_launch,
)
from training.launch.failures import TrainingFailed
from training.launch.job import make_launcher, run_job

__all__ = [
    "AnyJob",
    "KubernetesJob",
    "LaunchConfig",
    "LocalJob",
    "MultiNodeJob",
    "RetryPolicy",
    "SlurmJob",
    "TrainingFailed",
    "make_launcher",
    "parse_launch",
    "run_job",
]
