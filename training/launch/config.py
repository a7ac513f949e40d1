"""Typed configuration of a training job's launch: one model per `kind`, so a job carries
only the settings of where it runs. A flow's `job:` parameters are a `LaunchConfig`.

- `LocalJob` (`kind: local`, the default): torchrun on this machine.
- `MultiNodeJob` (`kind: multinode`): this node's torchrun of several meeting at
  `rdzv_endpoint`; the launch runs on every node. It has no `retry`: the nodes' launches
  are independent processes, and a retry decided by each of them would relaunch the
  nodes apart. Whoever starts the nodes (a scheduler, a person) relaunches them all, and
  the ranks resume from the last checkpoint (`--resume`).
- `SlurmJob` (`kind: slurm`) and `KubernetesJob` (`kind: kubernetes`): one sbatch job
  or one PyTorchJob holds every node, so the submitting launcher is the one place that
  retries the whole job (training/launch/job.py).

Retries use the one `RetryPolicy` of ballast (preprocessing/toolbox/faults.py). A
setting of another kind (`namespace` on a SLURM job) is refused with the kinds it
belongs to.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    field_validator,
    model_validator,
)

from preprocessing.contract.slurm import check_sbatch_options
from preprocessing.toolbox.faults import RetryPolicy
from preprocessing.toolbox.secrets import names_a_credential


def job_retry_policy() -> RetryPolicy:
    """A job's default: one retry, after 5 s (a later one after 10 s, at most 5 min)."""
    return RetryPolicy(attempts=2, first_delay_s=5.0, max_delay_s=300.0)


RETRY_DESCRIPTION = (
    "Job-level retries: every retry relaunches the whole job, resuming from "
    "the last checkpoint into the same MLflow run; a config or data error "
    "is never retried."
)


class JobBase(BaseModel):
    """What every kind of job has: ranks per node, a time bound, the ranks' environment."""

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(description="Where the job runs: local, multinode, slurm, kubernetes.")
    num_processes_per_node: int = Field(2, gt=0, description="Ranks per node (one per GPU).")
    timeout_s: float = Field(86400.0, gt=0, description="Stop an attempt that runs this long.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment of every rank (no secrets)."
    )

    @model_validator(mode="before")
    @classmethod
    def refuse_other_kinds_settings(cls, data: Any) -> Any:
        """A field of another kind names the kinds that have it, not just "extra input"."""
        if not isinstance(data, dict):
            return data
        kind = data.get("kind", "local")
        for name in data:
            if name not in cls.model_fields:
                owners = [k for k, model in JOB_KINDS.items() if name in model.model_fields]
                where = (
                    f"a setting of {' and '.join(owners)} jobs"
                    if owners
                    else "not a launch setting"
                )
                raise ValueError(
                    f"job.{name}: {where}, not of a {kind} job"
                    f"{NO_RETRY_HINT if name == 'retry' else ''}"
                )
        return data


NO_RETRY_HINT = (
    "; the launch on each node is one attempt: whoever starts the nodes "
    "relaunches them all, with --resume"
)


class LocalJob(JobBase):
    """torchrun on this machine."""

    kind: Literal["local"] = Field("local", description="torchrun on this machine.")
    retry: RetryPolicy = Field(default_factory=job_retry_policy, description=RETRY_DESCRIPTION)

    @property
    def num_nodes(self) -> int:
        return 1

    @property
    def world_size(self) -> int:
        return self.num_processes_per_node


class NodesJob(JobBase):
    """A job of `num_nodes` machines (or pods), meeting at a c10d rendezvous."""

    num_nodes: int = Field(1, gt=0, description="Nodes (machines, or pods).")
    job_name: str = Field("ballast-train", description="Job, rendezvous id and pod prefix.")

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.num_processes_per_node


class MultiNodeJob(NodesJob):
    """This node's torchrun of `num_nodes`; run the launch once per node (no retry here:
    see the module)."""

    kind: Literal["multinode"] = Field(description="This node's torchrun of several.")
    rdzv_endpoint: str = Field(description="host:port of the c10d rendezvous (one of the nodes).")


