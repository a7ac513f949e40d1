"""The deploy files under infra/ and the presets they run, validated without a container engine
or a cluster: Kubernetes manifests against the API's schemas, the Prefect work pool's job
template rendered into a Job, RBAC scope, compose.yaml's services, ports and secrets, the
Dockerfiles' installs and users, and the configs that point the pipeline at each target."""

from __future__ import annotations

import configparser
import json
import re
import shlex
import subprocess
import tomllib
from typing import Any

import jsonschema
import pytest

from flows.params import PipelineParams, ReshardParams, load_preset
from preprocessing.driver.worker_environment import WORKER_MALLOC_ENV
from tests.infra.deploy_files import (
    INFRA,
    K8S_VERSIONS,
    REPO,
    compose,
    constraint_pins,
    env_of,
    is_reference,
    k8s_documents,
    normalise,
    parse_stages,
    pip_installs,
    pod_specs,
    strings_in,
    validate_manifest,
    variables,
)
from training.config import load_train_config

# Written by `python -m training.launch render`, not by hand: schema-checked here, while
# its pods' security settings are the launcher's.
RENDERED = {"pytorchjob.yaml"}
TEMPLATE = json.loads((INFRA / "k8s" / "prefect-base-job-template.json").read_text())
CREDENTIAL_KEY = re.compile(r"PASSWORD|SECRET|AUTH_STRING|ACCESS_KEY|TOKEN|USER(NAME)?$")


# ---------------------------------------------------------------- Kubernetes


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_kubernetes_manifest_passes_schema_validation(version: str) -> None:
    """Invariant: every document of every YAML file under infra/k8s is a manifest that
    validates strictly (unknown fields are errors); train.yaml, the one file that is not,
    is a valid training config."""
    failures = []
    for path, docs in k8s_documents().items():
        if path.name == "train.yaml":
            load_train_config(path)
            continue
        for doc in docs:
            try:
                validate_manifest(doc, version)
            except (jsonschema.ValidationError, KeyError) as error:
                failures.append(f"{path.name} {doc.get('kind')}: {error}")
    assert not failures, "\n".join(failures)


def test_crd_schemas_reject_a_misplaced_field() -> None:
    """Invariant: the custom-resource checks are strict too: a pod field one level too high
    in a DaskCluster fails."""
    (cluster,) = k8s_documents()[INFRA / "k8s" / "dask-cluster.yaml"]
    cluster["spec"]["worker"]["containers"] = cluster["spec"]["worker"]["spec"]["containers"]
    with pytest.raises(jsonschema.ValidationError, match="containers"):
        validate_manifest(cluster, K8S_VERSIONS[-1])


def rendered_job(template: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The Job a Kubernetes worker submits: the template's defaults and `values` filled in,
    then, as the worker does, env as name/value pairs and the command split into args."""
    from prefect.utilities.templating import apply_values

    properties = template["variables"]["properties"]
    defaults = {name: spec["default"] for name, spec in properties.items() if "default" in spec}
    config = apply_values(template["job_configuration"], {**defaults, **values})
    job = config["job_manifest"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [{"name": k, "value": v} for k, v in container["env"].items()]
    container["args"] = shlex.split(container["args"])
    return dict(job)


@pytest.mark.slow  # importing prefect.server runs `file` on the interpreter (a subprocess)
def test_prefect_base_job_template_renders_a_valid_job() -> None:
    """Invariant: Prefect accepts the work pool's template (every placeholder declared) and
    its defaults render a Job that passes strict schema validation, in the namespace of the
    ballast manifests, as the flow-run service account, labelled as a Dask client."""
    from prefect.server.schemas.actions import validate_base_job_template

    validate_base_job_template(TEMPLATE)
    job = rendered_job(
        TEMPLATE,
        {
            "name": "ballast-run",
            "env": {"PREFECT__FLOW_RUN_ID": "1"},
            "command": "prefect flow-run execute",
            "labels": {"app": "ballast"},
        },
    )
    for version in K8S_VERSIONS:
        validate_manifest(job, version)
    pod = job["spec"]["template"]
    assert job["metadata"]["namespace"] == "ballast"
    assert pod["spec"]["serviceAccountName"] in defined("ServiceAccount")
    assert pod["metadata"]["labels"]["ballast.io/dask-client"] == "true"


def defined(kind: str) -> set[str]:
    """Names of the objects of `kind` that infra/k8s defines."""
    return {
        doc["metadata"]["name"]
        for docs in k8s_documents().values()
        for doc in docs
        if doc.get("kind") == kind
    }


def test_rbac_is_namespaced_and_names_what_it_grants() -> None:
    """Invariant: no ClusterRole, no wildcard, no access to secrets; each binding ties a
    service account defined here to a role defined here, in the same namespace."""
    docs = [doc for docs in k8s_documents().values() for doc in docs if "kind" in doc]
    assert not [doc for doc in docs if doc["kind"].startswith("Cluster")]
    for role in (doc for doc in docs if doc["kind"] == "Role"):
        for rule in role["rules"]:
            granted = rule["apiGroups"] + rule["resources"] + rule["verbs"]
            assert "*" not in granted and "secrets" not in rule["resources"], role
    for binding in (doc for doc in docs if doc["kind"] == "RoleBinding"):
        assert binding["roleRef"]["name"] in defined("Role")
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount" and subject["name"] in defined(
                "ServiceAccount"
            )
            assert subject["namespace"] == binding["metadata"]["namespace"] == "ballast"


def ballast_pods() -> list[dict[str, Any]]:
    """Pod specs of the hand-written manifests and of the work pool's template."""
    pods = [
        pod
        for path, docs in k8s_documents().items()
        if path.name not in RENDERED
        for doc in docs
        if "kind" in doc
        for pod in pod_specs(doc)
    ]
    return [*pods, TEMPLATE["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]]


def test_ballast_pods_run_unprivileged_with_a_known_service_account() -> None:
    """Invariant: every pod runs as a non-root user with the runtime's seccomp profile, no
    container can gain privileges or keeps a capability, and its service account (when not
    templated) is defined here."""
    accounts = defined("ServiceAccount")
    for pod in ballast_pods():
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            assert container["securityContext"]["allowPrivilegeEscalation"] is False
            assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
        account = pod.get("serviceAccountName", "")
        assert account.startswith("{{") or account in accounts


def test_dask_network_policy_admits_the_cluster_and_flow_runs_only() -> None:
    """Invariant: the policy selects the DaskCluster's pods (the operator's cluster-name
    label) and admits pods with the flow runs' client label, nothing wider."""
    (cluster,) = k8s_documents()[INFRA / "k8s" / "dask-cluster.yaml"]
    policy = next(
        doc
        for doc in k8s_documents()[INFRA / "k8s" / "dask-access.yaml"]
        if doc["kind"] == "NetworkPolicy"
    )
    own = {"dask.org/cluster-name": cluster["metadata"]["name"]}
    assert policy["spec"]["podSelector"] == {"matchLabels": own}
    peers = policy["spec"]["ingress"][0]["from"]
    assert {"podSelector": {"matchLabels": {"ballast.io/dask-client": "true"}}} in peers
    assert all(
        peer.get("podSelector", {}).get("matchLabels")
        or peer.get("namespaceSelector", {}).get("matchLabels")
        for peer in peers
    )


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
