"""Predictions of a registered model on pyarrow Tables, and its evaluation on a split.

`predict_table` is the per-batch function a Dask map runs (flows pass it to
`preprocessing.mapping.map_to_version`); the model is loaded once per process.
`evaluate_model` scores a model on a dataset version's held-out split.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import mlflow
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from preprocessing.manifest import read_manifest, shard_uri
from tracking.metrics import confusion_matrix, macro_f1, per_class_recall

PREDICTION_COLUMNS = ("predicted", "probabilities")


@lru_cache(maxsize=4)
def load_classifier(model_uri: str, tracking_uri: str) -> tuple[Any, list[str]]:
    """The pyfunc model and its class labels (model metadata), cached per process."""
    mlflow.set_tracking_uri(tracking_uri)
    model = mlflow.pyfunc.load_model(model_uri)
    return model, [str(label) for label in model.metadata.metadata["classes"]]


def feature_matrix(table: pa.Table, feature_column: str) -> np.ndarray:
    """A float32 [rows, width] matrix from a fixed-size-list column."""
    column = table.column(feature_column).combine_chunks()
    width = column.type.list_size
    return column.values.to_numpy(zero_copy_only=False).reshape(-1, width).astype(np.float32)


def probabilities(model: Any, features: np.ndarray) -> np.ndarray:
    """Softmax of the model's logits, float32 [rows, classes]."""
    logits = np.asarray(model.predict(features), dtype=np.float64)
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return (exp / exp.sum(axis=1, keepdims=True)).astype(np.float32)


def predict_table(table: pa.Table, model_uri: str, tracking_uri: str, id_column: str,
                  feature_column: str) -> pa.Table:
    """id, predicted class label and class probabilities for every row."""
    model, classes = load_classifier(model_uri, tracking_uri)
    probs = probabilities(model, feature_matrix(table, feature_column))
    flat = pa.array(probs.reshape(-1), pa.float32())
    return pa.table({
        id_column: table.column(id_column),
        "predicted": pa.array(np.asarray(classes)[probs.argmax(axis=1)].tolist(), pa.string()),
        "probabilities": pa.FixedSizeListArray.from_arrays(flat, len(classes)),
    })


def evaluate_model(model_uri: str, tracking_uri: str, dataset: str,
                   split: str = "holdout") -> dict[str, Any]:
    """Macro-F1 and per-class recall of a model on a split of a dataset version."""
    manifest, location = read_manifest(dataset)
    model, classes = load_classifier(model_uri, tracking_uri)
    index = {label: i for i, label in enumerate(classes)}
    predicted, target = [], []
    for entry in manifest.split(split).shards:
        table = pq.read_table(shard_uri(location, entry))
        probs = probabilities(model, feature_matrix(table, manifest.feature_columns[0]))
        predicted.append(probs.argmax(axis=1))
        labels = table.column(manifest.label_column).to_pylist()
        target.append(np.array([index[str(label)] for label in labels]))
    confusion = confusion_matrix(np.concatenate(predicted), np.concatenate(target),
                                 len(classes))
    recall = per_class_recall(confusion)
    return {"model_uri": model_uri, "dataset_version": manifest.version_id,
            "num_rows": int(confusion.sum()), "macro_f1": float(macro_f1(confusion)),
            "balanced_accuracy": float(np.nanmean(recall)),
            "recall": {c: None if np.isnan(r) else float(r)
                       for c, r in zip(classes, recall, strict=True)}}
