"""`KubernetesLauncher` (`kind: kubernetes`): a ConfigMap holding the job's config and a
Kubeflow PyTorchJob (one Master, `num_nodes - 1` Workers) whose pods run torchrun
with a c10d rendezvous at the master.

The PyTorchJob is one attempt: pods never restart (`restartPolicy: Never`,
`backoffLimit: 0`), because training/launch/job.py retries every kind of job in
one place and decides there whether the attempt resumes. Secrets come from the
Kubernetes Secret named by `secret_env`, never from the manifest. The PyTorchJob is
checked against the training operator's own CRD before it is printed or applied
(training/launch/crd.py).
"""

from __future__ import annotations

import subprocess
import time
from typing import IO, Any

import yaml
from fsspec.core import url_to_fs

from training.launch.command import torchrun_command
from training.launch.config import KubernetesJob
from training.launch.crd import PYTORCH_JOB_CRD, check_resource
from training.launch.launchers import Launcher, require_tool

CONFIG_MOUNT = "/etc/ballast"
POLL_S = 10.0


class KubernetesLauncher(Launcher[KubernetesJob]):
    """A ConfigMap with the job's config and a PyTorchJob running torchrun in each pod."""

    def manifests(self, config_uri: str, resume: bool = False) -> list[dict[str, Any]]:
        spec = self.spec
        config_map = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"{spec.job_name}-config", "namespace": spec.namespace},
            "data": {"train.yaml": read_text(config_uri)},
        }
        replicas = {"Master": replica_spec(spec, 1, resume)}
        if spec.num_nodes > 1:
            replicas["Worker"] = replica_spec(spec, spec.num_nodes - 1, resume)
        job = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {"name": spec.job_name, "namespace": spec.namespace},
            "spec": {
                "runPolicy": {"backoffLimit": 0, "cleanPodPolicy": "None"},
                "nprocPerNode": str(spec.num_processes_per_node),
                "pytorchReplicaSpecs": replicas,
            },
        }
        check_resource(job, PYTORCH_JOB_CRD)  # before it is printed or applied
        return [config_map, job]

    def render(self, config_uri: str, resume: bool = False) -> str:
        return yaml.dump_all(
            self.manifests(config_uri, resume), Dumper=ManifestDumper, sort_keys=False
        )

    def run(self, config_uri: str, resume: bool, env: dict[str, str], log: IO[bytes]) -> int | None:
        if env and self.spec.secret_env is None:
            raise ValueError(
                f"secret_env: the job needs {sorted(env)} and a manifest never holds a secret; "
                "put them in a Kubernetes Secret and name it in secret_env"
            )
        kubectl = require_tool("kubectl")
        job = ["-n", self.spec.namespace, f"pytorchjob/{self.spec.job_name}"]
        steps = [
            ([kubectl, "delete", *job, "--ignore-not-found"], None),
            ([kubectl, "apply", "-f", "-"], self.render(config_uri, resume).encode()),
        ]
        for command, manifest in steps:
            done = subprocess.run(command, input=manifest, stdout=log, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                return done.returncode
        return wait_for_job(kubectl, job, self.spec.timeout_s)


def wait_for_job(kubectl: str, job: list[str], timeout_s: float) -> int | None:
    """0 once the PyTorchJob has succeeded, 1 once it has failed, None at the timeout
    (a query that fails, e.g. while the API server restarts, is asked again)."""
    query = [kubectl, "get", *job, "-o", 'jsonpath={.status.conditions[?(@.status=="True")].type}']
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = subprocess.run(query, capture_output=True, text=True).stdout.split()
        if "Succeeded" in states or "Failed" in states:
            return 0 if "Succeeded" in states else 1
        time.sleep(POLL_S)
    return None


def replica_spec(spec: KubernetesJob, replicas: int, resume: bool) -> dict[str, Any]:
    """One replica type of the PyTorchJob: pods running torchrun, config mounted from the
    ConfigMap, secrets from `secret_env`."""
    endpoint = f"$(MASTER_ADDR):{spec.rdzv_port}"
    command = torchrun_command(spec, f"{CONFIG_MOUNT}/train.yaml", resume, spec.python, endpoint)
    resources: dict[str, Any] = {"cpu": str(spec.num_cpus_per_node), "memory": spec.memory}
    if spec.num_gpus_per_node:
        resources["nvidia.com/gpu"] = str(spec.num_gpus_per_node)
    container: dict[str, Any] = {
        "name": "pytorch",
        "image": spec.image,
        "command": command,
        "env": [{"name": k, "value": v} for k, v in spec.env.items()],
        "resources": {"requests": resources, "limits": dict(resources)},
        "volumeMounts": [{"name": "config", "mountPath": CONFIG_MOUNT}],
    }
    if spec.secret_env:
        container["envFrom"] = [{"secretRef": {"name": spec.secret_env}}]
    volume = {"name": "config", "configMap": {"name": f"{spec.job_name}-config"}}
    return {
        "replicas": replicas,
        "restartPolicy": "Never",
        "template": {"spec": {"containers": [container], "volumes": [volume]}},
    }


class ManifestDumper(yaml.SafeDumper):
    """YAML as a person writes it: multi-line strings as `|` blocks, no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def represent_text(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


ManifestDumper.add_representer(str, represent_text)


def read_text(uri: str) -> str:
    fs, path = url_to_fs(uri)
    return str(fs.cat_file(path).decode())
