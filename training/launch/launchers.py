"""Launchers behind one interface: where `python -m training` runs, one rank per process.

    launcher = make_launcher(LaunchConfig(kind="slurm", nnodes=4, nproc_per_node=8, ...))
    print(launcher.render("s3://bucket/jobs/42/train.yaml"))   # what would start the job
    summary = launcher.launch("s3://bucket/jobs/42/train.yaml")   # start it, wait, summary

- `TorchrunLauncher`: torchrun on this machine: standalone for one node, or this
  node's share of several nodes that meet at a c10d rendezvous endpoint (run it
  once per node: `node_rank` is assigned by the rendezvous).
- `SlurmLauncher`: an sbatch script in which `srun` starts one torchrun per node,
  meeting at the first node of the allocation; failed attempts are retried
  inside the allocation with `--resume` (job-level retry, docs/architecture.md M7).
- `KubernetesLauncher`: a ConfigMap holding the job's config and a Kubeflow
  PyTorchJob (one Master, `nnodes - 1` Workers) whose pods run torchrun with a
  c10d rendezvous at the master; a restarted pod resumes from the checkpoint.

Every launcher runs the same entry point with `--max-restarts 0`; none builds
a Trainer in the calling process (docs/architecture.md M1). The job's `output_dir` and
checkpoints must be where every node can reach them (a shared disk or s3://)
for the summary to be read back. Rendered examples live in infra/slurm and
infra/k8s (`python -m training.launchers render ...`).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import tempfile
from abc import ABC, abstractmethod
from typing import Any, Literal

import yaml
from fsspec.core import url_to_fs
from pydantic import BaseModel, ConfigDict, Field

from training.config import load_train_config
from training.launch import TrainingFailed, launch_local, read_tail, run_process_group
from training.launch import torchrun_command as local_torchrun_command
from training.summary import read_summary


class LaunchConfig(BaseModel):
    """Where and how wide a training job runs."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["torchrun", "slurm", "kubernetes"] = Field(
        "torchrun", description="Which launcher starts the ranks."
    )
    nnodes: int = Field(1, gt=0, description="Nodes (machines, or pods).")
    nproc_per_node: int = Field(1, gt=0, description="Ranks per node (one per GPU).")
    rdzv_endpoint: str | None = Field(
        None, description="torchrun on several nodes: host:port of the c10d rendezvous."
    )
    rdzv_port: int = Field(29500, gt=0, description="SLURM/Kubernetes: rendezvous port.")
    job_name: str = Field("ballast-train", description="Job, rendezvous id and pod prefix.")
    image: str | None = Field(
        None, description="Container image (Kubernetes; SLURM with pyxis' --container-image)."
    )
    python: str = Field("python", description="Python executable inside the job.")
    retries: int = Field(1, ge=0, description="Job-level retries, each resuming (SLURM).")
    partition: str | None = Field(None, description="SLURM partition.")
    time_limit: str = Field("04:00:00", description="SLURM time limit (HH:MM:SS).")
    gpus_per_node: int = Field(0, ge=0, description="GPUs requested per node (0: CPU job).")
    cpus_per_node: int = Field(8, gt=0, description="CPUs requested per node.")
    memory: str = Field("32Gi", description="Kubernetes memory request/limit per pod.")
    namespace: str = Field("default", description="Kubernetes namespace.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment of every rank (no secrets).")
    secret_env: str | None = Field(
        None, description="Kubernetes Secret whose keys become environment variables (e.g. "
        "AWS credentials for s3:// data and checkpoints); never written into the manifest.")


def training_args(config_uri: str, resume: bool) -> list[str]:
    return ["-m", "training", "--config", config_uri, *(["--resume"] if resume else [])]


def rendezvous_args(spec: LaunchConfig) -> list[str]:
    """torchrun's arguments for `spec.nnodes` nodes (the endpoint comes after them)."""
    return [
        "-m", "torch.distributed.run", "--nnodes", str(spec.nnodes),
        "--nproc-per-node", str(spec.nproc_per_node), "--rdzv-backend", "c10d",
        "--rdzv-id", spec.job_name, "--max-restarts", "0", "--rdzv-endpoint",
    ]


