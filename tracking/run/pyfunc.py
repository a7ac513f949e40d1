"""The registered model: a torch network behind the dataset's feature codec, as MLflow pyfunc.

`mlflow.pyfunc.load_model("models:/<name>@champion").predict(df)` takes a pandas
DataFrame of the dataset's original feature columns (nulls, strings, dates and lists as
they came) and returns one value per input row, a Series `predicted`: the class label in
the label's own type (an int64 label stays int64, a string a string), what
`mlflow.models.evaluate(..., model_type="classifier")` reads as the predictions (it
refuses a DataFrame of two columns, and of one). With the param `details=True`
(`predict(df, params={"details": True})`, or `"params": {"details": true}` in a serving
request) a DataFrame, `predicted` followed by two columns:
`probabilities` (one float per class, in the order of the model metadata's `classes`)
and `filled` (the feature columns whose null was filled in that row). MLflow's evaluator
asks only scikit-learn, XGBoost and CatBoost models for probabilities (`predict_proba`),
so the probabilities of a pyfunc reach a user through that param.

A null in any feature column is predicted: a column with a fill policy follows it; any
other column (no nulls at training time) is filled as `fill_mean` fills (the scan's mean,
which a standardized column holds as its shift; 0 for a number column saved without
standardizing; slot 0 for a string; no elements for a list). A row that cannot be
encoded (a wrong type, a list of the wrong length) fails the call with an
`MlflowException` (INVALID_PARAMETER_VALUE: HTTP 400 from `mlflow models serve`) whose
message names the row, the column, the problem and what the dataset holds: MLflow's
serving contract gives one output per input row, so a row cannot be left out alone.

This module is shipped inside every logged model (MLflow `code_paths`, see
tracking/run/model.py) with the codec modules it imports, preprocessing/contract/codec.py
and column_spec.py: it imports only mlflow, numpy, pandas, pyarrow and, when a model
loads, torch, the packages of the model's requirements. The network's weights are a state
dict loaded with `torch.load(weights_only=True)` together with the layer sizes that
rebuild it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from mlflow.exceptions import MlflowException
from mlflow.models import ModelSignature
from mlflow.pyfunc import PythonModel
from mlflow.types.schema import AnyType, Array, ColSpec, ParamSchema, ParamSpec, Schema

from preprocessing.contract.codec import FeatureCodec
from preprocessing.contract.column_spec import FILL_POLICIES, ColumnSpec, FeatureError

CODEC_ARTIFACT = "codec"
WEIGHTS_ARTIFACT = "weights"
NETWORK_ARTIFACT = "network"  # a whole pickled network: models logged before weights
DETAILS_PARAM = "details"


class CodecClassifier(PythonModel):
    """Class probabilities of a torch network on rows encoded by a feature codec.
    `classes` are the labels as text (metrics, batch inference); `labels` the same
    labels in their own type (what `predict` returns)."""

    def __init__(
        self,
        network: Any = None,
        codec: FeatureCodec | None = None,
        classes: list[str] | None = None,
        labels: list[Any] | None = None,
    ) -> None:
        self.network, self.codec, self.classes = network, codec, classes or []
        self.labels = list(self.classes) if labels is None else labels

    def load_context(self, context: Any) -> None:
        import torch

        state = json.loads(Path(context.artifacts[CODEC_ARTIFACT]).read_text())
        self.codec = FeatureCodec.from_json(state["columns"])
        self.classes = [str(label) for label in state["classes"]]
        self.labels = state.get("labels", self.classes)
        if WEIGHTS_ARTIFACT in context.artifacts:
            weights = torch.load(context.artifacts[WEIGHTS_ARTIFACT], weights_only=True)
            self.network = network_from_weights(weights)
        else:
            self.network = torch.load(
                context.artifacts[NETWORK_ARTIFACT], weights_only=False
            ).eval()

    def probabilities(self, table: pa.Table) -> np.ndarray:
        """Softmax of the network's logits on `table`'s rows, float32 [rows, classes];
        nulls follow the dataset's policies strictly (batch inference on a version)."""
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

    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> pd.Series | pd.DataFrame:
        """The `predicted` label of each row of a DataFrame of raw rows, a Series (what
        MLflow's classifier evaluator reads); with `details`, a DataFrame that adds
        `probabilities` and `filled`."""
        assert self.codec is not None, "the model's codec is not loaded"
        table, features = encode_rows(serving_codec(self.codec), pd.DataFrame(model_input))
        probs = self.probabilities_of(features)
        predicted = pd.Series([self.labels[i] for i in probs.argmax(axis=1)], name="predicted")
        if not (params or {}).get(DETAILS_PARAM):
            return predicted
        return pd.DataFrame(
            {
                "predicted": predicted,
                "probabilities": list(probs),
                "filled": filled_columns(self.codec, table),
            }
        )


def serving_codec(codec: FeatureCodec) -> FeatureCodec:
    """`codec` with every column that has no fill policy filling nulls as `fill_mean`."""
    return FeatureCodec(
        tuple(
            spec
            if spec.nulls in FILL_POLICIES
            else replace(spec, nulls="fill_mean", fill=spec.shift)
            for spec in codec.columns
        )
    )


