"""Helpers for the tests that follow rows from raw files through the codec: reshard a
directory, read a split back through the training loader, a torch network trained on
it, and that network behind its version's codec as the registered model wraps it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from distributed import Client

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.codec import FeatureCodec
from preprocessing.contract.manifest import read_manifest
from preprocessing.driver.reshard import ReshardResult, run_reshard
from tracking.run.pyfunc import CodecClassifier
from training.config import LoaderConfig
from training.data.loader import ShardStream
from training.models.classifier import build_mlp, weighted_cross_entropy


def reshard(
    raw: Path, out: Path, client: Client, dataset: dict[str, Any], **config: Any
) -> ReshardResult:
    """One reshard of the files under `raw` (source: the input root)."""
    spec = DatasetSpec.model_validate(
        {"inputs": [str(raw)], "source_column": None, "id_column": "id", **dataset}
    )
    settings = {
        "holdout_fraction": 0.25,
        "target_shard_rows": 300,
        "rows_per_row_group": 64,
        **config,
    }
    return run_reshard(ReshardConfig(dataset=spec, output_root=str(out), **settings), client)


def loader_rows(dataset: str, split: str) -> dict[int, tuple[np.ndarray, int]]:
    """Every real row of a split as the training loader yields it: id -> (features,
    class index)."""
    stream = ShardStream(dataset, split, LoaderConfig(batch_size=16, remainder="pad"), seed=0)
    found: dict[int, tuple[np.ndarray, int]] = {}
    for batch in stream.iterate(rank_world=(0, 1)):
        real = batch["weight"].numpy() > 0
        for row_id, features, label in zip(
            batch["id"].numpy()[real],
            batch["features"].numpy()[real],
            batch["label"].numpy()[real],
            strict=True,
        ):
            found[int(row_id)] = (features.copy(), int(label))
    return found


def codec_classifier(network: torch.nn.Module, dataset: str) -> CodecClassifier:
    """`network` behind the codec and classes of `dataset`: the registered model's
    Python object, without a tracking server."""
    manifest, _ = read_manifest(dataset)
    return CodecClassifier(
        network.eval(),
        FeatureCodec.from_manifest(manifest),
        [str(label) for label in manifest.classes],
        list(manifest.classes),
    )


def train_mlp(dataset: str, epochs: int, seed: int = 0) -> torch.nn.Module:
    """The built-in MLP trained with Adam on the train split, batches from the loader
    (one torch thread: on a shared 2-core machine more threads made a step 50x slower)."""
    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    stream = ShardStream(dataset, "train", LoaderConfig(batch_size=32), seed=seed)
    network = build_mlp(stream.num_features, len(stream.classes), [32])
    optimizer = torch.optim.Adam(network.parameters(), lr=0.01)
    try:
        for _ in range(epochs):
            for batch in stream.iterate(rank_world=(0, 1)):
                loss = weighted_cross_entropy(
                    network(batch["features"]), batch["label"], batch["weight"]
                )
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    finally:
        torch.set_num_threads(threads)
    return network


def prior_macro_f1(labels: list[Any]) -> float:
    """Macro-F1 of always predicting the most frequent class (the class-prior baseline)."""
    values, counts = np.unique(np.asarray(labels, dtype=str), return_counts=True)
    precision = counts.max() / counts.sum()
    return float(2 * precision / (precision + 1) / len(values))