class Launcher(ABC):
    """Starts every rank of `python -m training --config <uri>` and reports the summary."""

    def __init__(self, spec: LaunchConfig) -> None:
        self.spec = spec

    @abstractmethod
    def render(self, config_uri: str, resume: bool = False) -> str:
        """What starts the job: a command line, an sbatch script or a manifest."""

    @abstractmethod
    def launch(
        self, config_uri: str, timeout_s: float = 86400.0, resume: bool = False
    ) -> dict[str, Any]:
        """Start the job, wait for it, and return its summary.json."""


class TorchrunLauncher(Launcher):
    """torchrun on this machine (one node, or this node's share of several)."""

    def command(self, config_uri: str, resume: bool = False) -> list[str]:
        spec = self.spec
        return local_torchrun_command(config_uri, spec.nproc_per_node, spec.nnodes,
                                      spec.rdzv_endpoint, resume, spec.job_name)

    def render(self, config_uri: str, resume: bool = False) -> str:
        return shlex.join(self.command(config_uri, resume))

    def launch(
        self, config_uri: str, timeout_s: float = 86400.0, resume: bool = False
    ) -> dict[str, Any]:
        if self.spec.nnodes == 1:
            return launch_local(config_uri, self.spec.nproc_per_node, timeout_s, resume)
        return run_and_read(self.command(config_uri, resume), config_uri, timeout_s)


class SlurmLauncher(Launcher):
    """An sbatch script: srun starts one torchrun per node; retries resume."""

    def render(self, config_uri: str, resume: bool = False) -> str:
        spec = self.spec
        srun = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
        srun += [f"--container-image={spec.image}"] if spec.image else []
        run = shlex.join([*srun, spec.python, *rendezvous_args(spec)])
        train = shlex.join(training_args(config_uri, resume=False))
        lines = ["#!/bin/bash", f"#SBATCH --job-name={spec.job_name}",
                 f"#SBATCH --nodes={spec.nnodes}", "#SBATCH --ntasks-per-node=1",
                 f"#SBATCH --cpus-per-task={spec.cpus_per_node}",
                 f"#SBATCH --time={spec.time_limit}", "#SBATCH --output=%x-%j.out"]
        lines += [f"#SBATCH --partition={spec.partition}"] if spec.partition else []
        lines += [f"#SBATCH --gpus-per-node={spec.gpus_per_node}"] if spec.gpus_per_node else []
        lines += ["set -uo pipefail"]
        lines += [f"export {key}={shlex.quote(value)}" for key, value in spec.env.items()]
        lines += ['HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                  f'ENDPOINT="$HEAD:{spec.rdzv_port}"',
                  f"RESUME={'--resume' if resume else ''}",
                  f"for attempt in $(seq 0 {spec.retries}); do",
                  f'  {run} "$ENDPOINT" {train} $RESUME && exit 0',
                  '  echo "attempt $attempt failed; retrying from the last checkpoint" >&2',
                  "  RESUME=--resume", "done", "exit 1"]
        return "\n".join(lines) + "\n"

    def launch(
        self, config_uri: str, timeout_s: float = 86400.0, resume: bool = False
    ) -> dict[str, Any]:
        sbatch = require_tool("sbatch")
        with tempfile.NamedTemporaryFile("w", suffix=".sbatch", delete=False) as script:
            script.write(self.render(config_uri, resume))
        return run_and_read([sbatch, "--wait", script.name], config_uri, timeout_s)


class KubernetesLauncher(Launcher):
    """A ConfigMap with the job's config and a PyTorchJob running torchrun in each pod."""

    def manifests(self, config_uri: str) -> list[dict[str, Any]]:
        spec = self.spec
        if spec.image is None:
            raise ValueError("image: a Kubernetes job needs a container image")
        config_map = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{spec.job_name}-config", "namespace": spec.namespace},
            "data": {"train.yaml": read_text(config_uri)},
        }
        replicas = {"Master": replica_spec(spec, 1)}
        if spec.nnodes > 1:
            replicas["Worker"] = replica_spec(spec, spec.nnodes - 1)
        job = {
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": spec.job_name, "namespace": spec.namespace},
            "spec": {"runPolicy": {"backoffLimit": spec.retries, "cleanPodPolicy": "None"},
                     "nprocPerNode": str(spec.nproc_per_node), "pytorchReplicaSpecs": replicas},
        }
        return [config_map, job]

    def render(self, config_uri: str, resume: bool = True) -> str:
        return yaml.dump_all(self.manifests(config_uri), Dumper=ManifestDumper, sort_keys=False)

    def launch(
        self, config_uri: str, timeout_s: float = 86400.0, resume: bool = True
    ) -> dict[str, Any]:
        kubectl = require_tool("kubectl")
        subprocess.run([kubectl, "apply", "-f", "-"], input=self.render(config_uri).encode(),
                       check=True)
        wait = [kubectl, "wait", "-n", self.spec.namespace, f"pytorchjob/{self.spec.job_name}",
                "--for=condition=Succeeded", f"--timeout={int(timeout_s)}s"]
        return run_and_read(wait, config_uri, timeout_s + 60)


