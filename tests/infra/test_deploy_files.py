"""The deploy files under infra/ and the presets they run, validated without a container engine
or a cluster: compose.yaml's services, ports and secrets, the Dockerfiles' installs and
users, and the configs that point the pipeline at each target (compose, SLURM). The
Kubernetes manifests: tests/infra/test_kubernetes_files.py."""

from __future__ import annotations

import configparser
import re
import subprocess
import tomllib
from typing import Any

import pytest

from flows.params import PipelineParams, ReshardParams, load_preset
from preprocessing.driver.worker_environment import WORKER_MALLOC_ENV
from tests.infra.deploy_files import (
    INFRA,
    REPO,
    compose,
    constraint_pins,
    env_of,
    is_reference,
    normalise,
    parse_stages,
    pip_installs,
    strings_in,
    variables,
)

CREDENTIAL_KEY = re.compile(r"PASSWORD|SECRET|AUTH_STRING|ACCESS_KEY|TOKEN|USER(NAME)?$")


# ---------------------------------------------------------------- compose


def test_compose_services_have_health_checks_and_loopback_ports() -> None:
    """Invariant: every service has a health check, publishes ports on 127.0.0.1 only and
    mounts named volumes that are declared."""
    spec = compose()
    for name, service in spec["services"].items():
        assert service.get("healthcheck", {}).get("test") not in (None, ["NONE"]), name
        assert service.get("network_mode") != "host", name
        for port in service.get("ports", []):
            host_ip = port.get("host_ip") if isinstance(port, dict) else str(port).split(":")[0]
            assert host_ip == "127.0.0.1", f"{name}: {port}"
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            assert source.startswith(".") or source in spec["volumes"], f"{name}: {volume}"


def test_compose_holds_no_inline_secret() -> None:
    """Invariant: every credential in compose.yaml is a `${VAR}` reference without a
    default, and so is every password inside a URL."""
    for name, service in compose()["services"].items():
        for key, value in service.get("environment", {}).items():
            if CREDENTIAL_KEY.search(key):
                assert is_reference(value), f"{name}: {key}={value}"
    for text in strings_in(compose()):
        for password in re.findall(r"://[^/:@\s]+:([^@\s]+)@", text):
            assert is_reference(password), text


@pytest.mark.slow
def test_every_compose_variable_is_listed_in_env_example() -> None:
    """Invariant: infra/.env.example names every variable compose.yaml needs (those without
    a default), leaves every credential empty, and infra/.env is ignored by git."""
    needed = {
        m.group("name")
        for text in strings_in(compose())
        for m in variables(text)
        if m.group("op") in (None, ":?", "?")
    }
    lines = (INFRA / ".env.example").read_text().splitlines()
    example = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    assert needed <= set(example), needed - set(example)
    assert all(
        not value for key, value in example.items() if re.search("PASSWORD|SECRET|AUTH", key)
    ), example
    ignored = subprocess.run(["git", "check-ignore", "-q", "infra/.env"], cwd=REPO)
    assert ignored.returncode == 0, "infra/.env must be ignored by git"


def test_compose_preset_points_at_the_compose_services() -> None:
    """Invariant: flows/presets/compose.yaml validates as the pipeline's parameters and its
    addresses are compose services and ports, its buckets ones MinIO creates."""
    params = PipelineParams.model_validate(load_preset("compose"))
    services = compose()["services"]
    scheduler = re.fullmatch(r"tcp://([\w-]+):(\d+)", params.dask.address or "")
    assert (
        scheduler and scheduler[1] in services and scheduler[2] in services[scheduler[1]]["command"]
    )
    assert params.train.tracking
    tracking = re.fullmatch(r"http://([\w-]+):(\d+)", params.train.tracking.tracking_uri)
    assert tracking and tracking[1] in services and tracking[2] in services[tracking[1]]["command"]
    buckets = {uri.split("/")[2] for uri in (params.reshard.output_root, params.train.output_dir)}
    assert all(f"/data/{bucket}" in services["minio"]["command"][0] for bucket in buckets)


def flatten(node: object, prefix: str = "") -> dict[str, object]:
    """Nested mappings as {"a.b.c": leaf}."""
    if not isinstance(node, dict):
        return {prefix: node}
    return {
        k: v for key, value in node.items() for k, v in flatten(value, f"{prefix}{key}.").items()
    }


def test_compose_preset_differs_from_nightly_only_in_uris_and_cluster() -> None:
    """Invariant: moving from the nightly preset to compose changes URIs (paths, s3://,
    http://, or a location left to the server) and the `dask` section, nothing else."""
    nightly, on_compose = flatten(load_preset("nightly", "/w")), flatten(load_preset("compose"))
    for key in nightly.keys() | on_compose.keys():
        before, after = nightly.get(key), on_compose.get(key)
        if before == after or key.startswith("dask."):
            continue
        locations = [v for v in (before, after) if v is not None]
        assert all(isinstance(v, str | list) and "/" in str(v) for v in locations), key


# ---------------------------------------------------------------- Dockerfiles