def encode_rows(codec: FeatureCodec, frame: pd.DataFrame) -> tuple[pa.Table, np.ndarray]:
    """The rows as a table of the dataset's types, and encoded. A row that cannot be
    encoded is an MlflowException naming the first such row and its cause (looked for
    row by row, on the failure path only)."""
    try:
        table = rows_table(codec, frame)
        return table, codec.encode(table)
    except FeatureError as error:
        for index in range(len(frame)):
            try:
                codec.encode(rows_table(codec, frame.iloc[index : index + 1]))
            except FeatureError as row_error:
                raise MlflowException.invalid_parameter_value(
                    f"row {index} cannot be encoded: {row_error}"
                ) from error
        raise MlflowException.invalid_parameter_value(str(error)) from error


def rows_table(codec: FeatureCodec, frame: pd.DataFrame) -> pa.Table:
    """The feature columns of `frame` as Arrow columns of the dataset's types."""
    missing = [name for name in codec.names if name not in frame.columns]
    if missing:
        raise FeatureError(
            f"feature columns {missing} are missing from the rows (columns: {list(frame.columns)})"
        )
    arrays = []
    for spec in codec.columns:
        try:
            arrays.append(pa.array(frame[spec.name], from_pandas=True))
        except (pa.ArrowInvalid, pa.ArrowTypeError) as error:
            raise FeatureError(
                f"feature column {spec.name!r} holds values of more than "
                f"one type ({error}); the dataset's are "
                f"{spec.arrow_type}"
            ) from error
    return dataset_types(pa.Table.from_arrays(arrays, names=codec.names), codec)


def filled_columns(codec: FeatureCodec, table: pa.Table) -> list[list[str]]:
    """Per row, the feature columns whose value was null (NaN counts as null) and filled."""
    filled: list[list[str]] = [[] for _ in range(table.num_rows)]
    for spec in codec.columns:
        column = table.column(spec.name)
        nulls = pc.is_null(column, nan_is_null=pa.types.is_floating(column.type))
        for index in np.flatnonzero(nulls.to_numpy(zero_copy_only=False)):
            filled[index].append(spec.name)
    return filled


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
            raise FeatureError(
                f"feature column {spec.name!r} of type "
                f"{table.column(index).type} cannot be read as the "
                f"dataset's {spec.arrow_type}: {error}"
            ) from error
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


def network_weights(network: Any) -> dict[str, Any] | None:
    """The weights of an MLP (`nn.Sequential` of Linear and ReLU layers) with the layer
    sizes that rebuild it, all that `torch.load(weights_only=True)` reads; None for any
    other network."""
    from torch import nn

    layers = list(network.children()) if isinstance(network, nn.Sequential) else []
    linear = layers[::2]
    if (
        not layers
        or not all(isinstance(layer, nn.Linear) for layer in linear)
        or not all(isinstance(layer, nn.ReLU) for layer in layers[1::2])
        or len(layers) % 2 == 0
    ):
        return None
    sizes = [linear[0].in_features, *(layer.out_features for layer in linear)]
    return {"layer_sizes": sizes, "state_dict": network.state_dict()}


def network_from_weights(weights: dict[str, Any]) -> Any:
    """The MLP `network_weights` describes, in eval mode."""
    from torch import nn

    sizes = weights["layer_sizes"]
    layers: list[nn.Module] = []
    for width, following in pairwise(sizes):
        layers += [nn.Linear(width, following), nn.ReLU()]
    network = nn.Sequential(*layers[:-1])
    network.load_state_dict(weights["state_dict"])
    return network.eval()


def signature(codec: FeatureCodec, labels: list[Any]) -> ModelSignature:
    """Input: the feature columns with their MLflow types, each optional (a null is
    filled); output: the label in its type (probabilities and filled with `details`)."""
    inputs = Schema(
        [ColSpec(mlflow_type(spec), spec.name, required=False) for spec in codec.columns]
    )
    outputs = Schema(
        [
            ColSpec(label_type(labels), "predicted"),
            ColSpec(Array("float"), "probabilities", required=False),
            ColSpec(Array("string"), "filled", required=False),
        ]
    )
    return ModelSignature(
        inputs=inputs,
        outputs=outputs,
        params=ParamSchema([ParamSpec(DETAILS_PARAM, "boolean", False)]),
    )


def label_type(labels: list[Any]) -> str:
    """The MLflow type of the labels' values (strings unless all share a number type)."""
    for kind, name in ((bool, "boolean"), (int, "long"), (float, "double")):
        if labels and all(type(label) is kind for label in labels):
            return name
    return "string"


def mlflow_type(spec: ColumnSpec) -> Any:
    """The MLflow type of a feature column's values in a pandas DataFrame. An integer
    column (numbers, times of day, durations) is `any`: pandas holds it as int64, or as
    floats once a row has a null, and MLflow refuses floats for `long` and int64 for
    `double`; the codec casts it to the dataset's type, naming the column if it cannot.
    A date or timestamp column is `any` too: a serving host's JSON, or a CSV read back by
    pandas, holds ISO 8601 strings, which MLflow refuses for `datetime` ("Can not safely
    convert str to datetime64"), while Arrow casts them, and datetimes, to the column's type."""
    if spec.kind == "category" or spec.arrow_type in ("string", "large_string"):
        return "string"  # a category, or dates as ISO 8601 strings (dataset.date_columns)
    if spec.kind == "boolean":
        return "boolean"
    if spec.kind in ("vector", "sequence"):
        return Array(
            "double" if "float" in spec.arrow_type or "double" in spec.arrow_type else "long"
        )
    if spec.kind == "numeric" and not spec.arrow_type.startswith(("int", "uint")):
        return "double"
    return AnyType()
