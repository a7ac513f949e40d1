"""Artifacts of a finished job: plots, the summary, and its checkpoints (files or FSDP2
directories, which Lightning's MLflow logger skips silently: docs/architecture.md M4)."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt
from fsspec.core import url_to_fs
from mlflow.tracking import MlflowClient

from preprocessing.contract.manifest import Manifest
from tracking.run.plots import run_figures

LOSS_METRICS = ("train_loss_step", "train_loss")


def loss_history(client: MlflowClient, run_id: str) -> dict[str, list[tuple[int, float]]]:
    """(step, value) of every logged loss metric."""
    return {
        name: [(m.step, m.value) for m in client.get_metric_history(run_id, name)]
        for name in LOSS_METRICS
    }


def log_plots(
    client: MlflowClient, run_id: str, manifest: Manifest, summary: dict[str, Any]
) -> list[str]:
    """Render and log every plot under `plots/`; returns the artifact paths."""
    paths = []
    for name, figure in run_figures(manifest, summary, loss_history(client, run_id)).items():
        client.log_figure(run_id, figure, f"plots/{name}")
        plt.close(figure)
        paths.append(f"plots/{name}")
    return paths


def log_checkpoints(client: MlflowClient, run_id: str, checkpoint_dir: str) -> None:
    """Reference the checkpoint location in a tag; upload local ones (files or directories)."""
    client.set_tag(run_id, "ballast.checkpoints", checkpoint_dir)
    fs, path = url_to_fs(checkpoint_dir)
    if "file" in fs.protocol and fs.exists(path):
        client.log_artifacts(run_id, path, "checkpoints")
