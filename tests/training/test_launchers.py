"""What the launchers start, without starting it: the torchrun command line, the SLURM
sbatch script and the Kubernetes PyTorchJob carry the configured nodes, processes, image
and command, each is one attempt, and the shipped examples are current renders; the
retry policy and the checks that refuse what a launcher cannot do."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

from preprocessing.toolbox.faults import backoff_s
from tracking.config import TrackingConfig
from training.config import TrainConfig, dump_train_config, load_train_config
from training.launch import (
    KubernetesJob,
    LocalJob,
    MultiNodeJob,
    RetryPolicy,
    SlurmJob,
    TrainingFailed,
    make_launcher,
    parse_launch,
    run_job,
)
from training.launch.__main__ import main as launch_main
from training.launch.config import job_retry
from training.launch.kubernetes import KubernetesLauncher
from training.launch.launchers import LocalTorchrunLauncher, MultiNodeTorchrunLauncher
from training.launch.slurm import SlurmLauncher

NODES = {
    "num_nodes": 3,
    "num_processes_per_node": 4,
    "job_name": "job-7",
    "env": {"NCCL_DEBUG": "WARN"},
}
SCHEDULED = {**NODES, "image": "registry.example/ballast:1.2", "num_gpus_per_node": 4}
SPEC = SlurmJob(kind="slurm", partition="gpu", **SCHEDULED)
KUBERNETES = KubernetesJob(kind="kubernetes", **SCHEDULED)


@pytest.fixture
def config_path(tmp_path: Path) -> str:
    cfg = TrainConfig(dataset="s3://data/root", output_dir="s3://runs/job-7", strategy="fsdp")
    return dump_train_config(cfg, tmp_path / "train.yaml")


def training_part(command: list[str]) -> list[str]:
    return command[command.index("training") - 1 :]


def test_multinode_render_is_the_command_it_runs(config_path: str) -> None:
    """The rendered line splits back into exactly the command the launcher would run:
    c10d rendezvous at the endpoint, the configured nodes and processes, no restarts."""
    spec = MultiNodeJob(kind="multinode", rdzv_endpoint="10.0.0.1:29400", **NODES)
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
    command = LocalTorchrunLauncher(LocalJob(num_processes_per_node=3)).command("c.yaml")
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
    assert {
        "#SBATCH --nodes=3",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --job-name=job-7",
    } <= set(header)
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
    spec = KUBERNETES
    config_map, job = yaml.safe_load_all(KubernetesLauncher(spec).render(config_path))
    assert config_map["kind"] == "ConfigMap" and job["kind"] == "PyTorchJob"
    assert TrainConfig.model_validate(yaml.safe_load(config_map["data"]["train.yaml"])) == (
        load_train_config(config_path)
    )
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
        parse_launch({"kind": "kubernetes"})
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        parse_launch({"kind": "multinode", "num_nodes": 2})
    with pytest.raises(ValueError, match="num_nodes: a setting of multinode"):
        parse_launch({"kind": "local", "num_nodes": 2})
    with tempfile.TemporaryFile() as log:
        if shutil.which("sbatch") is None:
            with pytest.raises(RuntimeError, match="sbatch"):
                make_launcher(SPEC).run(config_path, False, {}, log)
        kubernetes = make_launcher(KUBERNETES)
        with pytest.raises(ValueError, match="secret_env"):
            kubernetes.run(config_path, False, {"MLFLOW_TRACKING_PASSWORD": "x"}, log)


def test_a_multinode_launch_needs_a_pinned_version_and_run(tmp_path: Path) -> None:
    """Each node of a multinode job launches on its own, so it refuses a dataset root
    (nodes could resolve `_CURRENT` to different versions) and a tracked config without a
    run id (each node would open a run), naming the field, before anything starts."""
    spec = MultiNodeJob(kind="multinode", num_nodes=2, rdzv_endpoint="10.0.0.1:29400")
    cfg = TrainConfig(dataset=str(tmp_path / "root"), output_dir=str(tmp_path / "run"))
    with pytest.raises(ValueError, match="dataset: a multinode job needs a version's"):
        run_job(cfg, spec)
    tracked = cfg.model_copy(
        update={
            "dataset": str(tmp_path / "root" / "v-1" / "_MANIFEST.json"),
            "tracking": TrackingConfig(tracking_uri="sqlite:///x.db"),
        }
    )
    with pytest.raises(ValueError, match=r"tracking\.run_id"):
        run_job(tracked, spec)
    assert not (tmp_path / "run").exists()


def test_a_job_is_retried_under_the_one_retry_policy() -> None:
    """Invariants: a job's `retry` is ballast's one RetryPolicy (the reads' type), with the
    job's default of 2 attempts; its wait doubles from `first_delay_s` (with jitter, never
    above `max_delay_s`); the old `backoff_s` is refused naming the new field; a multinode
    launch is one attempt (its nodes are relaunched together, not each by its own loop)."""
    policy = SlurmJob(
        kind="slurm", retry={"attempts": 3, "first_delay_s": 2.0, "max_delay_s": 5.0}
    ).retry
    assert type(policy) is RetryPolicy and LocalJob().retry.attempts == 2
    waits = [backoff_s(policy, attempt) for attempt in (1, 2, 3)]
    assert 1.0 <= waits[0] <= 2.0 and 2.0 <= waits[1] <= 4.0 and 2.5 <= waits[2] <= 5.0
    with pytest.raises(ValueError, match=r"retry\.backoff_s is now retry\.first_delay_s"):
        parse_launch({"kind": "local", "retry": {"attempts": 2, "backoff_s": 5.0}})
    with pytest.raises(ValueError, match="whoever starts the nodes relaunches them all"):
        parse_launch({"kind": "multinode", "rdzv_endpoint": "h:1", "retry": {"attempts": 2}})
    assert job_retry(MultiNodeJob(kind="multinode", rdzv_endpoint="h:1")).attempts == 1


def test_each_kind_carries_only_its_own_settings() -> None:
    """Invariant: LaunchConfig is one model per kind: a SLURM job cannot carry a Kubernetes
    field (refused naming the kind it belongs to), nor a local job a SLURM one; a job
    without `kind` is local."""
    with pytest.raises(
        ValueError,
        match=r"job\.namespace: a setting of kubernetes "
        r"jobs, not of a slurm job",
    ):
        parse_launch({"kind": "slurm", "namespace": "ml"})
    with pytest.raises(ValueError, match=r"job\.partition: a setting of slurm jobs"):
        parse_launch({"partition": "gpu"})
    with pytest.raises(ValueError, match=r"job\.kind: one of local"):
        parse_launch({"kind": "ray"})
    assert isinstance(parse_launch({"num_processes_per_node": 3}), LocalJob)


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
    kubernetes = KubernetesJob(
        kind="kubernetes",
        num_nodes=2,
        num_processes_per_node=8,
        num_gpus_per_node=8,
        num_cpus_per_node=64,
        memory="512Gi",
        secret_env="ballast-s3",
        job_name="ballast-train",
        image="registry.example.com/ballast:0.1.0",
    )
    shipped = (INFRA / "k8s" / "pytorchjob.yaml").read_text()
    assert without_comments(shipped) == without_comments(make_launcher(kubernetes).render(config))
    slurm = SlurmJob(
        kind="slurm",
        num_nodes=4,
        num_processes_per_node=8,
        num_gpus_per_node=8,
        num_cpus_per_node=64,
        partition="gpu",
        time_limit="12:00:00",
        job_name="ballast-train",
        account="ml",
        python="/shared/ballast/venv/bin/python",
    )
    rendered = make_launcher(slurm).render("/shared/ballast/jobs/train.yaml")
    assert without_comments((INFRA / "slurm" / "train.sbatch").read_text()) == (
        without_comments(rendered)
    )


def test_cli_render_takes_every_field_as_a_flag(
    config_path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`python -m training.launch render` with flags prints the render of the LaunchConfig
    those flags describe (ints, floats and nested retry fields parsed); a bad value exits 2
    naming the field; `--help` prints every field's help."""
    assert (
        launch_main(
            [
                "render",
                "--config",
                config_path,
                "--kind",
                "slurm",
                "--num-nodes",
                "3",
                "--num-processes-per-node",
                "4",
                "--timeout-s",
                "60.5",
                "--attempts",
                "4",
                "--job-name",
                "job-7",
            ]
        )
        == 0
    )
    spec = SlurmJob(
        kind="slurm",
        num_nodes=3,
        num_processes_per_node=4,
        timeout_s=60.5,
        retry=RetryPolicy(attempts=4),
        job_name="job-7",
    )
    assert capsys.readouterr().out == make_launcher(spec).render(config_path)
    assert launch_main(["render", "--config", config_path, "--num-nodes", "0"]) == 2
    assert "num_nodes" in capsys.readouterr().err
    with pytest.raises(SystemExit) as helped:  # a help holding sbatch's %x-%j prints
        launch_main(["launch", "--help"])
    assert helped.value.code == 0 and "slurm/%x-%j.out" in capsys.readouterr().out


