"""MLflow's conventions as ballast's defaults: where a run's tracking URI, experiment and
artifacts come from, for `ballast run`, `ballast status` and deployment runs alike.

Precedence of the tracking URI and the experiment name, per tracking section
(`train.tracking` of a pipeline or training config, `tracking` of the others):

1. what the user wrote: a `--set` override (a deployment run's `overrides`), or a value in
   their own YAML file;
2. MLflow's environment variables, `MLFLOW_TRACKING_URI` and `MLFLOW_EXPERIMENT_NAME` (of
   the process that runs the flow: a worker's or `ballast serve`'s for a deployment run);
3. the shipped preset's value (else the field's default); a deployment's parameters are
   its preset's (flows/deployments.py renders them from the presets).

When the tracking URI is an HTTP(S) server and the artifact location came from a shipped
preset, the location is dropped: the run's artifacts go through the server's artifact
proxy, so every host that reads the run or its registered model finds them. A location
the user wrote is kept. The model registry follows MLflow's own rule: `MLFLOW_REGISTRY_URI`
when set, else the tracking URI.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from preprocessing.toolbox.secrets import redact

ENV_OF = {"tracking_uri": "MLFLOW_TRACKING_URI", "experiment": "MLFLOW_EXPERIMENT_NAME"}
SECTIONS = (("train", "tracking"), ("tracking",))


def apply_tracking_conventions(
    values: dict[str, Any], shipped: bool, overridden: set[str], environ: Mapping[str, str]
) -> list[str]:
    """Apply the precedence (module docstring) in place to each tracking section."""
    lines = []
    for path in SECTIONS:
        section = _section(values, path)
        if section is None:
            continue
        prefix = ".".join(path)
        origins = {
            name: _resolve(section, name, f"{prefix}.{name}", shipped, overridden, environ)
            for name in ENV_OF
        }
        uri = str(section.get("tracking_uri"))
        location_key = f"{prefix}.artifact_location"
        if (
            uri.startswith(("http://", "https://"))
            and shipped
            and location_key not in overridden
            and section.get("artifact_location")
        ):
            section["artifact_location"] = None
            origins["artifacts"] = "the server's artifact proxy"
        lines.append(
            f"MLflow ({prefix}): tracking {redact(uri)} from {origins['tracking_uri']}, "
            f"experiment {section.get('experiment', 'ballast')!r} from "
            f"{origins['experiment']}"
            + (f", artifacts through {origins['artifacts']}" if "artifacts" in origins else "")
        )
    return lines


def _section(values: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any] | None:
    node: Any = values
    for part in path:
        node = node.get(part) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def _resolve(
    section: dict[str, Any],
    name: str,
    key: str,
    shipped: bool,
    overridden: set[str],
    environ: Mapping[str, str],
) -> str:
    """Where `section[name]` comes from, after putting the environment's value there when
    it takes precedence."""
    if key in overridden:
        return "--set"
    if name in section and not shipped:
        return "the config file"
    if environ.get(ENV_OF[name]):
        section[name] = environ[ENV_OF[name]]
        return f"${ENV_OF[name]}"
    return "the preset" if name in section else "the default"
