"""The registered model: a torch network behind the dataset's feature codec, as MLflow pyfunc.

`mlflow.pyfunc.load_model("models:/<name>@champion").predict(df)` takes a pandas
DataFrame of the dataset's original feature columns (nulls, strings, dates and lists as
they came) and returns one row per input row: `predicted` (the class label) and
`probabilities` (one float per class, in the order of the model metadata's `classes`).
The codec (preprocessing/contract/codec.py: vocabularies, fill values, scaling, column order)
is an artifact of the model (`codec.json`), so rows are encoded exactly as the training
loader encoded them. Torch is imported only when the model is loaded.

The signature names each input column with its MLflow type. An integer column whose
null policy fills nulls is declared `double`: pandas holds an integer column with
missing values as floats, and MLflow refuses to turn those into integers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
from mlflow.models import ModelSignature
from mlflow.pyfunc import PythonModel
from mlflow.types.schema import Array, ColSpec, Schema

from preprocessing.contract.codec import FILL_POLICIES, ColumnSpec, FeatureCodec, FeatureError

CODEC_ARTIFACT = "codec"
NETWORK_ARTIFACT = "network"
PREDICTION_COLUMNS = ("predicted", "probabilities")


class CodecClassifier(PythonModel):
    """Class probabilities of a torch network on rows encoded by a feature codec."""

    def __init__(self, network: Any = None, codec: FeatureCodec | None = None,
                 classes: list[str] | None = None) -> None:
        self.network, self.codec, self.classes = network, codec, classes or []

    def load_context(self, context: Any) -> None:
        import torch

        state = json.loads(Path(context.artifacts[CODEC_ARTIFACT]).read_text())
        self.codec = FeatureCodec.from_json(state["columns"])
        self.classes = [str(label) for label in state["classes"]]
        self.network = torch.load(context.artifacts[NETWORK_ARTIFACT],
                                  weights_only=False).eval()

    def probabilities(self, table: pa.Table) -> np.ndarray:
        """Softmax of the network's logits on `table`'s rows, float32 [rows, classes]."""
        assert self.codec is not None, "the model's codec is not loaded"
        return self.probabilities_of(self.codec.encode(table))

    def probabilities_of(self, features: np.ndarray) -> np.ndarray:
        """Softmax of the logits on an encoded matrix. A read-only matrix (the codec's
        zero-copy view of a vector column) is copied: torch refuses to trust one."""
        import torch

        writable = features if features.flags.writeable else features.copy()
        with torch.no_grad():
            logits = self.network(torch.from_numpy(writable)).double()
        return torch.softmax(logits, dim=1).float().numpy()

    def predict(self, context: Any, model_input: pd.DataFrame,
                params: Any = None) -> pd.DataFrame:
        """`predicted` label and `probabilities` for each row of a DataFrame of raw rows.
        (A DataFrame hint is one MLflow infers no schema from: the logged signature is
        what inputs are checked against. Without a hint MLflow warns at every log and
        load.)"""
        assert self.codec is not None, "the model's codec is not loaded"
        table = dataset_types(pa.Table.from_pandas(pd.DataFrame(model_input)[self.codec.names],
                                                   preserve_index=False), self.codec)
        probs = self.probabilities(table)
        return pd.DataFrame({"predicted": np.asarray(self.classes)[probs.argmax(axis=1)],
                             "probabilities": list(probs)})


def dataset_types(table: pa.Table, codec: FeatureCodec) -> pa.Table:
    """Scalar and string columns cast to the dataset's Arrow types (pandas turns an
    integer column with nulls into floats, a date into a timestamp), and a column of
    nulls only (pandas gives it Arrow's null type) to a type its kind encodes."""
    for index, spec in enumerate(codec.columns):
        target = _arrow_type(spec)
        if pa.types.is_null(table.column(index).type):
            target = target or _list_type(spec)
        if target is None or table.column(index).type == target:
            continue
        try:
            table = table.set_column(index, spec.name, table.column(index).cast(target))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
            raise FeatureError(f"feature column {spec.name!r} of type "
                               f"{table.column(index).type} cannot be read as the "
                               f"dataset's {spec.arrow_type}: {error}") from error
    return table


def _arrow_type(spec: ColumnSpec) -> pa.DataType | None:
    if spec.kind == "category":
        return pa.string()
    try:
        return pa.type_for_alias(spec.arrow_type)
    except (ValueError, KeyError):
        return None  # lists and dictionary types are encoded as they come


def _list_type(spec: ColumnSpec) -> pa.DataType:
    """A list type for a vector or sequence column the rows give no type for."""
    if spec.kind == "vector" and spec.size:
        return pa.list_(pa.float32(), spec.size)
    return pa.list_(pa.float32())


def signature(codec: FeatureCodec) -> ModelSignature:
    """Input: the feature columns with their MLflow types; output: label and probabilities."""
    inputs = Schema([ColSpec(mlflow_type(spec), spec.name) for spec in codec.columns])
    outputs = Schema([ColSpec("string", "predicted"),
                      ColSpec(Array("float"), "probabilities")])
    return ModelSignature(inputs=inputs, outputs=outputs)


def mlflow_type(spec: ColumnSpec) -> Any:
    """The MLflow type of a feature column's values in a pandas DataFrame."""
    if spec.kind == "category" or spec.arrow_type in ("string", "large_string"):
        return "string"  # a category, or dates as ISO 8601 strings (dataset.date_columns)
    if spec.kind == "boolean":
        return "boolean"
    if spec.kind == "temporal":
        return "datetime" if spec.arrow_type.startswith(("timestamp", "date")) else "long"
    if spec.kind in ("vector", "sequence"):
        return Array("double" if "float" in spec.arrow_type or "double" in spec.arrow_type
                     else "long")
    integer = spec.arrow_type.startswith(("int", "uint"))
    return "long" if integer and spec.nulls not in FILL_POLICIES else "double"
