"""Prefect artifacts a person reads in the UI: class/source counts, shard balance, and the
training and evaluation summary with the MLflow run link."""

from __future__ import annotations

import re
from pathlib import Path

from prefect.artifacts import create_markdown_artifact, create_table_artifact

from flows.arms import FIGURE_NAMES, figures, worst_class
from flows.promotion import promotion_lines
from flows.results import Evaluation, PipelineResult, TrainingResult
from flows.runlog import count
from preprocessing.contract.manifest import Manifest, read_manifest
from tracking.run.runs import how_to_open, run_page_url, ui_command
from tracking.run.spool import is_local_run


def class_rows_after(manifest: Manifest) -> dict[str, int]:
    """Training rows per class label in the committed version."""
    totals: dict[str, int] = {}
    for shard in manifest.split("train").shards:
        for label, rows in shard.class_counts.items():
            totals[label] = totals.get(label, 0) + rows
    return totals


def run_spool_dir(training: TrainingResult | None) -> str | None:
    """Where the job kept what MLflow could not take (its delivery report says), if any."""
    delivery = training.tracking_delivery if training else None
    spool = (delivery or {}).get("spool")
    return str(Path(spool).parent) if spool else None


def how_to_open_run(run_id: str, tracking_uri: str, training: TrainingResult | None = None) -> str:
    """The run's page on the tracking server, or how to open or send it (from the spool of
    `training`, the job that logged it)."""
    return how_to_open(tracking_uri, run_id, run_spool_dir(training))


def publish_dataset(manifest: Manifest, arm: str) -> None:
    """Tables of rows per class and per source before/after, and of shard sizes, keyed by
    the arm (`rebalanced-class-mix`, `natural-mix-class-mix`): a pipeline run publishes
    both arms' versions side by side."""
    after = class_rows_after(manifest)
    create_table_artifact(
        [
            {
                "class": str(label),
                "input rows": manifest.input_class_counts.get(str(label), 0),
                "training rows": after.get(str(label), 0),
            }
            for label in manifest.classes
        ],
        key=f"{arm}-class-mix",
        description=f"dataset version {manifest.version_id} "
        f"({arm}): rows per class in the input and in the training split",
    )
    sources: dict[str, int] = {}
    for shard in manifest.split("train").shards:
        for source, rows in shard.source_counts.items():
            sources[source] = sources.get(source, 0) + rows
    create_table_artifact(
        [
            {
                "source": source,
                "input rows": manifest.input_source_counts.get(source, 0),
                "training rows": sources.get(source, 0),
            }
            for source in sorted(sources)
        ],
        key=f"{arm}-source-mix",
        description=f"dataset version {manifest.version_id} "
        f"({arm}): rows per source in the input and in the training split",
    )
    create_table_artifact(
        [
            {
                "split": name,
                "shards": len(split.shards),
                "min rows": min(s.num_rows for s in split.shards),
                "max rows": max(s.num_rows for s in split.shards),
            }
            for name, split in manifest.splits.items()
        ],
        key=f"{arm}-shard-balance",
        description=f"dataset version {manifest.version_id} "
        f"({arm}): shards and the fewest and most rows in one, per split",
    )
    create_markdown_artifact(
        increment_summary(manifest),
        key=f"{arm}-increment",
        description=f"dataset version {manifest.version_id}: files read "
        "and skipped, shards reused from its parent",
    )


def comparison_lines(evaluations: dict[str, Evaluation]) -> list[str]:
    """A Markdown table: one column per arm, one row per figure, on the same held-out rows."""
    arms = list(evaluations)
    num_rows = next(iter(evaluations.values())).num_rows
    lines = [f"| held-out ({num_rows} rows) | {' | '.join(arms)} |", f"|---|{'---|' * len(arms)}"]
    by_arm = {arm: figures(evaluation) for arm, evaluation in evaluations.items()}
    for name in FIGURE_NAMES:
        lines.append(f"| {name} | {' | '.join(_cell(by_arm[arm][name]) for arm in arms)} |")
    worst = [worst_class(evaluation) for evaluation in evaluations.values()]
    lines.append(
        f"| worst class | {' | '.join(markdown_text(w[0]) if w else 'n/a' for w in worst)} |"
    )
    if len(arms) > 1:
        lines += ["", same_rows_line(evaluations)]
    return lines


def same_rows_line(evaluations: dict[str, Evaluation]) -> str:
    """Why the arms' figures compare: one set of held-out rows for all of them."""
    first = next(iter(evaluations.values()))
    return (
        f"All arms are scored on the same {first.num_rows} held-out rows, those of "
        f"version {first.dataset_version}: the natural-mix version is cut from the "
        "same input files with the same seed, so it holds out the same rows, and one "
        "set of rows makes the figures differ by the model alone."
    )


def version_description(result: PipelineResult, arm: str, flow_run_name: str | None) -> str:
    """The registered version's description: arm, dataset version, held-out figures."""
    evaluation = result.evaluations[arm]
    scores = ", ".join(f"{name} {_cell(value)}" for name, value in figures(evaluation).items())
    baseline = evaluation.class_prior_baseline
    return (
        f"Arm `{arm}` of flow run `{flow_run_name}`, trained on dataset version "
        f"{result.version_id} (MLflow run {result.run_id}). Held-out "
        f"({evaluation.num_rows} rows of version {evaluation.dataset_version}): "
        f"{scores}; the class-prior baseline on the same rows: macro-F1 "
        f"{_cell(baseline['macro_f1'])}, balanced accuracy "
        f"{_cell(baseline['balanced_accuracy'])}."
    )


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def markdown_text(value: object) -> str:
    """A value of the data (a class label: any string) as literal Markdown text that fits
    in a table cell: Markdown's punctuation escaped, `|` included, and no line breaks."""
    text = " ".join(str(value).splitlines())
    return re.sub(r"([\\`*_{}\[\]()<>#+\-.!|~])", r"\\\1", text)


