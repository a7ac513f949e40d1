"""The short text summary a person reads after a pipeline run."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

from preprocessing.manifest import Manifest


def class_rows_after(manifest: Manifest) -> dict[str, int]:
    """Training rows per class label in the committed version."""
    totals: dict[str, int] = {}
    for shard in manifest.split("train").shards:
        for label, count in shard.class_counts.items():
            totals[label] = totals.get(label, 0) + count
    return totals


def mlflow_ui_command(tracking_uri: str, run_id: str) -> str:
    """The exact command that opens the MLflow UI on this tracking store, and the run's page."""
    page = f"#/experiments/{experiment_of(tracking_uri, run_id)}/runs/{run_id}"
    if urlparse(tracking_uri).scheme in ("http", "https"):
        return f"open {tracking_uri.rstrip('/')}/{page}"
    return (f".venv/bin/mlflow ui --backend-store-uri {tracking_uri} --port 5000\n"
            f"  then open http://127.0.0.1:5000/{page}")


def experiment_of(tracking_uri: str, run_id: str) -> str:
    from mlflow.tracking import MlflowClient

    return str(MlflowClient(tracking_uri).get_run(run_id).info.experiment_id)


def format_summary(manifest: Manifest, result: dict[str, Any], tracking_uri: str | None) -> str:
    """Rows per class before/after, shard balance, validation figures and the MLflow run."""
    after = class_rows_after(manifest)
    labels = [str(label) for label in manifest.classes]
    lines = ["", f"dataset version {manifest.version_id}"
             f"{' (reused, no resharding)' if result.get('reused') else ''}",
             f"  class      input rows -> training rows "
             f"({manifest.config['mix']['class_weighting']} mix)"]
    lines += [f"  {label:<8} {manifest.input_class_counts.get(label, 0):>11} -> "
              f"{after.get(label, 0):>7}" for label in labels]
    for name, split in manifest.splits.items():
        rows = [shard.num_rows for shard in split.shards]
        lines.append(f"  {name}: {len(rows)} shards, rows per shard {min(rows)}..{max(rows)}")
    lines.append(f"  rejected input files: {len(manifest.rejected)}")
    training = result["training"]
    lines.append(f"training: {training['world_size']} ranks, batches per rank "
                 f"{training['batches_per_rank']}, validation macro-F1 "
                 f"{training['val_macro_f1']:.3f}")
    if result.get("run_id") and tracking_uri:
        lines.append(f"MLflow run {result['run_id']}; open the UI with:")
        lines.append(f"  {mlflow_ui_command(tracking_uri, result['run_id'])}")
    return "\n".join(lines)
