"""PNG plots a person would rather look at than read: class/source mix, shard balance,
confusion matrix, loss curve. Pure matplotlib (Agg) on plain data; logged by `log_plots`."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on training nodes
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from preprocessing.contract.manifest import Manifest


def literal_text(value: object) -> str:
    """A value of the data (a class, a source) as text matplotlib draws as it is: each `$`
    escaped, as two of them would start mathtext, which fails on most such text."""
    return str(value).replace("$", r"\$")


def split_histogram(manifest: Manifest, field: str, split: str = "train") -> dict[str, int]:
    """Rows per class (`class_counts`) or source (`source_counts`) of a split."""
    totals: dict[str, int] = {}
    for shard in manifest.split(split).shards:
        for key, count in getattr(shard, field).items():
            totals[key] = totals.get(key, 0) + count
    return totals


def mix_figure(manifest: Manifest) -> Figure:
    """Side-by-side bars of input rows vs training rows, per class and per source."""
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    pairs = [
        ("class", manifest.input_class_counts, split_histogram(manifest, "class_counts")),
        ("source", manifest.input_source_counts, split_histogram(manifest, "source_counts")),
    ]
    for axis, (name, before, after) in zip(axes, pairs, strict=True):
        keys = sorted(set(before) | set(after), key=lambda k: (len(k), k))
        x = np.arange(len(keys))
        axis.bar(x - 0.2, [before.get(k, 0) for k in keys], 0.4, label="input")
        axis.bar(x + 0.2, [after.get(k, 0) for k in keys], 0.4, label="after reshard")
        axis.set_xticks(
            x, [literal_text(key) for key in keys], rotation=45 if len(keys) > 10 else 0
        )
        axis.set_title(f"rows per {name}")
        axis.legend()
    figure.tight_layout()
    return figure


def shard_rows_figure(manifest: Manifest) -> Figure:
    """Rows per training shard: a flat line is the balance promise kept."""
    rows = [shard.num_rows for shard in manifest.split("train").shards]
    figure, axis = plt.subplots(figsize=(8, 3))
    axis.bar(range(len(rows)), rows)
    axis.set_xlabel("shard")
    axis.set_ylabel("rows")
    axis.set_title(f"rows per shard: {min(rows)}..{max(rows)}")
    figure.tight_layout()
    return figure


def confusion_figure(confusion: list[list[int]], classes: list[str]) -> Figure:
    """Row-normalised confusion matrix (rows: true class), counts in each cell."""
    matrix = np.asarray(confusion, dtype=np.float64)
    normalised = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    figure, axis = plt.subplots(figsize=(6, 5))
    image = axis.imshow(normalised, cmap="Blues", vmin=0, vmax=1)
    shown = [literal_text(name) for name in classes]
    axis.set_xticks(range(len(classes)), shown)
    axis.set_yticks(range(len(classes)), shown)
    axis.set_xlabel("predicted")
    axis.set_ylabel("true")
    for (row, column), count in np.ndenumerate(matrix):
        axis.text(column, row, str(int(count)), ha="center", va="center", fontsize=7)
    figure.colorbar(image)
    figure.tight_layout()
    return figure


def loss_figure(history: dict[str, list[tuple[int, float]]]) -> Figure:
    """One line per loss metric over steps."""
    figure, axis = plt.subplots(figsize=(7, 4))
    for name, points in history.items():
        if points:
            steps, values = zip(*sorted(points), strict=True)
            axis.plot(steps, values, label=name)
    axis.set_xlabel("step")
    axis.set_ylabel("loss")
    axis.legend()
    figure.tight_layout()
    return figure


def run_figures(
    manifest: Manifest, summary: dict[str, Any], loss_history: dict[str, list[tuple[int, float]]]
) -> dict[str, Figure]:
    """Every plot of a finished job, by artifact file name."""
    figures = {
        "class_source_mix.png": mix_figure(manifest),
        "shard_rows.png": shard_rows_figure(manifest),
        "loss_curve.png": loss_figure(loss_history),
    }
    if summary.get("confusion_matrix"):
        figures["confusion_matrix.png"] = confusion_figure(
            summary["confusion_matrix"], summary["classes"]
        )
    return figures
