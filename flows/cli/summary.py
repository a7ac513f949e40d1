"""The short text summary a person reads after a pipeline run."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from flows.arms import worst_class
from flows.promotion import promotion_lines
from flows.report import class_rows_after, how_to_open_run
from flows.results import DatasetVersion, Evaluation, PipelineResult
from preprocessing.contract.manifest import Manifest, read_manifest
from preprocessing.contract.notices import identifying_lines, unlabelled_lines


def dataset_lines(manifest: Manifest, reused: bool) -> list[str]:
    after = class_rows_after(manifest)
    mix = manifest.config["mix"]["class_weighting"]
    lines = [
        f"dataset version {manifest.version_id}{' (reused, no resharding)' if reused else ''}",
        f"  class      input rows -> training rows ({mix} mix)",
    ]
    lines += [
        f"  {label!s:<8} {manifest.input_class_counts.get(str(label), 0):>11} -> "
        f"{after.get(str(label), 0):>7}"
        for label in manifest.classes
    ]
    for name, split in manifest.splits.items():
        rows = [shard.num_rows for shard in split.shards]
        lines.append(f"  {name}: {len(rows)} shards, rows per shard {min(rows)}..{max(rows)}")
    lines.append(f"  rejected input files: {len(manifest.rejected)}")
    lines += [f"  {line}" for line in unlabelled_lines(manifest)]
    return lines + [f"  warning: {line}" for line in identifying_lines(manifest)]


def evaluation_lines(evaluations: dict[str, Evaluation]) -> list[str]:
    lines = []
    for name, evaluation in evaluations.items():
        worst = worst_class(evaluation)
        lines.append(
            f"  {name:<12} macro-F1 {evaluation.macro_f1:.3f}, balanced accuracy "
            f"{evaluation.balanced_accuracy:.3f}, worst-class recall "
            f"{f'{worst[1]:.3f} ({worst[0]})' if worst else 'n/a'}"
        )
    return lines


def chosen_on(split: str | None) -> str:
    """Which rows the validation figures (and any checkpoint choice) were on."""
    if split == "holdout":  # the rows evaluation and promotion read too
        return " (on the holdout, which also judged it: set dataset.validation_fraction)"
    return f" (on the {split} split)" if split else ""


def kept_epoch(selection: dict[str, Any] | None) -> str:
    """`train.select_best`'s choice (epochs 0-based, as its tag counts), or nothing."""
    if not selection or selection.get("epoch") is None:
        return ""
    run = selection["epochs_validated"]
    return f"; kept epoch {selection['epoch']} of 0-{run - 1} by {selection['monitor']}"


def format_summary(manifest: Manifest, result: PipelineResult, tracking_uri: str | None) -> str:
    """Rows per class before/after, shard balance, validation figures and the MLflow run."""
    lines = ["", *dataset_lines(manifest, result.reused)]
    training = result.training
    arms = list(result.runs)  # this run's own arm first
    arm = f" ({arms[0]})" if len(arms) > 1 else ""  # which arm's job, beside the others
    lines.append(
        f"training{arm}: {training.world_size} ranks, batches per rank "
        f"{training.batches_per_rank}, validation macro-F1 "
        f"{training.val_macro_f1:.3f}{chosen_on(training.checkpoint_chosen_on)}"
        f"{kept_epoch((training.model_extra or {}).get('selection'))}"
    )
    if result.evaluations:
        lines += held_out_lines(result.evaluations)
    if result.registration is not None:
        registration = result.registration
        lines.append(f"model {registration.name} v{registration.version}: {registration.alias}")
        lines += promotion_lines(registration)
    if result.run_id and tracking_uri:
        runs = result.runs or {"run": result.run_id}
        lines.append("MLflow runs: " + ", ".join(f"{arm} {run}" for arm, run in runs.items()))
        if result.night_run_id:  # the night's run: the arms' runs are its children
            night = how_to_open_run(result.night_run_id, tracking_uri, training)
            lines.append(f"  the night's run {result.night_run_id}: {night}")
        else:
            lines.append(f"  {how_to_open_run(result.run_id, tracking_uri, training)}")
    return "\n".join(lines)


def held_out_lines(evaluations: dict[str, Evaluation]) -> list[str]:
    """Which held-out rows, then each arm's figures on them."""
    first = next(iter(evaluations.values()))
    both = (
        ", every arm on the same rows (the natural-mix version holds out the same "
        "rows: same files and seed)"
        if len(evaluations) > 1
        else ""
    )
    return [
        f"held-out evaluation on {first.num_rows} rows of version {first.dataset_version}{both}:",
        *evaluation_lines(evaluations),
    ]


def format_result(params: BaseModel, result: object) -> str:
    """A flow's result as a person reads it at the end of `ballast run`: the pipeline's
    summary, a dataset version's class table, or the result's scalar fields."""
    if isinstance(result, PipelineResult):
        tracking = getattr(getattr(params, "train", None), "tracking", None)
        manifest, _ = read_manifest(result.manifest_uri)
        return format_summary(manifest, result, tracking.tracking_uri if tracking else None)
    if isinstance(result, DatasetVersion):
        manifest, _ = read_manifest(result.manifest_uri)
        return "\n".join(dataset_lines(manifest, result.reused))
    return "\n".join(scalar_lines(to_jsonable_python(result, fallback=str)))


def scalar_lines(result: dict[str, Any], indent: str = "") -> list[str]:
    """`key: value` per scalar field; a nested dict one level down, longer ones counted."""
    lines = []
    for key, value in result.items():
        if isinstance(value, dict) and not indent:
            lines += [f"{key}:", *scalar_lines(value, "  ")]
        elif isinstance(value, dict | list):
            lines.append(f"{indent}{key}: ({len(value)} entries)")
        else:
            lines.append(f"{indent}{key}: {value}")
    return lines
