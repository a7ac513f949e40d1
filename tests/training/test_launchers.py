"""Rendered launch files: the torchrun command line, the SLURM sbatch script and the
Kubernetes PyTorchJob carry the configured nodes, processes, image and command."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from training.config import TrainConfig, dump_train_config, load_train_config
from training.launchers import (
    KubernetesLauncher,
    LaunchConfig,
    SlurmLauncher,
    TorchrunLauncher,
    make_launcher,
)

SPEC = LaunchConfig(nnodes=3, nproc_per_node=4, image="registry.example/ballast:1.2",
                    partition="gpu", gpus_per_node=4, job_name="job-7", retries=2,
                    env={"NCCL_DEBUG": "WARN"})


@pytest.fixture
def config_path(tmp_path: Path) -> str:
    cfg = TrainConfig(dataset="s3://data/root", output_dir="s3://runs/job-7", strategy="fsdp")
    return dump_train_config(cfg, tmp_path / "train.yaml")


def training_part(command: list[str]) -> list[str]:
    return command[command.index("training") - 1:]


def test_torchrun_render_is_the_command_it_runs(config_path: str) -> None:
    """The rendered line splits back into exactly the command the launcher would run:
    c10d rendezvous at the endpoint, the configured nodes and processes, no restarts."""
    spec = SPEC.model_copy(update={"rdzv_endpoint": "10.0.0.1:29400"})
    launcher = TorchrunLauncher(spec)
    command = launcher.command(config_path, resume=True)
    assert shlex.split(launcher.render(config_path, resume=True)) == command
    assert command[command.index("--nnodes") + 1] == "3"
    assert command[command.index("--nproc-per-node") + 1] == "4"
    assert command[command.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
    assert training_part(command) == ["-m", "training", "--config", config_path, "--resume"]


def test_sbatch_script_parses_and_carries_the_job(config_path: str) -> None:
    """The sbatch script is valid bash; its header asks for the nodes, GPUs and partition;
    srun starts one torchrun per node in the image, with the configured processes per node,
    meeting at the first node; failed attempts are retried with --resume."""
    script = SlurmLauncher(SPEC).render(config_path)
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=script.encode(), check=True)
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert {"#SBATCH --nodes=3", "#SBATCH --gpus-per-node=4", "#SBATCH --partition=gpu",
            "#SBATCH --ntasks-per-node=1", "#SBATCH --job-name=job-7"} <= set(header)
    srun = next(line for line in script.splitlines() if line.strip().startswith("srun"))
    command = shlex.split(srun.replace("$RESUME", "").replace("&& exit 0", ""))
    assert "--container-image=registry.example/ballast:1.2" in command
    assert command[command.index("--nproc-per-node") + 1] == "4"
    assert command[command.index("--nnodes") + 1] == "3"
    assert command[command.index("--rdzv-endpoint") + 1] == "$ENDPOINT"
    assert training_part(command) == ["-m", "training", "--config", config_path]
    assert "for attempt in $(seq 0 2)" in script and "RESUME=--resume" in script
    assert "export NCCL_DEBUG=WARN" in script


def test_pytorchjob_manifest_parses_and_carries_the_job(config_path: str) -> None:
    """The manifest is a ConfigMap holding the job's config (the same TrainConfig) and a
    PyTorchJob of one Master and nnodes - 1 Workers, each pod running torchrun with the
    configured image, processes, GPUs and rendezvous, resuming when restarted."""
    config_map, job = yaml.safe_load_all(KubernetesLauncher(SPEC).render(config_path))
    assert config_map["kind"] == "ConfigMap" and job["kind"] == "PyTorchJob"
    assert TrainConfig.model_validate(yaml.safe_load(config_map["data"]["train.yaml"])) == (
        load_train_config(config_path))
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] + replicas["Worker"]["replicas"] == 3
    assert job["spec"]["nprocPerNode"] == "4" and job["spec"]["runPolicy"]["backoffLimit"] == 2
    for replica in replicas.values():
        pod = replica["template"]["spec"]
        container = pod["containers"][0]
        assert container["image"] == "registry.example/ballast:1.2"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
        command = container["command"]
        assert command[command.index("--nproc-per-node") + 1] == "4"
        assert command[command.index("--nnodes") + 1] == "3"
        assert command[command.index("--rdzv-endpoint") + 1] == "$(MASTER_ADDR):29500"
        assert training_part(command) == [
            "-m", "training", "--config", "/etc/ballast/train.yaml", "--resume"]
        assert pod["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]


def test_launchers_refuse_what_they_cannot_do(config_path: str) -> None:
    """A Kubernetes job without an image and a SLURM launch without sbatch fail with a
    message naming what is missing; several torchrun nodes need a rendezvous endpoint."""
    with pytest.raises(ValueError, match="image"):
        make_launcher(SPEC.model_copy(update={"kind": "kubernetes", "image": None})).render(
            config_path)
    if shutil.which("sbatch") is None:
        with pytest.raises(RuntimeError, match="sbatch"):
            make_launcher(SPEC.model_copy(update={"kind": "slurm"})).launch(config_path)
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        TorchrunLauncher(SPEC).command(config_path)


INFRA = Path(__file__).resolve().parents[2] / "infra"


def without_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("# "))


def test_shipped_examples_are_current_renders() -> None:
    """infra/k8s/train.yaml is a valid TrainConfig, and infra/k8s/pytorchjob.yaml and
    infra/slurm/train.sbatch are exactly what the launchers render from the arguments
    their headers give (so the examples cannot drift from the code)."""
    config = str(INFRA / "k8s" / "train.yaml")
    assert load_train_config(config).strategy == "fsdp"
    kubernetes = LaunchConfig(kind="kubernetes", nnodes=2, nproc_per_node=8, gpus_per_node=8,
                              cpus_per_node=64, memory="512Gi", secret_env="ballast-s3",
                              image="registry.example.com/ballast:0.1.0",
                              job_name="ballast-train")
    shipped = (INFRA / "k8s" / "pytorchjob.yaml").read_text()
    assert without_comments(shipped) == without_comments(make_launcher(kubernetes).render(config))
    slurm = LaunchConfig(kind="slurm", nnodes=4, nproc_per_node=8, gpus_per_node=8,
                         cpus_per_node=64, partition="gpu", time_limit="12:00:00", retries=2,
                         job_name="ballast-train")
    rendered = make_launcher(slurm).render("/shared/ballast/jobs/train.yaml")
    assert without_comments((INFRA / "slurm" / "train.sbatch").read_text()) == (
        without_comments(rendered))
