"""Predictions of a registered model on pyarrow Tables, and its evaluation on a split.

A registered model is a `CodecClassifier` (tracking/run/pyfunc.py): rows become inputs
through the codec logged with it, the one its training loader used, so a model sees the
same numbers here as in training and behind `pyfunc.predict`. The feature columns are
the codec's (the manifest's), never a setting. `predict_table` is the per-batch function
a Dask map runs for batch inference (flows pass it to
`preprocessing.driver.map_files.map_to_version`); `shard_confusion` the per-shard function of an
evaluation, whose confusion matrices `evaluation` sums into scores. The model is loaded
once per process. Every score comes with the class-prior baseline (tracking/lifecycle/metrics.py)
and whether the model beats it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from functools import lru_cache, partial
from typing import Any

import mlflow
import numpy as np
import pyarrow as pa
from mlflow.tracking import MlflowClient

from preprocessing.contract.codec import label_indices
from preprocessing.contract.integrity import ShardRef, read_shard_table, split_shards
from preprocessing.contract.manifest import read_manifest, shard_uri
from preprocessing.toolbox.faults import PermanentError
from tracking.lifecycle.metrics import (
    class_prior_baseline,
    confusion_matrix,
    macro_f1,
    per_class_recall,
)
from tracking.lifecycle.trust import load_verified
from tracking.run.model import own_import_path
from tracking.run.pyfunc import CodecClassifier

# (task, shards) -> results; a shard is a ShardRef (Any: flows type theirs by URI).
Mapper = Callable[[Callable[[Any], np.ndarray], list[Any]], Iterable[np.ndarray]]


# Scoring a split this small takes about a second here, where the model is loaded anyway
# (for its classes); on Dask every worker first imports torch and loads the model: 12-16 s
# for each of the demo's two evaluations of 12 k rows (a shared 2-core machine).
IN_PROCESS_EVALUATION_ROWS = 200_000


class ModelError(PermanentError, ValueError):
    """A model that cannot score these rows: logged without its codec, or other classes."""


@lru_cache(maxsize=4)
def load_classifier(model_uri: str, tracking_uri: str) -> CodecClassifier:
    """The registered model's network, codec and classes, cached per process; a registry
    or logged-model URI is verified first (tracking/lifecycle/trust.py: its run, its
    source, its weights' sha256), `UntrustedModel` when it does not pass."""
    mlflow.set_tracking_uri(tracking_uri)
    with own_import_path():  # the model's `code/` never shadows ballast's own packages
        model = load_verified(MlflowClient(tracking_uri), model_uri).unwrap_python_model()
    if not isinstance(model, CodecClassifier):
        raise ModelError(
            f"model {model_uri} was not logged by ballast with its feature codec; train it again"
        )
    return model


def predict_table(table: pa.Table, model_uri: str, tracking_uri: str, id_column: str) -> pa.Table:
    """id, predicted class label and class probabilities for every row."""
    return predictions(load_classifier(model_uri, tracking_uri), table, id_column)


def predictions(model: CodecClassifier, table: pa.Table, id_column: str) -> pa.Table:
    """The prediction table of `model` on `table`'s rows."""
    if id_column not in table.column_names:
        raise ModelError(
            f"id column {id_column!r} is not among the rows' columns "
            f"{table.column_names} (batch_inference `id_column`; a version "
            "resharded without dataset.id_column has `__ballast_row_id`)"
        )
    probs = model.probabilities(table)
    flat = pa.array(probs.reshape(-1), pa.float32())
    return pa.table(
        {
            id_column: table.column(id_column),
            "predicted": pa.array(np.asarray(model.classes)[probs.argmax(axis=1)], pa.string()),
            "probabilities": pa.FixedSizeListArray.from_arrays(flat, len(model.classes)),
        }
    )


def table_confusion(
    model: CodecClassifier, table: pa.Table, label_column: str, dataset_classes: list[Any]
) -> np.ndarray:
    """The [model classes]^2 confusion matrix of `model` on `table`'s labelled rows."""
    positions = {label: i for i, label in enumerate(model.classes)}
    to_model = np.array([positions.get(str(value), -1) for value in dataset_classes])
    truth = to_model[label_indices(table.column(label_column), dataset_classes)]
    if (truth < 0).any():
        missing = sorted({str(dataset_classes[i]) for i in np.flatnonzero(to_model < 0)})
        raise ModelError(
            f"classes {missing} of the dataset are not among the model's {model.classes}"
        )
    predicted = model.probabilities(table).argmax(axis=1)
    return confusion_matrix(predicted, truth, len(model.classes))


def shard_confusion(
    shard: ShardRef,
    model_uri: str,
    tracking_uri: str,
    label_column: str,
    dataset_classes: list[Any],
) -> np.ndarray:
    """`table_confusion` of a registered model on one shard (a Dask task); the shard's size
    is checked against its manifest first and its page checksums on read."""
    model = load_classifier(model_uri, tracking_uri)
    return table_confusion(model, read_shard_table(shard), label_column, dataset_classes)


def split_uris(dataset: str, split: str) -> list[str]:
    """The shard URIs of a split of a version, read through its manifest."""
    manifest, location = read_manifest(dataset)
    return [shard_uri(location, entry) for entry in manifest.split(split).shards]


def on_cluster(dataset: str, split: str) -> bool:
    """Whether an evaluation of `split` is mapped over a cluster: the one place that
    chooses (more than `IN_PROCESS_EVALUATION_ROWS` rows)."""
    return read_manifest(dataset)[0].split(split).num_rows > IN_PROCESS_EVALUATION_ROWS


def evaluate(
    model_uri: str,
    tracking_uri: str,
    dataset: str,
    split: str,
    cluster_map: Callable[[], AbstractContextManager[Mapper]],
) -> dict[str, Any]:
    """Scores of a registered model on a split: the one evaluation of the pipeline, the
    promotion's champion on the same rows and `ballast evaluate`. A split `on_cluster`
    is scored one task per shard through the map `cluster_map()` opens (the flows' Dask);
    a smaller one here, shard after shard."""
    if not on_cluster(dataset, split):
        return evaluate_model(model_uri, tracking_uri, dataset, split)
    with cluster_map() as mapper:
        return evaluate_model(model_uri, tracking_uri, dataset, split, mapper)


def evaluate_model(
    model_uri: str, tracking_uri: str, dataset: str, split: str = "holdout", mapper: Mapper = map
) -> dict[str, Any]:
    """Scores of a registered model on a split, one `shard_confusion` per shard through
    `mapper` (the builtin `map` here; flows pass a Dask map)."""
    manifest, _ = read_manifest(dataset)
    classes = load_classifier(model_uri, tracking_uri).classes
    task = partial(
        shard_confusion,
        model_uri=model_uri,
        tracking_uri=tracking_uri,
        label_column=manifest.label_column,
        dataset_classes=manifest.classes,
    )
    return {"model_uri": model_uri, **split_evaluation(dataset, split, task, classes, mapper)}


def evaluate_classifier(
    model: CodecClassifier, dataset: str, split: str = "holdout"
) -> dict[str, Any]:
    """Scores of an in-process model on a split, shard after shard."""
    manifest, _ = read_manifest(dataset)
    task = partial(
        _table_confusion_of_shard,
        model,
        label_column=manifest.label_column,
        dataset_classes=manifest.classes,
    )
    return split_evaluation(dataset, split, task, model.classes)


def _table_confusion_of_shard(
    model: CodecClassifier, shard: ShardRef, label_column: str, dataset_classes: list[Any]
) -> np.ndarray:
    return table_confusion(model, read_shard_table(shard), label_column, dataset_classes)


def split_evaluation(
    dataset: str,
    split: str,
    confusion_of: Callable[[Any], np.ndarray],
    classes: list[str],
    mapper: Mapper = map,
) -> dict[str, Any]:
    """The scores of one split: `confusion_of` each shard through `mapper`, summed."""
    manifest, _ = read_manifest(dataset)
    confusions = list(mapper(confusion_of, split_shards(dataset, split)))
    total = sum(confusions, np.zeros((len(classes),) * 2, np.int64))
    return {"dataset_version": manifest.version_id, **evaluation(total, classes)}


def evaluation(confusion: np.ndarray, classes: list[str]) -> dict[str, Any]:
    """Macro-F1, balanced accuracy and per-class recall of a confusion matrix, with the
    class-prior baseline's figures and whether the model beats both."""
    recall = per_class_recall(confusion)
    scores = {
        "macro_f1": float(macro_f1(confusion)),
        "balanced_accuracy": float(np.nanmean(recall)) if confusion.sum() else 0.0,
    }
    baseline = class_prior_baseline(confusion.sum(axis=1))
    return {
        "num_rows": int(confusion.sum()),
        **scores,
        "recall": {
            c: None if np.isnan(r) else float(r) for c, r in zip(classes, recall, strict=True)
        },
        "class_prior_baseline": baseline,
        "beats_class_prior": all(scores[name] > baseline[name] for name in scores),
    }
