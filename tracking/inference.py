"""Predictions of a registered model on pyarrow Tables, and its evaluation on a split.

Rows become model inputs through the dataset's feature codec
(preprocessing/features.py), the one the training loader uses, so a model sees the same
numbers here as in training. `predict_table` is the per-batch function a Dask map runs
(flows pass it to `preprocessing.mapping.map_to_version`); the model is loaded once per
process. `evaluate_model` scores a model on a dataset version's held-out split.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import mlflow
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from preprocessing.features import FeatureCodec, label_indices
from preprocessing.manifest import read_manifest, shard_uri
from tracking.metrics import confusion_matrix, macro_f1, per_class_recall

PREDICTION_COLUMNS = ("predicted", "probabilities")
CODEC_METADATA = "feature_codec"  # model metadata key of the codec's state, when logged


@lru_cache(maxsize=4)
def load_classifier(model_uri: str, tracking_uri: str) -> tuple[Any, list[str]]:
    """The pyfunc model and its class labels (model metadata), cached per process."""
    mlflow.set_tracking_uri(tracking_uri)
    model = mlflow.pyfunc.load_model(model_uri)
    return model, [str(label) for label in model.metadata.metadata["classes"]]


def model_codec(model: Any) -> FeatureCodec | None:
    """The feature codec logged with the model (metadata `feature_codec`), if any."""
    metadata = getattr(getattr(model, "metadata", None), "metadata", None) or {}
    state = metadata.get(CODEC_METADATA)
    return FeatureCodec.from_json(state) if state else None


def probabilities(model: Any, features: np.ndarray) -> np.ndarray:
    """Softmax of the model's logits, float32 [rows, classes]. A read-only matrix (the
    codec's zero-copy view of a vector column) is copied: torch refuses to trust one."""
    writable = features if features.flags.writeable else features.copy()
    logits = np.asarray(model.predict(writable), dtype=np.float64)
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (exp / exp.sum(axis=1, keepdims=True)).astype(np.float32)


def predict_table(table: pa.Table, model_uri: str, tracking_uri: str, id_column: str,
                  feature_column: str | None = None,
                  codec: list[dict[str, Any]] | None = None) -> pa.Table:
    """id, predicted class label and class probabilities for every row.

    The rows are encoded by `codec` (a dataset's `Manifest.features["columns"]`), else by
    the codec logged with the model, else by a plain codec of `feature_column` as the
    table holds it (nothing standardized: right only for datasets that standardize
    nothing, such as a fixed-size-list column).
    """
    model, classes = load_classifier(model_uri, tracking_uri)
    if codec is not None:
        chosen = FeatureCodec.from_json(codec)
    elif (logged := model_codec(model)) is not None:
        chosen = logged
    elif feature_column is not None:
        chosen = FeatureCodec.from_schema(table.schema, [feature_column])
    else:
        raise ValueError("predict_table needs the dataset's codec or a feature_column")
    return predictions(model, classes, table, chosen, id_column)


def predictions(model: Any, classes: list[str], table: pa.Table, codec: FeatureCodec,
                id_column: str) -> pa.Table:
    """The prediction table of `model` on `table`'s rows encoded by `codec`."""
    probs = probabilities(model, codec.encode(table))
    flat = pa.array(probs.reshape(-1), pa.float32())
    return pa.table({
        id_column: table.column(id_column),
        "predicted": pa.array(np.asarray(classes)[probs.argmax(axis=1)].tolist(), pa.string()),
        "probabilities": pa.FixedSizeListArray.from_arrays(flat, len(classes)),
    })


def split_features(dataset: str, split: str,
                   codec: FeatureCodec | None = None) -> Iterator[tuple[pa.Table, np.ndarray]]:
    """Each shard of a split with its encoded features (the version's own codec unless
    `codec` is given), shard after shard."""
    manifest, location = read_manifest(dataset)
    codec = codec or FeatureCodec.from_manifest(manifest)
    for entry in manifest.split(split).shards:
        table = pq.read_table(shard_uri(location, entry))
        yield table, codec.encode(table)


def evaluate_model(model_uri: str, tracking_uri: str, dataset: str,
                   split: str = "holdout") -> dict[str, Any]:
    """Macro-F1 and per-class recall of a model on a split of a dataset version."""
    model, classes = load_classifier(model_uri, tracking_uri)
    return {"model_uri": model_uri, **evaluate_classifier(model, classes, dataset, split)}


def evaluate_classifier(model: Any, classes: list[str], dataset: str,
                        split: str = "holdout") -> dict[str, Any]:
    """Macro-F1, balanced accuracy and per-class recall of `model` (class labels
    `classes`) on a split, its rows encoded by the model's codec or else the version's."""
    manifest, _ = read_manifest(dataset)
    positions = {label: i for i, label in enumerate(classes)}
    to_model = np.array([positions.get(str(value), -1) for value in manifest.classes])
    predicted, target = [], []
    for table, features in split_features(dataset, split, model_codec(model)):
        predicted.append(probabilities(model, features).argmax(axis=1))
        target.append(to_model[label_indices(table.column(manifest.label_column),
                                             manifest.classes)])
    truth = np.concatenate(target)
    if (truth < 0).any():
        missing = sorted({str(manifest.classes[i]) for i in np.flatnonzero(to_model < 0)})
        raise ValueError(f"classes {missing} of {dataset} are not among the model's {classes}")
    confusion = confusion_matrix(np.concatenate(predicted), truth, len(classes))
    recall = per_class_recall(confusion)
    return {"dataset_version": manifest.version_id,
            "num_rows": int(confusion.sum()), "macro_f1": float(macro_f1(confusion)),
            "balanced_accuracy": float(np.nanmean(recall)),
            "recall": {c: None if np.isnan(r) else float(r)
                       for c, r in zip(classes, recall, strict=True)}}
