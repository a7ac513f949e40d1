"""What ballast says in the Prefect run log: one line per result a person acts on.

preprocessing/, training/ and tracking/ never import prefect: their results come back to
the flow as values, and the flow logs them here through Prefect's run logger, so the log
tab of a flow run says which dataset version was made (rows in and out, shards, rejected
files), how training went (epochs, attempts, validation figures), what each arm scored on
held-out rows and what the registry did with the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefect import get_run_logger

from flows.arms import worst_class
from flows.promotion import promotion_lines
from flows.results import Evaluation, Predictions, Registration, TrainingResult
from preprocessing.contract.manifest import Manifest
from preprocessing.contract.notices import identifying_lines, unlabelled_lines

MAX_REJECTED_LINES = 20  # a run rejecting thousands of files must not flood the log
MAX_BALANCE_LINES = 20  # the last moves of the split: a slow node shows without a flood


def count(number: Any, noun: str) -> str:
    """`1 epoch`, `2 epochs`; a missing number (`None`) as `? epochs`."""
    if number is None:
        return f"? {noun}s"
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def log_reshard_start(arm: str, version_id: str, inputs: list[str], mix: str) -> None:
    get_run_logger().info(
        "reshard[%s]: dataset version %s from %s (%s class mix)",
        arm,
        version_id,
        ", ".join(inputs),
        mix,
    )


def log_dataset(arm: str, manifest: Manifest, reused: bool, cached: bool) -> None:
    """Rows in and out, shards per split and every rejected input file (with its reason)."""
    logger = get_run_logger()
    how = " (cached: no resharding)" if cached else " (reused)" if reused else ""
    splits = "; ".join(
        f"{name} {split.num_rows} rows in {len(split.shards)} shards of "
        f"{min(s.num_rows for s in split.shards)}.."
        f"{max(s.num_rows for s in split.shards)}"
        for name, split in manifest.splits.items()
    )
    rows_out = sum(split.num_rows for split in manifest.splits.values())
    logger.info(
        "reshard[%s]: dataset version %s%s: %d rows in -> %d rows out (%s); "
        "%d rejected input files",
        arm,
        manifest.version_id,
        how,
        sum(manifest.input_class_counts.values()),
        rows_out,
        splits,
        len(manifest.rejected),
    )
    for rejected in manifest.rejected[:MAX_REJECTED_LINES]:
        logger.warning("reshard[%s]: rejected %s: %s", arm, rejected.path, rejected.reason)
    if len(manifest.rejected) > MAX_REJECTED_LINES:
        logger.warning(
            "reshard[%s]: %d more rejected files are listed in the manifest",
            arm,
            len(manifest.rejected) - MAX_REJECTED_LINES,
        )
    for line in unlabelled_lines(manifest):
        logger.info("reshard[%s]: %s", arm, line.strip())
    for line in identifying_lines(manifest):
        logger.warning("reshard[%s]: %s", arm, line)


def log_training(arm: str, training: TrainingResult) -> None:
    """Epochs, ranks, attempts and the validation figures of a finished job."""
    get_run_logger().info(
        "train[%s]: %s on %s ranks, batches per rank %s, %s; validation "
        "macro-F1 %s, validation loss %s; MLflow run %s",
        arm,
        count(training.epochs, "epoch"),
        training.world_size,
        training.batches_per_rank,
        count(len(training.attempts), "attempt"),
        _number(training.val_macro_f1),
        _number(training.val_loss),
        training.run_id or "none (tracking off)",
    )
    figures = training.figures()
    if (ranks := straggler_line(figures)) is not None:
        get_run_logger().info("train[%s]: %s", arm, ranks)
    for line in balance_lines(figures):
        get_run_logger().info("train[%s]: %s", arm, line)


# The two below read figures of the job's summary.json that the flows pass on unread.
def balance_lines(summary: Mapping[str, Any]) -> list[str]:
    """The last moves of the split under `loader.balance: speed` (none otherwise), each
    as rank 0 noted it: "balance: step 40: rank 1 slower: 382/130 rows a step"."""
    moves = summary.get("balance_moves") or []
    return [f"balance: {move}" for move in moves[-MAX_BALANCE_LINES:]]


def straggler_line(summary: Mapping[str, Any]) -> str | None:
    """The slowest rank, its slowdown against the median and the share of the step lost
    to it, with every rank's step and blocked all-reduce time; None when not measured."""
    found = summary.get("straggler")
    if not found:
        return None
    per_step = ", ".join(
        f"rank {rank} {step * 1000:.1f} ms ({blocked * 1000:.1f} ms blocked in all-reduce)"
        for rank, (step, blocked) in enumerate(
            zip(summary["step_s_per_rank"], summary["allreduce_blocked_s_per_rank"], strict=True)
        )
    )
    return (
        f"slowest rank {found['rank']}, {found['slowdown_vs_median']:.2f}x the median "
        f"rank's busy time; the job loses {found['lost_share']:.1%} of each step waiting "
        f"for it; step time per rank: {per_step}"
    )


def log_evaluation(arm: str, evaluation: Evaluation) -> None:
    """Macro-F1, balanced accuracy and the worst class's recall on held-out rows."""
    worst = worst_class(evaluation)
    get_run_logger().info(
        "evaluate[%s]: %d held-out rows of version %s: macro-F1 %s, balanced accuracy %s, "
        "worst-class recall %s",
        arm,
        evaluation.num_rows,
        evaluation.dataset_version,
        _number(evaluation.macro_f1),
        _number(evaluation.balanced_accuracy),
        f"{worst[1]:.4f} ({worst[0]})" if worst else "n/a",
    )


def log_registration(arm: str, registration: Registration) -> None:
    get_run_logger().info("%s", registration_line(arm, registration))


def registration_line(arm: str, registration: Registration) -> str:
    """One line per registration: the version, its alias and held-out score, and why: the
    champion's score on the same rows and every reason of the decision (flows/promotion.py)."""
    details = "; ".join(line.strip() for line in promotion_lines(registration))
    return (
        f"register[{arm}]: {registration.name} v{registration.version} is "
        f"`{registration.alias}` (held-out macro-F1 {registration.score:.4f}); "
        f"{details or _versus(registration)}"
    )


def _versus(registration: Registration) -> str:
    """The champion's score, for a registration decided without the promotion step."""
    previous = registration.previous_champion_score
    if previous is not None:
        return f"champion's held-out macro-F1 was {previous:.4f}"
    if registration.previous_champion is not None:
        return f"champion v{registration.previous_champion} was not scored"
    return "no champion before"


def log_predictions(output: Predictions) -> None:
    get_run_logger().info(
        "predict: %d predictions committed as version %s at %s",
        output.num_rows,
        output.version_id,
        output.manifest_uri,
    )
