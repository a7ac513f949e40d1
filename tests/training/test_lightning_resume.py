"""Streams under a real Lightning Trainer (one process): mid-epoch checkpoints resume
exactly, also on more ranks; the DataModule validates on every holdout sample."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lightning
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from training.callbacks import DataWaitCallback
from training.config import LoaderConfig
from training.data.datamodule import StreamDataModule
from training.data.loader import ShardStream, StreamLoader
from training.models.classifier import FeatureClassifier

BATCH_SIZE, EVERY_N_STEPS = 10, 7


class StepIds(lightning.Callback):
    """Sample ids of every finished training step, with the global step after it."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, list[int]]] = []

    def on_train_batch_end(
        self, trainer: lightning.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.steps.append((trainer.global_step, batch["id"].tolist()))


@pytest.fixture(autouse=True)
def quiet_lightning() -> Iterator[None]:
    with warnings.catch_warnings():
        for message in (
            "__len__",
            "num_workers",
            "does not have many",
            "dirpath has changed",
            "Total length of `list`",
            "no `val_dataloader`",
        ):
            warnings.filterwarnings("ignore", message=f".*{message}")
        yield


def fit(
    source: StreamDataModule | StreamLoader,
    out: Path,
    ckpt: str | None = None,
    max_epochs: int = 1,
    extra: list[lightning.Callback] | None = None,
) -> tuple[lightning.Trainer, StepIds, FeatureClassifier]:
    """Fit the classifier on a DataModule or a bare loader; step checkpoints go to `out`."""
    stream = source.train_stream if isinstance(source, StreamDataModule) else source.stream
    model = FeatureClassifier(stream.num_features, stream.classes, {"hidden_sizes": [8]})
    ids = StepIds()
    every = ModelCheckpoint(dirpath=out, every_n_train_steps=EVERY_N_STEPS, save_top_k=-1)
    trainer = lightning.Trainer(
        max_epochs=max_epochs,
        callbacks=[every, ids, *(extra or [])],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
    )
    if isinstance(source, StreamDataModule):
        trainer.fit(model, datamodule=source, ckpt_path=ckpt)
    else:
        trainer.fit(model, source, ckpt_path=ckpt)
    return trainer, ids, model


def stream_state(samples_consumed: int, rank_batches: int) -> dict[str, int]:
    """The train stream's state in epoch 0 (default partitions and window)."""
    return {
        "epoch": 0,
        "samples_consumed": samples_consumed,
        "rank_batches": rank_batches,
        "batch_size": BATCH_SIZE,
        "num_partitions": 16,
        "shuffle_window_row_groups": 4,
    }


def flat(steps: list[tuple[int, list[int]]], up_to: int | None = None) -> list[int]:
    return [i for step, ids in steps if up_to is None or step <= up_to for i in ids]


@pytest.mark.parametrize("via", ["datamodule", "loader"])
def test_mid_epoch_checkpoint_resumes_exactly(
    dataset_cache: Callable[..., str], tmp_path: Path, via: str
) -> None:
    """Every step checkpoint holds the position of the batches trained so far (Lightning
    fetches no batch ahead of a loader with a length); resuming from one trains exactly the
    rest of the epoch: ids before it plus ids after it are the uninterrupted epoch's."""
    root = dataset_cache(400, num_shards=3, row_group_size=16)

    def source() -> StreamDataModule | StreamLoader:
        config = LoaderConfig(batch_size=BATCH_SIZE)
        if via == "datamodule":
            return StreamDataModule(root, config, seed=1)
        return StreamLoader(ShardStream(root, "train", config, seed=1))

    _, full, _ = fit(source(), tmp_path / "full")
    for path in (tmp_path / "full").glob("*.ckpt"):
        checkpoint = torch.load(path, weights_only=False)
        step = checkpoint["global_step"]
        position = checkpoint["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
        assert position == stream_state(step * BATCH_SIZE, step)
    middle = tmp_path / "full" / f"epoch=0-step={2 * EVERY_N_STEPS}.ckpt"
    _, resumed, _ = fit(source(), tmp_path / "resumed", ckpt=str(middle))
    assert flat(full.steps, 2 * EVERY_N_STEPS) + flat(resumed.steps) == flat(full.steps)


def test_mid_epoch_resume_on_more_ranks_trains_exactly_the_rest(
    dataset_cache: Callable[..., str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint of a 1-rank run, resumed through the DataModule as rank 0 and rank 1 of
    2 (each simulated by RANK/WORLD_SIZE in its own Trainer), continues the global stream:
    the ranks' steps interleaved follow the saved position with no sample lost or repeated,
    although Lightning counts the resumed epoch from the 1-rank batch count."""
    root = dataset_cache(400, num_shards=3, row_group_size=16)
    config = LoaderConfig(batch_size=BATCH_SIZE)
    _, full, _ = fit(StreamDataModule(root, config, seed=1), tmp_path / "full")
    middle = tmp_path / "full" / f"epoch=0-step={2 * EVERY_N_STEPS}.ckpt"
    per_rank = []
    for rank in range(2):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        _, ids, _ = fit(StreamDataModule(root, config, seed=1), tmp_path / f"r{rank}", str(middle))
        per_rank.append([batch for _, batch in ids.steps])
    assert len(per_rank[0]) == len(per_rank[1]) == (400 - 2 * EVERY_N_STEPS * 10) // 20
    interleaved = [i for pair in zip(*per_rank, strict=True) for batch in pair for i in batch]
    assert flat(full.steps, 2 * EVERY_N_STEPS) + interleaved == flat(full.steps)


@pytest.mark.parametrize("validation_rows", [0, 41])
def test_datamodule_validates_every_holdout_sample_each_epoch(
    dataset_cache: Callable[..., str], tmp_path: Path, validation_rows: int
) -> None:
    """After the sanity check's partial pass and two epochs, the last validation's confusion
    matrix counts every row of the split training selects on exactly once: the validation
    split where the version has one (the holdout left unread), else the holdout; the
    DataModule's checkpointed state is the train stream's position; the data-wait metrics
    reach the logged metrics."""
    options = {"holdout_rows": 73, "row_group_size": 16, "validation_rows": validation_rows}
    root = dataset_cache(200, **options)
    data = StreamDataModule(root, LoaderConfig(batch_size=BATCH_SIZE), seed=1)
    assert data.chosen_on == ("validation" if validation_rows else "holdout")
    trainer, _, model = fit(data, tmp_path / "run", max_epochs=2, extra=[DataWaitCallback()])
    assert model.last_confusion is not None
    assert model.last_confusion.sum() == (validation_rows or 73)
    assert data.state_dict() == {"train": data.train_stream.state_dict()}
    for path in (tmp_path / "run").glob("*.ckpt"):
        saved = torch.load(path, weights_only=False)
        loader_state = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
        assert saved["StreamDataModule"] == {"train": loader_state}
    logged = trainer.callback_metrics
    assert 0.0 < float(logged["loader/data_wait_fraction"]) <= 1.0
    assert float(logged["loader/samples_per_s"]) > 0


def test_datamodule_without_holdout_has_no_validation(
    dataset_cache: Callable[..., str],
) -> None:
    """A version with no holdout rows gives an empty validation list, which Lightning skips."""
    data = StreamDataModule(dataset_cache(100), LoaderConfig(batch_size=BATCH_SIZE), seed=1)
    assert data.val_stream is None and data.val_dataloader() == []
    assert (data.num_features, len(data.classes)) == (16, 10)
