"""What the launchers start, without starting it: the torchrun command line, the SLURM
sbatch script and the Kubernetes PyTorchJob carry the configured nodes, processes, image
and command, each is one attempt, and the shipped examples are current renders; the
retry policy and the checks that refuse what a launcher cannot do."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from tracking.config import TrackingConfig
from training.config import TrainConfig, dump_train_config, load_train_config
from training.launch import LaunchConfig, RetryPolicy, TrainingFailed, make_launcher, run_job
from training.launch.__main__ import main as launch_main
from training.launch.kubernetes import KubernetesLauncher
from training.launch.launchers import LocalTorchrunLauncher, MultiNodeTorchrunLauncher
from training.launch.slurm import SlurmLauncher

SPEC = LaunchConfig(kind="slurm", num_nodes=3, num_processes_per_node=4, partition="gpu",
                    image="registry.example/ballast:1.2", num_gpus_per_node=4,
                    job_name="job-7", env={"NCCL_DEBUG": "WARN"})


@pytest.fixture
def config_path(tmp_path: Path) -> str:
    cfg = TrainConfig(dataset="s3://data/root", output_dir="s3://runs/job-7", strategy="fsdp")
    return dump_train_config(cfg, tmp_path / "train.yaml")


def training_part(command: list[str]) -> list[str]:
    return command[command.index("training") - 1:]


def test_multinode_render_is_the_command_it_runs(config_path: str) -> None:
    """The rendered line splits back into exactly the command the launcher would run:
    c10d rendezvous at the endpoint, the configured nodes and processes, no restarts."""
    spec = SPEC.model_copy(update={"kind": "multinode", "rdzv_endpoint": "10.0.0.1:29400"})
    launcher = MultiNodeTorchrunLauncher(spec)
    command = launcher.command(config_path, resume=True)
    assert shlex.split(launcher.render(config_path, resume=True)) == command
    assert command[command.index("--nnodes") + 1] == "3" and "--standalone" not in command
    assert command[command.index("--nproc-per-node") + 1] == "4"
    assert command[command.index("--rdzv-endpoint") + 1] == "10.0.0.1:29400"
    assert command[command.index("--max-restarts") + 1] == "0"
    assert training_part(command) == ["-m", "training", "--config", config_path, "--resume"]


def test_local_torchrun_is_standalone_and_never_restarts() -> None:
    """One node: a standalone rendezvous, the configured processes, no restarts; the
    training arguments end the line, with --resume only when asked."""
    command = LocalTorchrunLauncher(LaunchConfig(num_processes_per_node=3)).command("c.yaml")
    assert "--standalone" in command and "--rdzv-endpoint" not in command
    assert command[command.index("--nproc-per-node") + 1] == "3"
    assert command[command.index("--max-restarts") + 1] == "0"
    assert command[-4:] == ["-m", "training", "--config", "c.yaml"]


@pytest.mark.slow
def test_sbatch_script_parses_and_carries_the_job(config_path: str) -> None:
    """The sbatch script is valid bash; its header asks for the nodes, GPUs and partition;
    srun starts one torchrun per node in the image, with the configured processes per node,
    meeting at the first node; it is one attempt (no loop), resuming only when asked."""
    script = SlurmLauncher(SPEC).render(config_path)
    if shutil.which("bash"):
        subprocess.run(["bash", "-n"], input=script.encode(), check=True)
    header = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    assert {"#SBATCH --nodes=3", "#SBATCH --gpus-per-node=4", "#SBATCH --partition=gpu",
            "#SBATCH --ntasks-per-node=1", "#SBATCH --job-name=job-7"} <= set(header)
    [srun] = [line for line in script.splitlines() if line.startswith("srun")]
    command = shlex.split(srun)
    assert "--container-image=registry.example/ballast:1.2" in command
    assert command[command.index("--nproc-per-node") + 1] == "4"
    assert command[command.index("--nnodes") + 1] == "3"
    assert '--rdzv-endpoint "$ENDPOINT"' in srun  # expanded by the shell inside the job
    assert training_part(command) == ["-m", "training", "--config", config_path]
    assert "for " not in script and "--resume" not in script
    assert "export NCCL_DEBUG=WARN" in script
    resumed = SlurmLauncher(SPEC).render(config_path, resume=True)
    assert resumed.splitlines()[-1].endswith(f"--config {config_path} --resume")


def test_pytorchjob_manifest_parses_and_carries_the_job(config_path: str) -> None:
    """The manifest is a ConfigMap holding the job's config (the same TrainConfig) and a
    PyTorchJob of one Master and num_nodes - 1 Workers, each pod running torchrun with the
    configured image, processes, GPUs and rendezvous; it is one attempt (no pod restarts,
    no backoff), resuming only when asked."""
    spec = SPEC.model_copy(update={"kind": "kubernetes"})
    config_map, job = yaml.safe_load_all(KubernetesLauncher(spec).render(config_path))
    assert config_map["kind"] == "ConfigMap" and job["kind"] == "PyTorchJob"
    assert TrainConfig.model_validate(yaml.safe_load(config_map["data"]["train.yaml"])) == (
        load_train_config(config_path))
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] + replicas["Worker"]["replicas"] == 3
    assert job["spec"]["nprocPerNode"] == "4" and job["spec"]["runPolicy"]["backoffLimit"] == 0
    for replica in replicas.values():
        assert replica["restartPolicy"] == "Never"
        pod = replica["template"]["spec"]
        container = pod["containers"][0]
        assert container["image"] == "registry.example/ballast:1.2"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
        command = container["command"]
        assert command[command.index("--nproc-per-node") + 1] == "4"
        assert command[command.index("--nnodes") + 1] == "3"
        assert command[command.index("--rdzv-endpoint") + 1] == "$(MASTER_ADDR):29500"
        assert training_part(command) == ["-m", "training", "--config", "/etc/ballast/train.yaml"]
        assert pod["volumes"][0]["configMap"]["name"] == config_map["metadata"]["name"]
    _, resumed = yaml.safe_load_all(KubernetesLauncher(spec).render(config_path, resume=True))
    master = resumed["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert master["containers"][0]["command"][-1] == "--resume"


def test_launchers_refuse_what_they_cannot_do(config_path: str) -> None:
    """Each refusal names what is missing: a Kubernetes job without an image, a multinode
    job without a rendezvous endpoint, a local job of several nodes, a SLURM launch
    without sbatch, a Kubernetes job that needs secrets but names no Secret for them."""
    with pytest.raises(ValueError, match="image"):
        LaunchConfig(kind="kubernetes")
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        LaunchConfig(kind="multinode", num_nodes=2)
    with pytest.raises(ValueError, match="num_nodes"):
        LaunchConfig(kind="local", num_nodes=2)
    with tempfile.TemporaryFile() as log:
        if shutil.which("sbatch") is None:
            with pytest.raises(RuntimeError, match="sbatch"):
                make_launcher(SPEC).run(config_path, False, {}, log)
        kubernetes = make_launcher(SPEC.model_copy(update={"kind": "kubernetes"}))
        with pytest.raises(ValueError, match="secret_env"):
            kubernetes.run(config_path, False, {"MLFLOW_TRACKING_PASSWORD": "x"}, log)


def test_a_multinode_launch_needs_a_pinned_version_and_run(tmp_path: Path) -> None:
    """Each node of a multinode job launches on its own, so it refuses a dataset root
    (nodes could resolve `_CURRENT` to different versions) and a tracked config without a
    run id (each node would open a run), naming the field, before anything starts."""
    spec = LaunchConfig(kind="multinode", num_nodes=2, rdzv_endpoint="10.0.0.1:29400")
    cfg = TrainConfig(dataset=str(tmp_path / "root"), output_dir=str(tmp_path / "run"))
    with pytest.raises(ValueError, match="dataset: a multinode job needs a version's"):
        run_job(cfg, spec)
    tracked = cfg.model_copy(update={
        "dataset": str(tmp_path / "root" / "v-1" / "_MANIFEST.json"),
        "tracking": TrackingConfig(tracking_uri="sqlite:///x.db")})
    with pytest.raises(ValueError, match=r"tracking\.run_id"):
        run_job(tracked, spec)
    assert not (tmp_path / "run").exists()


def test_retry_policy_retries_transient_failures_only_and_backs_off() -> None:
    """A config or data error is never retried; any other failure is retried until the
    attempts are spent; the wait doubles after each failed attempt."""
    policy = RetryPolicy(attempts=3, backoff_s=2.0)
    transient = TrainingFailed("training exited with status 1", 1, "")
    deterministic = TrainingFailed("config error", 1, "", config_error="ValueError: bad")
    assert [policy.should_retry(transient, attempt) for attempt in range(3)] == [
        True, True, False]
    assert not policy.should_retry(deterministic, 0)
    assert [policy.delay_s(attempt) for attempt in range(3)] == [2.0, 4.0, 8.0]
    assert not RetryPolicy(attempts=1).should_retry(transient, 0)


def test_training_failed_reads_in_one_line_and_redacts() -> None:
    """A config error's message is its one-line cause, without the output; any failure's
    message and tail hold no password that was in the output."""
    tail = "Traceback ...\nConnectionError: http://ada:hunter2@mlflow:5000/api refused\n"
    transient = TrainingFailed("training exited with status 1", 1, tail)
    assert "hunter2" not in str(transient) and "hunter2" not in transient.output_tail
    assert "http://ada:***@mlflow:5000/api" in transient.output_tail
    failed = TrainingFailed("stopped on a config error", 1, tail, config_error="ValueError: x")
    assert str(failed) == "stopped on a config error: ValueError: x"


INFRA = Path(__file__).resolve().parents[2] / "infra"


def without_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith("# "))


def test_shipped_examples_are_current_renders() -> None:
    """infra/k8s/train.yaml is a valid TrainConfig, and infra/k8s/pytorchjob.yaml and
    infra/slurm/train.sbatch are exactly what the launchers render from the arguments
    their headers give (so the examples cannot drift from the code)."""
    config = str(INFRA / "k8s" / "train.yaml")
    assert load_train_config(config).strategy == "fsdp"
    kubernetes = LaunchConfig(kind="kubernetes", num_nodes=2, num_processes_per_node=8,
                              num_gpus_per_node=8, num_cpus_per_node=64, memory="512Gi",
                              secret_env="ballast-s3", job_name="ballast-train",
                              image="registry.example.com/ballast:0.1.0")
    shipped = (INFRA / "k8s" / "pytorchjob.yaml").read_text()
    assert without_comments(shipped) == without_comments(make_launcher(kubernetes).render(config))
    slurm = LaunchConfig(kind="slurm", num_nodes=4, num_processes_per_node=8,
                         num_gpus_per_node=8, num_cpus_per_node=64, partition="gpu",
                         time_limit="12:00:00", job_name="ballast-train")
    rendered = make_launcher(slurm).render("/shared/ballast/jobs/train.yaml")
    assert without_comments((INFRA / "slurm" / "train.sbatch").read_text()) == (
        without_comments(rendered))


def test_cli_render_takes_every_field_as_a_flag(config_path: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m training.launch render` with flags prints the render of the LaunchConfig
    those flags describe (ints, floats and nested retry fields parsed); a bad value exits 2
    naming the field."""
    assert launch_main(["render", "--config", config_path, "--kind", "slurm", "--num-nodes",
                        "3", "--num-processes-per-node", "4", "--timeout-s", "60.5",
                        "--attempts", "4", "--job-name", "job-7"]) == 0
    spec = LaunchConfig(kind="slurm", num_nodes=3, num_processes_per_node=4, timeout_s=60.5,
                        retry=RetryPolicy(attempts=4), job_name="job-7")
    assert capsys.readouterr().out == make_launcher(spec).render(config_path)
    assert launch_main(["render", "--config", config_path, "--num-nodes", "0"]) == 2
    assert "num_nodes" in capsys.readouterr().err
