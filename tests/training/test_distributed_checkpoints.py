"""Checkpoints on S3 (moto's server): a single file for a plain run, a distributed checkpoint
directory for FSDP2; both resume with `resume: true`. One process, so these run in-process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import fsspec
import pytest
import torch.distributed as dist

from training.config import TrainConfig
from training.train import run_training


@pytest.fixture
def bucket(s3_endpoint: str) -> Iterator[str]:
    """A fresh bucket; the process group a 1-rank FSDP2 run leaves is destroyed after."""
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    name = f"ckpt-{abs(hash(s3_endpoint)) % 10**6}"
    if not fs.exists(name):
        fs.mkdir(name)
    yield f"s3://{name}"
    if dist.is_initialized():
        dist.destroy_process_group()


def config(dataset: str, output_dir: Path, checkpoint_dir: str, **fields: object) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "dataset": dataset,
            "output_dir": str(output_dir),
            "checkpoint_dir": checkpoint_dir,
            "max_epochs": 1,
            "loader": {"batch_size": 32},
            "model": {"hidden_sizes": [16]},
            **fields,
        }
    )


def listing(uri: str) -> set[str]:
    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    return {path.rsplit("/", 1)[-1] for path in fs.find(uri.removeprefix("s3://"))}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["auto", "fsdp"])
def test_checkpoint_on_s3_resumes_the_run(
    strategy: str, bucket: str, dataset_cache: Callable[..., str], tmp_path: Path
) -> None:
    """One epoch writes last.ckpt to S3 (one object for a plain run, a DCP directory with
    every rank's shards and meta.pt for FSDP2); a second run with `resume` starts from that
    S3 URI and ends at two epochs' steps, the loader continuing at the second epoch."""
    root = dataset_cache(640, holdout_rows=64, row_group_size=64)
    checkpoints = f"{bucket}/{strategy}/checkpoints"
    extra = {"precision": "bf16-mixed"} if strategy == "auto" else {}
    first = run_training(config(root, tmp_path / "a", checkpoints, strategy=strategy, **extra))
    assert first["global_step"] == 640 // 32 and first["resumed_from"] is None
    files = listing(f"{checkpoints}/last.ckpt")
    expected = {"last.ckpt"} if strategy == "auto" else {".metadata", "__0_0.distcp", "meta.pt"}
    assert files == expected
    resumed = run_training(
        config(
            root, tmp_path / "b", checkpoints, strategy=strategy, max_epochs=2, resume=True, **extra
        )
    )
    assert resumed["resumed_from"] == f"{checkpoints}/last.ckpt"
    assert resumed["global_step"] == 2 * 640 // 32 and resumed["epochs"] == 2
    assert resumed["batches_per_rank"] == [640 // 32]  # only the second epoch ran


SAVE_AFTER_IO_REINIT = """
import sys
sys.modules.pop("_io")
import _io  # noqa: F401  -- `_io`'s state made anew: its UnsupportedOperation is another class
import torch
from training.distributed.checkpoints import save_sharded
save_sharded({"state_dict": {"w": torch.ones(3)}}, sys.argv[1], True, lambda: None)
"""


@pytest.mark.slow
def test_sharded_save_to_s3_never_asks_a_remote_stream_for_fileno(bucket: str) -> None:
    """The cause of a flaky FSDP-to-S3 save: torch fsyncs each file through `fileno()`, which
    an s3fs stream refuses with an UnsupportedOperation that torch fails to catch once `_io`'s
    module state was made anew in the process. Saving to S3 must not depend on that state."""
    import subprocess
    import sys

    uri = f"{bucket}/io-reinit/last.ckpt"
    done = subprocess.run(
        [sys.executable, "-c", SAVE_AFTER_IO_REINIT, uri],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert listing(uri) == {".metadata", "__0_0.distcp", "meta.pt"}
