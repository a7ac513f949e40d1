"""`summary.json`: what a training run reports back to its launcher.

Rank 0 writes it under the run's `output_dir` (training/train.py); the launcher
reads it back (training/launch/job.py). Light on purpose (json, numpy, fsspec) so
that a flow reading a summary imports neither torch nor Lightning.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from fsspec.core import url_to_fs

from tracking.metrics import macro_f1, per_class_recall

SUMMARY_NAME = "summary.json"


def summary_uri(output_dir: str) -> str:
    return f"{output_dir.rstrip('/')}/{SUMMARY_NAME}"


def confusion_summary(confusion: np.ndarray | None, classes: list[str]) -> dict[str, Any]:
    """Macro F1, recall per class (None without support) and the matrix itself."""
    if confusion is None:
        return {"val_macro_f1": None, "val_recall": {}, "confusion_matrix": None}
    recall = per_class_recall(confusion)
    return {
        "val_macro_f1": macro_f1(confusion),
        "val_recall": {
            name: None if math.isnan(value) else float(value)
            for name, value in zip(classes, recall, strict=True)
        },
        "confusion_matrix": np.asarray(confusion).tolist(),
    }


def write_summary(output_dir: str, summary: dict[str, Any]) -> str:
    """Write `summary.json` under `output_dir` (any fsspec URI) and return its URI."""
    uri = summary_uri(output_dir)
    fs, path = url_to_fs(uri)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, json.dumps(summary, indent=1, sort_keys=True).encode())
    return uri


def read_summary(output_dir: str) -> dict[str, Any]:
    """The summary rank 0 wrote under `output_dir`."""
    fs, path = url_to_fs(summary_uri(output_dir))
    summary: dict[str, Any] = json.loads(fs.cat_file(path))
    return summary
