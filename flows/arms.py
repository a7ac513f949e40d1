"""The arms of a pipeline run and the figures that compare them.

An arm is one (dataset version, model) pair trained the same way: `rebalanced` on the mix
the config asks for, `natural-mix` on the data as it came. The figures a person compares
them by are macro-F1 (which the natural mix tends to win: its frequent classes dominate)
next to balanced accuracy and the worst class's recall (which rebalancing is for).
"""

from __future__ import annotations

from flows.results import Evaluation

REBALANCED = "rebalanced"
NATURAL_MIX = "natural-mix"
FIGURE_NAMES = ("macro-F1", "balanced accuracy", "worst-class recall")


def arm_for(class_weighting: str) -> str:
    """The arm a dataset version belongs to, from its mix's `class_weighting`."""
    return NATURAL_MIX if class_weighting == "natural" else REBALANCED


def worst_class(evaluation: Evaluation) -> tuple[str, float] | None:
    """The class with the lowest held-out recall and that recall (classes without support
    have none and are skipped); None when no class has support."""
    recalls = [(label, value) for label, value in evaluation.recall.items() if value is not None]
    return min(recalls, key=lambda item: item[1]) if recalls else None


def figures(evaluation: Evaluation) -> dict[str, float | None]:
    """Macro-F1, balanced accuracy and worst-class recall of one evaluation."""
    worst = worst_class(evaluation)
    return {
        "macro-F1": evaluation.macro_f1,
        "balanced accuracy": evaluation.balanced_accuracy,
        "worst-class recall": worst[1] if worst else None,
    }