class ScheduledJob(NodesJob):
    """A job a scheduler places (SLURM, Kubernetes): sizes it requests, retried as a whole."""

    retry: RetryPolicy = Field(default_factory=job_retry_policy, description=RETRY_DESCRIPTION)
    num_gpus_per_node: int = Field(0, ge=0, description="GPUs requested per node (0: CPU job).")
    num_cpus_per_node: int = Field(8, gt=0, description="CPUs requested per node.")

    @model_validator(mode="after")
    def written_env_holds_no_secret(self) -> ScheduledJob:
        """`env` is written into the sbatch script or the PyTorchJob: no credential there."""
        secret = sorted(name for name in self.env if names_a_credential(name))
        if secret:
            raise ValueError(
                f"env: {secret} look like credentials, and a {self.kind} job "
                f"writes env into its files; put them in {self.secret_home}"
            )
        return self

    @property
    def secret_home(self) -> str:
        return "the environment of sbatch, which passes it to the job"


class SlurmJob(ScheduledJob):
    """An sbatch job: srun starts one torchrun per node."""

    kind: Literal["slurm"] = Field(description="An sbatch job, one torchrun per node.")
    rdzv_port: int | None = Field(
        None,
        gt=0,
        description="Rendezvous port on the first node (default: one derived "
        "from the SLURM job id, so a retry never meets on the port of an earlier attempt).",
    )
    python: str | None = Field(
        None,
        description="Python inside the job (default: the interpreter running ballast, "
        "which must be at the same path on the nodes).",
    )
    image: str | None = Field(None, description="Container image (pyxis' --container-image).")
    partition: str | None = Field(None, description="SLURM partition.")
    time_limit: str = Field("04:00:00", description="SLURM time limit (HH:MM:SS).")
    account: str | None = Field(None, description="SLURM account charged (--account).")
    qos: str | None = Field(None, description="SLURM quality of service (--qos).")
    memory: str | None = Field(None, description="Memory per node (--mem), e.g. 64G.")
    constraint: str | None = Field(None, description="Node features (--constraint).")
    sbatch_options: list[str] = Field(
        default_factory=list,
        description="Further sbatch options, one per item "
        "(e.g. --reservation=ml); a space-separated string on the command line.",
    )
    output: str | None = Field(
        None,
        description="The job's output file (sbatch --output, %x and %j allowed); "
        "default: slurm/%x-%j.out under the job's output_dir when that is a local path.",
    )

    @field_validator("sbatch_options")
    @classmethod
    def options_are_flags(cls, options: list[str]) -> list[str]:
        return check_sbatch_options(options, "job.sbatch_options")


class KubernetesJob(ScheduledJob):
    """A Kubeflow PyTorchJob: one Master and `num_nodes - 1` Workers."""

    kind: Literal["kubernetes"] = Field(description="A Kubeflow PyTorchJob.")
    rdzv_port: int = Field(29500, gt=0, description="Rendezvous port on the first node.")
    python: str = Field("python", description="Python inside the image.")
    image: str = Field(description="Container image of the pods.")
    memory: str = Field("32Gi", description="Memory request and limit per pod.")
    namespace: str = Field("default", description="Kubernetes namespace.")
    secret_env: str | None = Field(
        None,
        description="Kubernetes Secret whose keys become environment variables (AWS "
        "credentials, MLFLOW_TRACKING_USERNAME/PASSWORD); never written into the manifest.",
    )

    @property
    def secret_home(self) -> str:
        return "a Kubernetes Secret named in secret_env"


JOB_KINDS: dict[str, type[JobBase]] = {
    "local": LocalJob,
    "multinode": MultiNodeJob,
    "slurm": SlurmJob,
    "kubernetes": KubernetesJob,
}
AnyJob = LocalJob | MultiNodeJob | SlurmJob | KubernetesJob


def job_kind(value: Any) -> str:
    """The kind of a job given as a mapping (no `kind`: local) or as a model."""
    if isinstance(value, dict):
        return str(value.get("kind", "local"))
    return str(getattr(value, "kind", "local"))


LaunchConfig = Annotated[
    Annotated[LocalJob, Tag("local")]
    | Annotated[MultiNodeJob, Tag("multinode")]
    | Annotated[SlurmJob, Tag("slurm")]
    | Annotated[KubernetesJob, Tag("kubernetes")],
    Discriminator(
        job_kind,
        custom_error_type="job_kind",
        custom_error_message=("job.kind: one of local, multinode, slurm, kubernetes"),
    ),
]
_JOBS: TypeAdapter[AnyJob] = TypeAdapter(LaunchConfig)


def parse_launch(data: dict[str, Any]) -> AnyJob:
    """The job of kind `data["kind"]` (local when absent), validated."""
    return _JOBS.validate_python(data)


def job_retry(job: AnyJob) -> RetryPolicy:
    """The policy the launcher retries `job` under: a multinode launch is one attempt."""
    return RetryPolicy(attempts=1) if isinstance(job, MultiNodeJob) else job.retry
