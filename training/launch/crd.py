"""Checking a custom resource against its operator's own CRD, as the API server would.

The PyTorchJob that `KubernetesLauncher` renders is validated against the Kubeflow
training operator's published CRD (`training/launch/crds/`, copied unchanged with its
source named in its header) before it is printed or applied: a field the operator does not
know, or of the wrong type, is a ValueError naming the field, not a pod that never starts.
Strict as `kubectl apply --validate=strict`: the schema is a structural schema, and an
object's fields not in it are errors, except where the CRD keeps unknown fields
(`x-kubernetes-preserve-unknown-fields`). No cluster is needed (docs/deployment.md).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

CRDS = Path(__file__).with_name("crds")
PYTORCH_JOB_CRD = CRDS / "kubeflow.org_pytorchjobs.yaml"
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRD is 600 kB of YAML


@cache
def crd_validator(path: Path) -> tuple[str, jsonschema.protocols.Validator]:
    """The kind a CRD file defines, and a strict validator of its stored version."""
    crd = yaml.load(path.read_text(), Loader=_LOADER)
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    schema = closed(version["schema"]["openAPIV3Schema"])
    schema["properties"].setdefault("metadata", {"type": "object"})  # the API server's own
    group = f"{crd['spec']['group']}/{version['name']}"
    schema["properties"]["apiVersion"] = {"const": group}
    schema["properties"]["kind"] = {"const": crd["spec"]["names"]["kind"]}
    return crd["spec"]["names"]["kind"], jsonschema.Draft7Validator(schema)


def closed(schema: Any) -> Any:
    """`schema` with every object that lists its properties closed to others, as the API
    server's strict field validation treats a structural schema."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: closed(value) for key, value in schema.items()}
    keeps = schema.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in schema
    if "properties" in schema and not keeps:
        out["additionalProperties"] = False
    return out


def pruned(value: Any) -> Any:
    """`value` without its null fields, which the API server drops before it validates a
    custom resource (a CRD's fields are not nullable unless it says so)."""
    if isinstance(value, dict):
        return {key: pruned(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [pruned(item) for item in value]
    return value


def check_resource(doc: dict[str, Any], crd: Path) -> None:
    """Raise ValueError naming the resource, the field and the CRD if `doc` fails `crd`'s
    schema; every error is named (the first five), not only the first."""
    kind, validator = crd_validator(crd)
    found_errors = validator.iter_errors(pruned(doc))
    errors = sorted(found_errors, key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        name = doc.get("metadata", {}).get("name", "?")
        found = "; ".join(
            f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors[:5]
        )
        raise ValueError(f"{kind} {name} does not pass its CRD ({crd.name}): {found}")
