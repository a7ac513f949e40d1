"""A real two-process DDP run on CPU (gloo) through torchrun, as a flow launches it."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from training.launch import TrainingFailed, launch_local, torchrun_command


def write_config(path: Path, **fields: object) -> Path:
    path.write_text(yaml.safe_dump(fields))
    return path


@pytest.mark.slow
def test_two_rank_ddp_run_gives_equal_batches_per_rank(
    make_dataset: Callable[..., str], tmp_path: Path
) -> None:
    """Both ranks train the same positive number of batches (DDP never waits on a missing
    one), validation covers every holdout row once, and macro F1 is a number in [0, 1]."""
    root = make_dataset(2000, holdout_rows=301, num_shards=4, row_group_size=128)
    config = write_config(
        tmp_path / "train.yaml",
        dataset=root,
        output_dir=str(tmp_path / "run"),
        max_epochs=2,
        process_group_timeout_s=120,
        loader={"batch_size": 64, "num_workers": 1},
    )
    summary = launch_local(config, nproc_per_node=2, timeout_s=300)
    assert summary["world_size"] == 2
    assert summary["batches_per_rank"] == [2 * (2000 // 128)] * 2
    assert sum(map(sum, summary["confusion_matrix"])) == 301
    assert 0.0 <= summary["val_macro_f1"] <= 1.0 and not math.isnan(summary["val_macro_f1"])


@pytest.mark.slow
def test_failed_launch_raises_with_the_output_tail(tmp_path: Path) -> None:
    """A job that cannot start fails with TrainingFailed carrying the ranks' own error."""
    config = write_config(
        tmp_path / "train.yaml", dataset=str(tmp_path / "nowhere"), output_dir=str(tmp_path)
    )
    with pytest.raises(TrainingFailed, match=r"no _MANIFEST\.json") as raised:
        launch_local(config, nproc_per_node=1, timeout_s=120)
    assert raised.value.returncode not in (0, None)


def test_torchrun_command_lines() -> None:
    """One node: standalone rendezvous; several: c10d at the given endpoint; never restarts."""
    one = torchrun_command("c.yaml", 2)
    assert "--standalone" in one and one[-4:] == ["-m", "training", "--config", "c.yaml"]
    many = torchrun_command("c.yaml", 4, nnodes=2, rdzv_endpoint="host:29400")
    assert many[many.index("--rdzv-endpoint") + 1] == "host:29400" and "--standalone" not in many
    assert all(c[c.index("--max-restarts") + 1] == "0" for c in (one, many))
    with pytest.raises(ValueError, match="rdzv_endpoint"):
        torchrun_command("c.yaml", 4, nnodes=2)