def test_a_retry_that_finds_no_checkpoint_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Invariants: a retry (attempt 2) of a job whose failed attempt saved no checkpoint
    prints that it trains from scratch, naming where it looked, and records no checkpoint
    to resume from; with `last.ckpt` in place the retry resumes from it, silently; a first
    attempt that does not resume looks for nothing."""
    from training.launch.job import PinnedJob, checkpoint_to_resume

    cfg = TrainConfig(dataset="s3://data/root", output_dir=str(tmp_path / "run"))
    pinned = PinnedJob(cfg, str(tmp_path / "run" / "train-config.pinned.yaml"), {})
    assert checkpoint_to_resume(pinned, resume=True, attempt=2) is None
    printed = capsys.readouterr().err
    assert f"no checkpoint at {cfg.last_checkpoint_uri}" in printed
    assert "this attempt trains from scratch" in printed
    Path(cfg.checkpoint_uri).mkdir(parents=True)
    Path(cfg.last_checkpoint_uri).write_bytes(b"checkpoint")
    assert checkpoint_to_resume(pinned, resume=True, attempt=2) == cfg.last_checkpoint_uri
    assert checkpoint_to_resume(pinned, resume=False, attempt=1) is None
    assert capsys.readouterr().err == ""


def test_sbatch_script_carries_the_sites_settings_ballasts_python_and_a_port_per_job(
    config_path: str,
) -> None:
    """Invariants: account, QOS, memory, constraint and further sbatch options become
    directives; the ranks run the interpreter running ballast unless `python` says
    otherwise (not `python` on the job's PATH); the rendezvous port is derived from the
    job id (two attempts never share one) unless fixed; a bare word among the options is
    refused naming the field."""
    spec = SlurmJob(
        kind="slurm",
        account="ml",
        qos="high",
        memory="64G",
        constraint="a100",
        sbatch_options=["--reservation=night", "--exclusive"],
    )
    script = SlurmLauncher(spec).render(config_path, output="/runs/slurm/%x-%j.out")
    header = {line for line in script.splitlines() if line.startswith("#SBATCH")}
    assert {
        "#SBATCH --account=ml",
        "#SBATCH --qos=high",
        "#SBATCH --mem=64G",
        "#SBATCH --constraint=a100",
        "#SBATCH --reservation=night",
        "#SBATCH --exclusive",
        "#SBATCH --output=/runs/slurm/%x-%j.out",
    } <= header
    [srun] = [line for line in script.splitlines() if line.startswith("srun")]
    assert shlex.split(srun)[3] == sys.executable
    assert 'ENDPOINT="$HEAD:$((20000 + SLURM_JOB_ID % 20000))"' in script
    fixed = SlurmLauncher(spec.model_copy(update={"rdzv_port": 29500, "python": "py"}))
    assert 'ENDPOINT="$HEAD:29500"' in fixed.render(config_path)
    with pytest.raises(ValueError, match=r"job\.sbatch_options: 'night' is not an sbatch"):
        SlurmJob(kind="slurm", sbatch_options=["--reservation", "night"])
