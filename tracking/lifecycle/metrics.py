"""Classification metrics over a confusion matrix: pure numpy, no torch.

The model accumulates a confusion matrix during validation (all-reduced across
ranks), and these functions turn it into the figures that are logged and
written to `summary.json`. Rows of a confusion matrix are true classes,
columns are predicted classes.
"""

from __future__ import annotations

import numpy as np


def confusion_matrix(pred: np.ndarray, target: np.ndarray, num_classes: int) -> np.ndarray:
    """Counts of (true class, predicted class) pairs as an int64 [C, C] matrix."""
    pred = np.asarray(pred, dtype=np.int64).ravel()
    target = np.asarray(target, dtype=np.int64).ravel()
    if pred.shape != target.shape:
        raise ValueError(f"pred has {pred.size} entries but target has {target.size}")
    for name, values in (("pred", pred), ("target", target)):
        if values.size and (values.min() < 0 or values.max() >= num_classes):
            raise ValueError(f"{name} holds class indices outside [0, {num_classes})")
    flat = np.bincount(target * num_classes + pred, minlength=num_classes * num_classes)
    return flat.reshape(num_classes, num_classes)


def per_class_f1(cm: np.ndarray) -> np.ndarray:
    """F1 of each class; NaN for a class that is neither present nor predicted."""
    cm = np.asarray(cm, dtype=np.float64)
    true_pos = np.diag(cm)
    denominator = cm.sum(axis=0) + cm.sum(axis=1)  # = 2 TP + FP + FN
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, 2 * true_pos / denominator, np.nan)


def macro_f1(cm: np.ndarray) -> float:
    """Unweighted mean F1 over the classes that are present or predicted (0.0 if none)."""
    scores = per_class_f1(cm)
    defined = scores[~np.isnan(scores)]
    return float(defined.mean()) if defined.size else 0.0


def per_class_recall(cm: np.ndarray) -> np.ndarray:
    """Recall (true positives / support) of each class; NaN for a class with no support."""
    cm = np.asarray(cm, dtype=np.float64)
    support = cm.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(support > 0, np.diag(cm) / support, np.nan)


def class_prior_baseline(support: np.ndarray) -> dict[str, float]:
    """The best macro-F1 and balanced accuracy of a guess that knows only the class
    frequencies of these rows (`support`: rows per true class): always the most frequent
    class, or each class at random with its frequency (the expected confusion matrix)."""
    support = np.asarray(support, dtype=np.float64)
    if not support.sum():
        return {"macro_f1": 0.0, "balanced_accuracy": 0.0}
    majority = np.zeros((len(support), len(support)))
    majority[:, int(support.argmax())] = support
    stratified = np.outer(support, support / support.sum())
    guesses = [majority, stratified]
    return {
        "macro_f1": max(macro_f1(cm) for cm in guesses),
        "balanced_accuracy": max(float(np.nanmean(per_class_recall(cm))) for cm in guesses),
    }
