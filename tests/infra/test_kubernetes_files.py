"""The Kubernetes deploy files under infra/k8s, validated without a cluster: every manifest
against the API's schemas (custom resources strictly too), the Prefect work pool's job
template rendered into a Job, RBAC scope, the pods' security settings and the Dask
network policy. compose, the Dockerfiles and SLURM: tests/infra/test_deploy_files.py."""

from __future__ import annotations

import json
import shlex
from typing import Any

import jsonschema
import pytest
import yaml

from preprocessing.driver.cluster import DaskConfig, kubernetes_cluster_spec
from tests.infra.deploy_files import (
    INFRA,
    K8S_VERSIONS,
    k8s_documents,
    pod_specs,
    validate_manifest,
)
from training.config import load_train_config
from training.launch.__main__ import main as launch_main

# Written by `python -m training.launch render`, not by hand: schema-checked here, while
# its pods' security settings are the launcher's.
RENDERED = {"pytorchjob.yaml"}
TEMPLATE = json.loads((INFRA / "k8s" / "prefect-base-job-template.json").read_text())


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
            except (jsonschema.ValidationError, ValueError, KeyError) as error:
                failures.append(f"{path.name} {doc.get('kind')}: {error}")
    assert not failures, "\n".join(failures)


def test_crd_schemas_reject_a_misplaced_field() -> None:
    """Invariant: the operators' CRDs are applied strictly, as `--validate=strict` would: a
    pod field one level too high in a DaskCluster, a field PyTorchJob does not have, or a
    replica count of the wrong type fails, naming the field."""
    (cluster,) = k8s_documents()[INFRA / "k8s" / "dask-cluster.yaml"]
    cluster["spec"]["worker"]["containers"] = cluster["spec"]["worker"]["spec"]["containers"]
    with pytest.raises(ValueError, match=r"spec.worker: .*'containers' was unexpected"):
        validate_manifest(cluster, K8S_VERSIONS[-1])
    job = next(d for d in k8s_documents()[INFRA / "k8s" / "pytorchjob.yaml"] if "spec" in d)
    job["spec"]["runPolicy"]["backofLimit"] = 0
    job["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = "one"
    with pytest.raises(ValueError) as raised:
        validate_manifest(job, K8S_VERSIONS[-1])
    assert "'backofLimit' was unexpected" in str(raised.value)
    assert "Master.replicas: 'one' is not of type 'integer'" in str(raised.value)


@pytest.mark.parametrize(
    "options",
    [
        {"env": {"AWS_REGION": "eu-west-1"}},
        {"env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s3", "key": "id"}}}]},
        {
            "name": "reshard",
            "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "8Gi"}},
            "worker_command": "dask worker",
            "scheduler_service_type": "LoadBalancer",
            "idle_timeout": 600,
        },
    ],
)
def test_the_dask_cluster_spec_a_run_builds_passes_the_operators_crd(options) -> None:
    """Invariant: the DaskCluster that `dask.kind: kubernetes` builds at run time
    (`kubernetes_cluster_spec`, through dask-kubernetes' own `make_cluster_spec`) passes
    the operator's CRD strictly, whatever options a config sets (its null fields dropped,
    as the API server drops them)."""
    image = {"name": "r", "image": "ballast-preprocessing:0.1.0"}
    config = DaskConfig(kind="kubernetes", num_workers=2, options={**image, **options})
    validate_manifest(kubernetes_cluster_spec(config), K8S_VERSIONS[-1])


def test_render_refuses_a_pytorchjob_the_operator_would_reject(capsys) -> None:
    """Invariant: `python -m training.launch render` checks the PyTorchJob against the
    training operator's CRD before printing: a memory the CRD's quantity pattern refuses
    exits 2 with the field named and prints no manifest; a valid one prints both."""
    train = str(INFRA / "k8s" / "train.yaml")
    args = ["render", "--config", train, "--kind", "kubernetes", "--image", "ballast:1"]
    assert launch_main([*args, "--memory", "32 GB"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "resources.limits.memory" in err and "32 GB" in err, err
    assert launch_main(args) == 0
    assert [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)] == [
        "ConfigMap",
        "PyTorchJob",
    ]


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