def _description(training: TrainingResult, result: PipelineResult | None) -> str:
    arms = " and ".join(result.evaluations if result else {}) or "no held-out evaluation"
    version = result.version_id if result else training.manifest_uri
    return (
        f"training on dataset version {version}: held-out macro-F1, balanced accuracy "
        f"and worst-class recall ({arms}), the registration and the MLflow "
        f"{'runs' if result and len(result.runs) > 1 else 'run'}"
    )


def increment_summary(manifest: Manifest) -> str:
    """Markdown: what this version read and what it took from its parent unread."""
    if not manifest.deltas:
        return f"# Dataset version {manifest.version_id}\n\n- no lineage recorded"
    own = manifest.deltas[-1]
    listed_bytes = sum(record.num_bytes for record in manifest.inputs)
    reused = sum(entry.version is not None for entry in manifest.split("train").shards)
    return "\n".join(
        [
            f"# Dataset version {manifest.version_id}",
            "",
            f"- parent: {manifest.parent_version or 'none (a full reshard)'}; chain of "
            f"{count(len(manifest.deltas), 'version')}",
            f"- input files: {own.num_files} read (new), "
            f"{len(manifest.inputs) - own.num_files} skipped of {len(manifest.inputs)}",
            f"- input bytes: {own.num_bytes} read, {listed_bytes - own.num_bytes} skipped",
            f"- training rows added: {own.added_rows()} of {manifest.split('train').num_rows}",
            f"- training shards: {reused} reused from earlier versions, "
            f"{len(manifest.split('train').shards) - reused} written",
        ]
    )


def run_link_line(
    run_id: str, tracking_uri: str, arm: str | None = None, training: TrainingResult | None = None
) -> str:
    """A link to the run (`arm`'s, else labelled as the run's own) on the configured server;
    with no server (a local store) or a run not on it yet, no link but how to open (or
    send) it (from the spool of `training`)."""
    label = f"MLflow run ({arm})" if arm else "MLflow run"
    url = run_page_url(tracking_uri, run_id)
    if url is not None:
        return f"- {label}: [{run_id}]({url})"
    if is_local_run(run_id):
        return f"- {label} {run_id}: {how_to_open_run(run_id, tracking_uri, training)}"
    return (
        f"- {label} {run_id}: no server to link to; open a UI on the store with "
        f"`{ui_command(tracking_uri)}`, then its page `#/runs/{run_id}`"
    )


def run_description(
    arm: str, job: TrainingResult, holdout_uri: str, flow_run_name: str | None
) -> str:
    """An arm's MLflow run description: which flow run, which version it trained on, which
    split its `val_*` metrics are of and which rows its `holdout_*` metrics are of (the
    same for every arm)."""
    trained, _ = read_manifest(job.manifest_uri)
    held, _ = read_manifest(holdout_uri)
    chosen = job.checkpoint_chosen_on
    validated = f"Its `val_*` metrics are on its {chosen} split. " if chosen else ""
    return (
        f"Arm `{arm}` of flow run `{flow_run_name}`: trained on dataset version "
        f"{trained.version_id} ({trained.config['mix']['class_weighting']} class mix). "
        f"{validated}Its `holdout_*` metrics are on the {held.split('holdout').num_rows} held-out "
        f"rows of version {held.version_id}, the same rows for every arm of the run."
    )


def publish_training(
    training: TrainingResult,
    tracking_uri: str | None,
    arm: str | None = None,
    result: PipelineResult | None = None,
) -> None:
    """Markdown: figures of `arm`'s job, and of the pipeline's `result` (when a pipeline
    ran it) both arms side by side and the registration; the runs' links."""
    job = f" ({arm})" if arm else ""
    lines = [
        "# Training summary",
        "",
        f"- training job{job}: {count(training.world_size, 'rank')}, "
        f"{count(training.epochs, 'epoch')}, batches per rank "
        f"{training.batches_per_rank}; validation macro-F1 "
        f"{_cell(training.val_macro_f1)}",
    ]
    if result is not None and result.evaluations:
        lines += ["", *comparison_lines(result.evaluations), ""]
    if result is not None and result.registration is not None:
        registration = result.registration
        lines.append(
            f"- registered {registration.name} v{registration.version} as `{registration.alias}`"
        )
        lines += [f"  -{line[1:]}" for line in promotion_lines(registration)]
    if training.run_id and tracking_uri:
        lines += _run_links(training, training.run_id, tracking_uri, result.runs if result else {})
    create_markdown_artifact(
        "\n".join(lines), key="training-summary", description=_description(training, result)
    )


def _run_links(
    training: TrainingResult, run_id: str, tracking_uri: str, runs: dict[str, str | None]
) -> list[str]:
    """A link per arm's run (`runs`), or to the job's own run when there are no arms."""
    if not runs:
        return [run_link_line(run_id, tracking_uri, training=training)]
    return [
        run_link_line(arm_run, tracking_uri, arm, training)
        for arm, arm_run in runs.items()
        if arm_run
    ]
