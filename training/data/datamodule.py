"""The train and validation streams of one dataset version as a Lightning DataModule.

    data = StreamDataModule(dataset, LoaderConfig(batch_size=64), seed=0)
    model = FeatureClassifier(data.num_features, data.classes, {})
    Trainer(...).fit(model, datamodule=data, ckpt_path="last")

`train_dataloader()` returns the same `StreamLoader` every time, so the
position carries across epochs; the train stream moves itself to the next
epoch when one is exhausted. `val_dataloader()` returns a loader over the split
training selects on (`Manifest.selection_split`: the validation split, or the
holdout when the version has none), padded to whole global batches, that starts
every validation pass from its beginning (an empty list when the version has
neither).
`state_dict()` / `load_state_dict()` delegate to the train stream. Lightning
restores a DataModule before it asks the loaders for their lengths, so a run
resumed mid-epoch with more ranks than it was saved with still trains exactly
the rest of the epoch (training/data/loader.py on `len()`).
"""

from __future__ import annotations

from typing import Any

import lightning

from preprocessing.contract.manifest import read_manifest
from training.config import LoaderConfig
from training.data.loader import ShardStream, StreamLoader
from training.data.readahead import ReadConfig


class StreamDataModule(lightning.LightningDataModule):
    """Train and validation `StreamLoader`s over one dataset version (`chosen_on`: the
    split the validation pass reads, None without one)."""

    def __init__(
        self,
        dataset: str,
        loader: LoaderConfig,
        seed: int,
        read: ReadConfig | None = None,
    ) -> None:
        super().__init__()
        self.train_stream = ShardStream(dataset, "train", loader, seed, read)
        self.chosen_on = read_manifest(dataset)[0].selection_split()
        self.val_stream = validation_stream(dataset, self.chosen_on, loader, seed, read)
        self._train = StreamLoader(self.train_stream)
        self._val = StreamLoader(self.val_stream, rewind=True) if self.val_stream else None

    @property
    def num_features(self) -> int:
        return self.train_stream.num_features

    @property
    def classes(self) -> list[Any]:
        return self.train_stream.classes

    def train_dataloader(self) -> StreamLoader:
        return self._train

    def val_dataloader(self) -> StreamLoader | list[Any]:
        return self._val if self._val is not None else []

    def state_dict(self) -> dict[str, Any]:
        return {"train": self.train_stream.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.train_stream.load_state_dict(state_dict["train"])


def validation_stream(
    dataset: str, split: str | None, loader: LoaderConfig, seed: int, read: ReadConfig | None
) -> ShardStream | None:
    """`split` padded to whole batches and split equally, or None when it is None."""
    if split is None:
        return None
    # Validation is split equally whatever training does: its figures are exact sums.
    padded = loader.model_copy(
        update={"remainder": "pad", "balance": "equal", "balance_by": "samples"}
    )
    return ShardStream(dataset, split, padded, seed, read)
