"""Readers for the deploy files under infra/, for tests that validate them without a container
engine or a cluster: Dockerfile stages, compose variables, the Kubernetes API schemas (from
kubernetes-validate) and the two custom resources ballast ships or renders."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml
from kubernetes_validate.utils import all_versions

from training.launch.crd import PYTORCH_JOB_CRD, check_resource

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
# Compose: `${NAME}`, `${NAME:-default}`, `${NAME-default}`, `${NAME:?error}`, `${NAME?error}`.
VARIABLE = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<op>:?[-?])?(?P<arg>[^}]*)\}")
# The oldest and the newest Kubernetes minor versions the validator bundles.
K8S_VERSIONS = (all_versions()[0], all_versions()[-1])


# ---------------------------------------------------------------- Dockerfiles


@dataclass
class Stage:
    """One build stage: its base, name, instructions and the user it ends as."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)
    user: str | None = None  # None: the base image's (root for python:*)


def logical_lines(text: str) -> list[str]:
    """Instructions with continuations joined; comment lines dropped, as Docker does even
    inside a continuation."""
    lines, current = [], ""
    for raw in text.splitlines():
        if raw.strip().startswith("#") or not raw.strip():
            continue
        current += raw.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        lines.append(current.strip())
        current = ""
    return lines


def parse_stages(path: Path) -> list[Stage]:
    """The stages of a Dockerfile; a stage built FROM an earlier one inherits its user."""
    stages: list[Stage] = []
    for line in logical_lines(path.read_text()):
        instruction, _, args = line.partition(" ")
        instruction = instruction.upper()
        if instruction == "FROM":
            words = [w for w in args.split() if not w.startswith("--")]
            name = words[2] if len(words) > 2 and words[1].upper() == "AS" else None
            parent = next((s for s in stages if s.name == words[0]), None)
            stages.append(Stage(words[0], name, user=parent.user if parent else None))
        elif stages:
            stages[-1].instructions.append((instruction, args.strip()))
            if instruction == "USER":
                stages[-1].user = args.strip()
    return stages


def pip_installs(stage: Stage) -> list[list[str]]:
    """The argument lists of every `pip install` in the stage's RUN instructions."""
    installs = []
    for instruction, args in stage.instructions:
        if instruction != "RUN":
            continue
        for command in re.split(r"&&|;", args):
            words = shlex.split(command)
            if words[:2] == ["pip", "install"]:
                installs.append(words[2:])
    return installs


def env_of(stage: Stage) -> dict[str, str]:
    """The ENV settings of a stage (`ENV A=1 B=2` form)."""
    settings: dict[str, str] = {}
    for instruction, args in stage.instructions:
        if instruction == "ENV":
            for word in shlex.split(args):
                name, _, value = word.partition("=")
                settings[name] = value
    return settings


def constraint_pins() -> dict[str, str]:
    """constraints.txt as {normalised name: version}."""
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[normalise(name)] = version
    return pins


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------- compose


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((INFRA / "compose.yaml").read_text()))


def variables(text: str) -> list[re.Match[str]]:
    """Compose variable references in a string (`$$` is a literal dollar, not one)."""
    return list(VARIABLE.finditer(text.replace("$$", "")))


def is_reference(value: object) -> bool:
    """Whether a value is exactly one variable with no default in the file."""
    if not isinstance(value, str):
        return False
    found = variables(value)
    return (
        len(found) == 1 and found[0].group(0) == value and found[0].group("op") in (None, ":?", "?")
    )


def strings_in(node: object) -> list[str]:
    """Every string scalar under a parsed YAML node."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in (*strings_in(key), *strings_in(value))]
    if isinstance(node, list):
        return [s for item in node for s in strings_in(item)]
    return []


# ---------------------------------------------------------------- Kubernetes


def k8s_documents() -> dict[Path, list[dict[str, Any]]]:
    """Every YAML file under infra/k8s with its non-empty documents."""
    return {
        path: [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
        for path in sorted((INFRA / "k8s").glob("*.yaml"))
    }


def validate_manifest(doc: dict[str, Any], version: str) -> None:
    """Schema validation, strict (unknown fields fail): the API's own schema for built-in
    kinds; a custom resource against its operator's own CRD (CRD_FILES), which no API
    version changes."""
    if doc["kind"] in CRD_FILES:
        check_resource(doc, CRD_FILES[doc["kind"]])
    else:
        kubernetes_validate.validate(doc, version, strict=True)


# The operators' own CRDs, each file's header naming its source, version and licence.
CRD_FILES = {"DaskCluster": Path(__file__).with_name("crds") / "daskcluster.yaml"}
CRD_FILES["PyTorchJob"] = PYTORCH_JOB_CRD


def pod_specs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod specs a manifest holds (Deployment, Job, DaskCluster, PyTorchJob)."""
    spec = doc.get("spec", {})
    if doc["kind"] == "DaskCluster":
        return [spec["scheduler"]["spec"], spec["worker"]["spec"]]
    if doc["kind"] == "PyTorchJob":
        return [r["template"]["spec"] for r in spec["pytorchReplicaSpecs"].values()]
    if "template" in spec:
        return [spec["template"]["spec"]]
    return []
