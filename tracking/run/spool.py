"""A run's records that its tracking server could not take, kept on local disk until sent.

One directory per run, `<spool_dir>/<run key>/`, where the key is the server's run id, or
`local-<hex>` for a run the server has not seen yet (it was down when the job started):

    run.json            where it goes (experiment, run name, tags) and, once created, the
                        server's run id; the tracking URI is stored without its password
    params.json         params, already flattened
    tags.json           tags set after the run's creation (a night's decision)
    lineage.json        the dataset version's manifest URI (the manifest is an artifact)
    artifacts/          files to log, at their artifact paths
    metrics/<w>.jsonl   metric values, one file per writer (the rank-0 logger, each node's
                        system-metrics sampler), so writers never interleave
    model/              the trained model as an MLflow model (loadable as it is)
    finish.json         the job's summary and checkpoint location, when the run was closed
    progress.json       what has been sent, so a repeated upload sends nothing twice

`tracking.run.runs.deliver` sends it; `python -m tracking upload <dir>` is the command for a person.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlflow.entities import Metric

from preprocessing.contract.manifest import MANIFEST_NAME
from preprocessing.toolbox.secrets import redact
from tracking.config import TrackingConfig

MANIFEST_ARTIFACT = f"dataset/{MANIFEST_NAME}"  # where a run keeps its version's manifest

LOCAL_PREFIX = "local-"
DEFAULT_SPOOL_DIR = "~/.ballast/mlflow-spool"


def is_local_run(run_id: str) -> bool:
    """A run id that only this spool knows (the server has not created the run yet)."""
    return run_id.startswith(LOCAL_PREFIX)


def new_local_run_id() -> str:
    return f"{LOCAL_PREFIX}{uuid.uuid4().hex}"


def write_json(path: Path, value: Any) -> None:
    """Write through a temporary file and a rename: a crash leaves the old file or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(json.dumps(value, indent=1, sort_keys=True, default=str))
    os.replace(temporary, path)


def read_json(path: Path, default: Any = None) -> Any:
    return json.loads(path.read_text()) if path.exists() else default


class Spool:
    """The spool directory of one run (nothing is written until something is kept)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser().absolute()

    @classmethod
    def of_run(cls, config: TrackingConfig, run_id: str) -> Spool:
        return cls(Path(config.spool_dir or DEFAULT_SPOOL_DIR) / run_id)

    def exists(self) -> bool:
        return (self.path / "run.json").exists()

    def open(self, config: TrackingConfig, tags: dict[str, str] | None = None) -> Spool:
        """Make the directory and its run.json (once); returns self."""
        if not self.exists():
            server_id = None if is_local_run(self.path.name) else self.path.name
            write_json(
                self.path / "run.json",
                {
                    "tracking_uri": redact(config.tracking_uri),
                    "experiment": config.experiment,
                    "artifact_location": config.artifact_location,
                    "run_name": config.run_name,
                    "tags": tags or {},
                    "run_id": server_id,
                    "host": socket.gethostname(),
                },
            )
        return self

    @property
    def run(self) -> dict[str, Any]:
        return dict(read_json(self.path / "run.json", {}))

    def set_server_run_id(self, run_id: str) -> None:
        write_json(self.path / "run.json", self.run | {"run_id": run_id})

    def tracking_config(self, tracking_uri: str | None = None) -> TrackingConfig:
        """The run's tracking settings; `tracking_uri` replaces the stored (redacted) one."""
        run = self.run
        return TrackingConfig(
            tracking_uri=tracking_uri or run["tracking_uri"],
            experiment=run["experiment"],
            run_name=run["run_name"],
            artifact_location=run["artifact_location"],
            spool_dir=str(self.path.parent),
        )

    def add_params(self, params: dict[str, str]) -> None:
        write_json(self.path / "params.json", self.params() | params)

    def params(self) -> dict[str, str]:
        return dict(read_json(self.path / "params.json", {}))

    def add_tags(self, tags: dict[str, str]) -> None:
        write_json(self.path / "tags.json", self.tags() | tags)

    def tags(self) -> dict[str, str]:
        return dict(read_json(self.path / "tags.json", {}))

    def set_lineage(self, manifest_uri: str, manifest_json: str) -> None:
        self.add_artifact_text(MANIFEST_ARTIFACT, manifest_json)
        write_json(self.path / "lineage.json", {"manifest_uri": manifest_uri})
        self.mark("lineage", False)

    def lineage(self) -> dict[str, str] | None:
        return read_json(self.path / "lineage.json")

    @property
    def artifacts_dir(self) -> Path:
        return self.path / "artifacts"

    def add_artifact_text(self, artifact_path: str, text: str) -> None:
        target = self.artifacts_dir / artifact_path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)

    def append_metrics(self, writer: str, metrics: list[Metric]) -> None:
        """Append values to this writer's file (flushed and fsynced: they may be all that
        is left of them)."""
        target = self.path / "metrics" / f"{writer}.jsonl"
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a") as handle:
            for metric in metrics:
                handle.write(
                    json.dumps(
                        {
                            "key": metric.key,
                            "value": metric.value,
                            "timestamp": metric.timestamp,
                            "step": metric.step,
                        }
                    )
                    + "\n"
                )
            handle.flush()
            os.fsync(handle.fileno())

    def unsent_metrics(self) -> Iterator[tuple[str, int, list[Metric]]]:
        """(file name, lines sent so far, the values after them) for each metrics file."""
        sent = self.progress().get("metric_lines", {})
        for path in sorted((self.path / "metrics").glob("*.jsonl")):
            lines = path.read_text().splitlines()[sent.get(path.name, 0) :]
            values = [
                Metric(r["key"], float(r["value"]), int(r["timestamp"]), int(r["step"]))
                for r in map(json.loads, lines)
                if r
            ]
            yield path.name, sent.get(path.name, 0), values

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    def record_finish(
        self, summary: dict[str, Any], manifest_json: str | None, checkpoint_dir: str | None
    ) -> None:
        write_json(
            self.path / "finish.json",
            {"summary": summary, "manifest": manifest_json, "checkpoint_dir": checkpoint_dir},
        )
        self.mark("closed", False)  # a later close replaces an earlier one

    def finish(self) -> dict[str, Any] | None:
        return read_json(self.path / "finish.json")

    def progress(self) -> dict[str, Any]:
        return dict(read_json(self.path / "progress.json", {}))

    def mark(self, name: str, value: Any = True) -> None:
        write_json(self.path / "progress.json", self.progress() | {name: value})

    def mark_metric_lines(self, file_name: str, num_lines: int) -> None:
        lines = self.progress().get("metric_lines", {}) | {file_name: num_lines}
        self.mark("metric_lines", lines)

    def upload_command(self) -> str:
        return f"python -m tracking upload {self.path}"
