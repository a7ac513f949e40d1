"""The short text summary a person reads after a pipeline run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flows.arms import worst_class
from flows.promotion import promotion_lines
from preprocessing.contract.manifest import Manifest
from tracking.run import how_to_open


def class_rows_after(manifest: Manifest) -> dict[str, int]:
    """Training rows per class label in the committed version."""
    totals: dict[str, int] = {}
    for shard in manifest.split("train").shards:
        for label, count in shard.class_counts.items():
            totals[label] = totals.get(label, 0) + count
    return totals


def run_spool_dir(training: dict[str, Any]) -> str | None:
    """Where the job kept what MLflow could not take (its delivery report says), if any."""
    spool = (training.get("tracking_delivery") or {}).get("spool")
    return str(Path(spool).parent) if spool else None


def how_to_open_run(result: dict[str, Any], tracking_uri: str) -> str:
    """The run's page on the tracking server, or how to open or send it."""
    return how_to_open(tracking_uri, result["run_id"],
                       run_spool_dir(result.get("training") or {}))


def dataset_lines(manifest: Manifest, reused: bool) -> list[str]:
    after = class_rows_after(manifest)
    mix = manifest.config["mix"]["class_weighting"]
    lines = [f"dataset version {manifest.version_id}"
             f"{' (reused, no resharding)' if reused else ''}",
             f"  class      input rows -> training rows ({mix} mix)"]
    lines += [f"  {label!s:<8} {manifest.input_class_counts.get(str(label), 0):>11} -> "
              f"{after.get(str(label), 0):>7}" for label in manifest.classes]
    for name, split in manifest.splits.items():
        rows = [shard.num_rows for shard in split.shards]
        lines.append(f"  {name}: {len(rows)} shards, rows per shard {min(rows)}..{max(rows)}")
    lines.append(f"  rejected input files: {len(manifest.rejected)}")
    return lines


def evaluation_lines(evaluations: dict[str, dict[str, Any]]) -> list[str]:
    lines = []
    for name, evaluation in evaluations.items():
        worst = worst_class(evaluation)
        lines.append(f"  {name:<12} macro-F1 {evaluation['macro_f1']:.3f}, balanced accuracy "
                     f"{evaluation['balanced_accuracy']:.3f}, worst-class recall "
                     f"{f'{worst[1]:.3f} ({worst[0]})' if worst else 'n/a'}")
    return lines


def format_summary(manifest: Manifest, result: dict[str, Any], tracking_uri: str | None) -> str:
    """Rows per class before/after, shard balance, validation figures and the MLflow run."""
    lines = ["", *dataset_lines(manifest, bool(result.get("reused")))]
    training = result["training"]
    lines.append(f"training: {training['world_size']} ranks, batches per rank "
                 f"{training['batches_per_rank']}, validation macro-F1 "
                 f"{training['val_macro_f1']:.3f}")
    if result.get("evaluations"):
        lines.append("held-out evaluation (same rows for both):")
        lines += evaluation_lines(result["evaluations"])
    if result.get("registration"):
        registration = result["registration"]
        lines.append(f"model {registration['name']} v{registration['version']}: "
                     f"{registration['alias']}")
        lines += promotion_lines(registration)
    if result.get("run_id") and tracking_uri:
        lines.append(f"MLflow run {result['run_id']}:")
        lines.append(f"  {how_to_open_run(result, tracking_uri)}")
    return "\n".join(lines)