def replica_spec(spec: LaunchConfig, replicas: int) -> dict[str, Any]:
    """One replica type of the PyTorchJob: pods running torchrun, config mounted from the map.
    Pods always pass --resume: a restarted pod continues from the last checkpoint, and a
    first start finds none and starts fresh."""
    endpoint = f"$(MASTER_ADDR):{spec.rdzv_port}"
    command = [spec.python, *rendezvous_args(spec), endpoint,
               *training_args("/etc/ballast/train.yaml", resume=True)]
    resources: dict[str, Any] = {"cpu": str(spec.cpus_per_node), "memory": spec.memory}
    if spec.gpus_per_node:
        resources["nvidia.com/gpu"] = str(spec.gpus_per_node)
    container: dict[str, Any] = {
        "name": "pytorch", "image": spec.image, "command": command,
        "env": [{"name": k, "value": v} for k, v in spec.env.items()],
        "resources": {"requests": resources, "limits": dict(resources)},
        "volumeMounts": [{"name": "config", "mountPath": "/etc/ballast"}],
    }
    if spec.secret_env:
        container["envFrom"] = [{"secretRef": {"name": spec.secret_env}}]
    volume = {"name": "config", "configMap": {"name": f"{spec.job_name}-config"}}
    return {"replicas": replicas, "restartPolicy": "OnFailure",
            "template": {"spec": {"containers": [container], "volumes": [volume]}}}


class ManifestDumper(yaml.SafeDumper):
    """YAML as a person writes it: multi-line strings as `|` blocks, no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def represent_text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


ManifestDumper.add_representer(str, represent_text)


def make_launcher(spec: LaunchConfig) -> Launcher:
    kinds: dict[str, type[Launcher]] = {
        "torchrun": TorchrunLauncher, "slurm": SlurmLauncher, "kubernetes": KubernetesLauncher}
    return kinds[spec.kind](spec)


def require_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"`{name}` is not on PATH: render the job and submit it where it is")
    return path


def read_text(uri: str) -> str:
    fs, path = url_to_fs(uri)
    return str(fs.cat_file(path).decode())


def run_and_read(command: list[str], config_uri: str, timeout_s: float) -> dict[str, Any]:
    """Run a launcher command to completion, then read the job's summary."""
    with tempfile.TemporaryFile() as log:
        returncode = run_process_group(command, log, timeout_s)
        tail = read_tail(log)
    if returncode != 0:
        raise TrainingFailed(f"{command[0]} ended with status {returncode}", returncode, tail)
    return read_summary(load_train_config(config_uri).output_dir)


def main(argv: list[str] | None = None) -> int:
    """`python -m training.launchers render --config URI --kind slurm --nnodes 2 ...`"""
    parser = argparse.ArgumentParser(prog="python -m training.launchers")
    parser.add_argument("action", choices=["render", "launch"])
    parser.add_argument("--config", required=True, help="The job's TrainConfig (path or URI).")
    parser.add_argument("--resume", action="store_true", help="Resume from the last checkpoint.")
    for name, field in LaunchConfig.model_fields.items():
        if name != "env":
            parser.add_argument(f"--{name.replace('_', '-')}", dest=name, default=field.default,
                                type=str if field.annotation is not int else int,
                                help=field.description)
    args = vars(parser.parse_args(argv))
    action, config, resume = args.pop("action"), args.pop("config"), args.pop("resume")
    launcher = make_launcher(LaunchConfig.model_validate(args))
    if action == "render":
        print(launcher.render(config, resume), end="")
    else:
        print(launcher.launch(config, resume=resume))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
