"""tracking.lifecycle.metrics against values worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from tracking.lifecycle.metrics import confusion_matrix, macro_f1, per_class_recall

PRED = [0, 0, 1, 1, 2, 2, 2]
TARGET = [0, 1, 1, 1, 2, 0, 2]
# rows = true class, columns = predicted class
HAND_CM = [[1, 0, 1], [1, 2, 0], [0, 0, 2]]


def test_confusion_matrix_counts_true_by_predicted() -> None:
    """Entry [i, j] counts samples of true class i predicted as j."""
    assert confusion_matrix(np.array(PRED), np.array(TARGET), 3).tolist() == HAND_CM


def test_confusion_matrix_rejects_out_of_range_classes() -> None:
    """A class index outside [0, C) is an error, not a silently wrong matrix."""
    with pytest.raises(ValueError, match="outside"):
        confusion_matrix(np.array([0, 3]), np.array([0, 1]), 3)


def test_macro_f1_hand_value() -> None:
    """F1 per class is 2TP / (support + predicted): 2/4, 4/5, 4/5; macro = 0.7."""
    assert macro_f1(np.array(HAND_CM)) == pytest.approx(0.7)


def test_per_class_recall_hand_value() -> None:
    """Recall per class is TP / support: 1/2, 2/3, 2/2."""
    assert per_class_recall(np.array(HAND_CM)) == pytest.approx([0.5, 2 / 3, 1.0])


def test_absent_class_is_left_out_of_macro_f1_and_has_nan_recall() -> None:
    """A class neither present nor predicted changes no average; its recall is undefined."""
    cm = np.zeros((4, 4), dtype=np.int64)
    cm[:3, :3] = HAND_CM
    assert macro_f1(cm) == pytest.approx(0.7)
    assert np.isnan(per_class_recall(cm)[3])


def test_predicted_but_absent_class_scores_zero_f1() -> None:
    """A class predicted but never present has F1 0 and pulls the macro average down."""
    cm = np.array([[2, 1], [0, 0]])
    # class 0: 2*2 / (3 + 2) = 0.8; class 1: 0 / (0 + 1) = 0
    assert macro_f1(cm) == pytest.approx(0.4)


def test_perfect_and_empty_matrices() -> None:
    """A diagonal matrix scores 1; an all-zero one scores 0 rather than failing."""
    assert macro_f1(np.diag([3, 1, 5])) == pytest.approx(1.0)
    assert macro_f1(np.zeros((3, 3))) == 0.0