DOCKERFILES = sorted((INFRA / "docker").glob("*.Dockerfile"))


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda path: path.name)
def test_dockerfile_installs_pinned_packages_as_a_non_root_user(path: Any) -> None:
    """Invariant: every target stage ends as a numeric non-root user; every pip install
    takes constraints.txt (copied from the repository) or is a `--no-deps` install of one
    pinned file; every package named is pinned by the constraints or by `==`; every file it
    copies exists in the repository (the build context)."""
    stages, pins = parse_stages(path), constraint_pins()
    for stage in stages:
        assert stage.user and stage.user.split(":")[0] not in ("0", "root"), stage.base
        assert stage.user.split(":")[0].isdigit(), "numeric, so runAsNonRoot can check it"
        for words in pip_installs(stage):
            packages = [
                w
                for w in words
                if not w.startswith("-") and "://" not in w and not w.endswith("constraints.txt")
            ]
            if "--no-deps" in words:
                assert len(packages) == 1 and "==" in packages[0], words
                continue
            assert words[words.index("-c") + 1].endswith("constraints.txt"), words
            for package in (p for p in packages if not p.startswith(".")):
                name = normalise(re.split(r"[\[=<>]", package)[0])
                assert name in pins or "==" in package, f"{path.name}: {package} unpinned"
    copied = [
        word
        for stage in stages
        for instruction, args in stage.instructions
        if instruction == "COPY"
        for word in args.split()[:-1]
        if not word.startswith("--")
    ]
    assert copied and all((REPO / source).exists() for source in copied), copied


@pytest.mark.slow
def test_training_cpu_image_takes_the_constraints_torch_from_the_cpu_index() -> None:
    """Invariant: the cpu target installs torch from the CPU wheel index at the version
    constraints.txt pins (the sed expression in the RUN, run here, yields it); the cuda
    target installs torch from the constraints like everything else."""
    stages = {s.name: s for s in parse_stages(INFRA / "docker" / "training.Dockerfile")}
    (torch_install, _) = pip_installs(stages["cpu"])
    assert torch_install[torch_install.index("--index-url") + 1] == (
        "https://download.pytorch.org/whl/cpu"
    )
    assert "torch==${TORCH_VERSION}+cpu" in torch_install
    (run,) = [args for instruction, args in stages["cpu"].instructions if instruction == "RUN"]
    expression = re.search(r'TORCH_VERSION="\$\((.*?)\)"', run)
    assert expression, run
    found = subprocess.run(expression[1], shell=True, cwd=REPO, capture_output=True, text=True)
    assert found.stdout.strip() == constraint_pins()["torch"]
    assert pip_installs(stages["cuda"]) == [["-c", "constraints.txt", ".[all]"]]


def test_preprocessing_image_has_no_torch_and_keeps_worker_allocator_settings() -> None:
    """Invariant: the preprocessing image installs extras that bring no torch, Lightning or
    MLflow, and sets the allocator variables of the workers ballast starts itself."""
    (stage,) = parse_stages(INFRA / "docker" / "preprocessing.Dockerfile")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for words in pip_installs(stage):
        for project in (w for w in words if w.startswith(".[")):
            for extra in project[2:-1].split(","):
                assert not re.search("torch|lightning|mlflow|ballast", " ".join(extras[extra]))
    assert {k: int(v) for k, v in env_of(stage).items() if k.startswith("MALLOC_")} == (
        WORKER_MALLOC_ENV
    )


def test_mlflow_auth_config_denies_by_default_and_holds_no_password() -> None:
    """Invariant: the image's basic-auth config has the keys MLflow's reader requires, gives
    users no permission unless granted, keeps its user store on the server's volume and
    holds no admin credential (they come from the environment only)."""
    parser = configparser.ConfigParser()
    parser.read(INFRA / "docker" / "mlflow-basic-auth.ini")
    auth = parser["mlflow"]
    assert auth["default_permission"] == "NO_PERMISSIONS"  # mlflow.server.auth.permissions
    assert auth["database_uri"].startswith("sqlite:////var/lib/mlflow/")
    assert "admin_username" not in auth and "admin_password" not in auth
    volumes = compose()["services"]["mlflow"]["volumes"]
    assert any(volume.endswith(":/var/lib/mlflow") for volume in volumes)


# ---------------------------------------------------------------- SLURM


def slurm_params() -> ReshardParams:
    return ReshardParams.model_validate(load_preset(str(INFRA / "slurm" / "reshard.yaml")))


def test_slurm_reshard_config_validates_and_keeps_worker_allocator_settings() -> None:
    """Invariant: the dask-jobqueue example is a valid reshard config for `kind: slurm`,
    whose jobs export the allocator settings of the workers ballast starts itself."""
    params = slurm_params()
    assert params.dask.kind == "slurm"
    exports = [
        line.split()[1].split("=")
        for line in params.dask.options["job_script_prologue"]
        if line.startswith("export MALLOC_")
    ]
    assert {name: int(value) for name, value in exports} == WORKER_MALLOC_ENV


def test_slurm_example_renders_a_job_script(tmp_path: Any) -> None:
    """Invariant: SLURMCluster takes the example's options as they are and writes a job
    script of single-threaded TLS workers (only with dask-jobqueue installed)."""
    jobqueue = pytest.importorskip("dask_jobqueue")
    options = {
        **slurm_params().dask.options,
        "shared_temp_directory": str(tmp_path),
        "log_directory": str(tmp_path / "logs"),
    }
    with jobqueue.SLURMCluster(**options) as cluster:
        script = cluster.job_script()
    assert "--nthreads 1" in script and "--protocol tls://" in script
    assert "export MALLOC_TRIM_THRESHOLD_=268435456" in script
