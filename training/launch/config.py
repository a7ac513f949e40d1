"""Typed configuration of a training job's launch: where it runs (`LaunchConfig.kind`)
and how it is retried (`RetryPolicy`). A flow's `job:` parameters are a LaunchConfig."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from preprocessing.contract.secrets import SECRET_NAME
from training.launch.failures import TrainingFailed


class RetryPolicy(BaseModel):
    """How often a failed job is relaunched, and after how long. Every retry resumes from
    the last checkpoint into the same MLflow run; a config or data error is never
    retried (it would fail the same way)."""

    model_config = ConfigDict(extra="forbid")

    attempts: int = Field(2, ge=1, description="Attempts in all; 1 never retries.")
    backoff_s: float = Field(
        5.0, ge=0, description="Seconds before the first retry; doubled before each further one."
    )

    def should_retry(self, failure: TrainingFailed, attempt: int) -> bool:
        """Whether attempt `attempt` (0-based), having failed so, is followed by another."""
        return failure.config_error is None and attempt + 1 < self.attempts

    def delay_s(self, attempt: int) -> float:
        """Seconds to wait after failed attempt `attempt` (0-based) before the next."""
        return self.backoff_s * 2**attempt


class LaunchConfig(BaseModel):
    """Where and how wide a training job runs, and how it is retried."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["local", "multinode", "slurm", "kubernetes"] = Field(
        "local",
        description="`local`: torchrun on this machine; `multinode`: this node's torchrun of "
        "several meeting at `rdzv_endpoint` (run the launch on each node); `slurm`: an sbatch "
        "job, one torchrun per node; `kubernetes`: a Kubeflow PyTorchJob.",
    )
    num_nodes: int = Field(1, gt=0, description="Nodes (machines, or pods).")
    num_processes_per_node: int = Field(2, gt=0, description="Ranks per node (one per GPU).")
    timeout_s: float = Field(86400.0, gt=0, description="Stop an attempt that runs this long.")
    retry: RetryPolicy = Field(default_factory=RetryPolicy, description="Job-level retries.")
    rdzv_endpoint: str | None = Field(
        None, description="`multinode`: host:port of the c10d rendezvous (one of the nodes)."
    )
    rdzv_port: int = Field(29500, gt=0, description="SLURM/Kubernetes: rendezvous port.")
    job_name: str = Field("ballast-train", description="Job, rendezvous id and pod prefix.")
    image: str | None = Field(
        None, description="Container image (Kubernetes; SLURM with pyxis' --container-image)."
    )
    python: str = Field("python", description="SLURM/Kubernetes: Python inside the job.")
    partition: str | None = Field(None, description="SLURM partition.")
    time_limit: str = Field("04:00:00", description="SLURM time limit (HH:MM:SS).")
    num_gpus_per_node: int = Field(0, ge=0, description="GPUs requested per node (0: CPU job).")
    num_cpus_per_node: int = Field(8, gt=0, description="CPUs requested per node.")
    memory: str = Field("32Gi", description="Kubernetes memory request and limit per pod.")
    namespace: str = Field("default", description="Kubernetes namespace.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment of every rank (no secrets).")
    secret_env: str | None = Field(
        None, description="Kubernetes Secret whose keys become environment variables (AWS "
        "credentials, MLFLOW_TRACKING_USERNAME/PASSWORD); never written into the manifest.")

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.num_processes_per_node

    @model_validator(mode="after")
    def fits_its_kind(self) -> LaunchConfig:
        if self.kind == "local" and self.num_nodes != 1:
            raise ValueError(f"num_nodes: a local job runs on this machine, not {self.num_nodes} "
                             "nodes; use kind multinode, slurm or kubernetes")
        if self.kind == "multinode" and self.rdzv_endpoint is None:
            raise ValueError("rdzv_endpoint: a multinode job needs the host:port where its "
                             f"{self.num_nodes} nodes meet")
        if self.kind == "kubernetes" and self.image is None:
            raise ValueError("image: a Kubernetes job needs a container image")
        return self.written_env_holds_no_secret()

    def written_env_holds_no_secret(self) -> LaunchConfig:
        """`env` is written into the sbatch script or the PyTorchJob: no credential there."""
        secret = sorted(name for name in self.env if SECRET_NAME.search(name))
        if secret and self.kind in ("slurm", "kubernetes"):
            where = ("a Kubernetes Secret named in secret_env" if self.kind == "kubernetes"
                     else "the environment of sbatch, which passes it to the job")
            raise ValueError(f"env: {secret} look like credentials, and a {self.kind} job "
                             f"writes env into its files; put them in {where}")
        return self
