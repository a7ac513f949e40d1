"""Prefect artifacts a person reads in the UI: class/source counts, shard balance, and the
training and evaluation summary with the MLflow run link."""

from __future__ import annotations

from typing import Any

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.summary import class_rows_after, how_to_open_run
from preprocessing.manifest import Manifest
from tracking.run import run_page_url, ui_command
from tracking.spool import is_local_run


def publish_dataset(manifest: Manifest) -> None:
    """Tables of rows per class and per source before/after, and of shard sizes."""
    after = class_rows_after(manifest)
    create_table_artifact(
        [{"class": str(label), "input rows": manifest.input_class_counts.get(str(label), 0),
          "training rows": after.get(str(label), 0)} for label in manifest.classes],
        key="class-mix", description=f"dataset version {manifest.version_id}: rows per class")
    sources: dict[str, int] = {}
    for shard in manifest.split("train").shards:
        for source, count in shard.source_counts.items():
            sources[source] = sources.get(source, 0) + count
    create_table_artifact(
        [{"source": source, "input rows": manifest.input_source_counts.get(source, 0),
          "training rows": sources.get(source, 0)} for source in sorted(sources)],
        key="source-mix", description="rows per source")
    create_table_artifact(
        [{"split": name, "shards": len(split.shards),
          "min rows": min(s.num_rows for s in split.shards),
          "max rows": max(s.num_rows for s in split.shards)}
         for name, split in manifest.splits.items()],
        key="shard-balance", description="rows per shard, per split")


def run_link_line(result: dict[str, Any], tracking_uri: str) -> str:
    """A link to the run on the configured server; with no server (a local store) or a run
    not on it yet, no link but how to open (or send) it."""
    run_id = result["run_id"]
    url = run_page_url(tracking_uri, run_id)
    if url is not None:
        return f"- MLflow run: [{run_id}]({url})"
    if is_local_run(run_id):
        return f"- MLflow run {run_id}: {how_to_open_run(result, tracking_uri)}"
    return (f"- MLflow run {run_id}: no server to link to; open a UI on the store with "
            f"`{ui_command(tracking_uri)}`, then its page `#/runs/{run_id}`")


def publish_training(result: dict[str, Any], tracking_uri: str | None) -> None:
    """Markdown: figures of the job, evaluations, registration and the MLflow run link."""
    training = result["training"]
    lines = ["# Training summary", "",
             f"- ranks: {training['world_size']}, batches per rank: "
             f"{training['batches_per_rank']}",
             f"- validation macro-F1: {training['val_macro_f1']:.4f}"]
    for name, evaluation in (result.get("evaluations") or {}).items():
        lines.append(f"- {name}: macro-F1 {evaluation['macro_f1']:.4f} on "
                     f"{evaluation['num_rows']} held-out rows")
    if result.get("registration"):
        registration = result["registration"]
        lines.append(f"- registered {registration['name']} v{registration['version']} as "
                     f"`{registration['alias']}`")
    if result.get("run_id") and tracking_uri:
        lines.append(run_link_line(result, tracking_uri))
    create_markdown_artifact("\n".join(lines), key="training-summary")
