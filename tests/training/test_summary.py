"""training/summary.py: light at import, and the memory figures of a run add up."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from training.config import LoaderConfig, TrainConfig
from training.train import run_training


@pytest.mark.slow
def test_summary_module_imports_neither_torch_nor_lightning() -> None:
    """A flow reads summary.json through training.summary without loading torch."""
    code = (
        "import sys, training.summary; "
        "print([m for m in ('torch', 'lightning') if m in sys.modules])"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"


def test_memory_figures_count_the_classifier_and_its_adam_moments(
    dataset_cache: Callable[..., str], tmp_path: Path
) -> None:
    """One process: parameter bytes are the MLP's float32 weights; AdamW keeps two moments
    of each (its 0-dim step counters are not state bytes); peak memory is above both."""
    cfg = TrainConfig(
        dataset=dataset_cache(64),
        output_dir=str(tmp_path / "run"),
        max_epochs=1,
        loader=LoaderConfig(batch_size=32),
    )
    summary = run_training(cfg)
    num_params = (16 * 64 + 64) + (64 * 64 + 64) + (64 * 10 + 10)  # features 16, classes 10
    assert summary["param_bytes_per_rank"] == [4 * num_params]
    assert summary["optimizer_state_bytes_per_rank"] == [2 * 4 * num_params]
    assert summary["peak_memory_bytes_per_rank"][0] > 3 * 4 * num_params
