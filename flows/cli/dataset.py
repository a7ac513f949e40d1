"""`ballast init` (a starter pipeline config for your own files) and `ballast inspect`
(what a committed dataset version holds).

`init` reads each file's footer (Parquet: schema and null counts, no data) or, for CSV
and JSON Lines, a sample of its first rows, and the label column of every file for the
class counts. It prints a pipeline config that `ballast run pipeline --config` accepts
once `${WORK_DIR}` is given, preceded by a table of every column (type, null count,
how the codec reads it) and the class counts; each null policy and the mix it proposes
are marked `CONFIRM` for the user to decide.
"""

from __future__ import annotations

import re
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import yaml

from preprocessing.config import DatasetSpec
from preprocessing.contract.codec import kind_of
from preprocessing.contract.manifest import read_manifest
from preprocessing.contract.names import yaml_comment, yaml_text
from preprocessing.storage.sources import iter_batches, list_inputs, read_footer

SAMPLE_ROWS = 10_000  # per CSV / JSON file: what `init` reads for types and null counts
LABEL_NAMES = ("label", "target", "class", "y")
# An id-ish name: `id`, `Id`, `uuid`, `stone_id`, `stoneId`, `row-key`, `GUID`.
ID_NAME = re.compile(r"(?i:^(id|uuid|uid|guid|key)$)|(?i:[_\-. ](id|uuid|uid|guid|key)$)|[a-z]Id$")
SOURCE_NAMES = ("source",)
IMBALANCE_TO_REBALANCE = 2.0  # largest / smallest class count above which `uniform` is proposed


@dataclass
class InputSurvey:
    """What `init` learned: the schema, nulls per column, rows looked at, class counts."""

    files: list[str]
    schema: pa.Schema
    nulls: Counter[str] = field(default_factory=Counter)
    num_rows_seen: int = 0
    sampled: bool = False
    classes: Counter[Any] = field(default_factory=Counter)
    ids: list[str] = field(default_factory=list)  # id-like columns: id-ish names, unique


def survey_inputs(inputs: str, label: str | None) -> tuple[InputSurvey, str]:
    """Footers (or samples) of every file under `inputs`, and the label column's counts."""
    files = [file.uri for file in list_inputs(DatasetSpec(inputs=[inputs]))]
    survey: InputSurvey | None = None
    for uri in files:
        schema, nulls, num_rows, sampled = _file_columns(uri)
        survey = survey or InputSurvey(files, schema)
        survey.nulls.update(nulls)
        survey.num_rows_seen += num_rows
        survey.sampled |= sampled
    assert survey is not None  # list_inputs raises when nothing matched
    label = label or _first_named(survey.schema, LABEL_NAMES)
    if label is None or label not in survey.schema.names:
        raise ValueError(f"--label {label}: no such column in {files[0]}; the columns are "
                         f"{survey.schema.names}")
    candidates = [f.name for f in survey.schema if f.name != label and ID_NAME.search(f.name)
                  and (pa.types.is_integer(f.type) or pa.types.is_string(f.type))]
    values: dict[str, list[Any]] = {name: [] for name in candidates}
    for uri in files:
        for batch in iter_batches(uri, columns=[label, *candidates]):
            survey.classes.update(batch.column(0).drop_null().to_pylist())
            for index, name in enumerate(candidates, start=1):
                values[name] += batch.column(index).to_pylist()
    survey.ids = [name for name in candidates
                  if None not in values[name] and len(set(values[name])) == len(values[name])]
    return survey, label


def id_column_of(survey: InputSurvey) -> str | None:
    """The id column `init` proposes: an id-like integer column (`id` first), or None."""
    integers = [name for name in survey.ids if pa.types.is_integer(survey.schema.field(name).type)]
    return next((name for name in integers if name.casefold() == "id"),
                integers[0] if integers else None)


def _file_columns(uri: str) -> tuple[pa.Schema, dict[str, int], int, bool]:
    """Schema, null counts and rows counted, from the footer or else a sample."""
    footer = read_footer(uri, max_piece_rows=1 << 30)
    if footer is not None and None not in footer.null_counts.values():
        import pyarrow.parquet as pq
        from fsspec.core import url_to_fs

        fs, path = url_to_fs(uri)
        with fs.open(path, "rb") as handle:
            num_rows = pq.ParquetFile(handle).metadata.num_rows
        return footer.schema, {k: v or 0 for k, v in footer.null_counts.items()}, num_rows, False
    batches, num_rows = [], 0
    for batch in iter_batches(uri):
        batches.append(batch.slice(0, SAMPLE_ROWS - num_rows))
        num_rows += batches[-1].num_rows
        if num_rows >= SAMPLE_ROWS:
            break
    table = pa.Table.from_batches(batches)
    return table.schema, {name: _null_count(table.column(name)) for name in table.column_names}, \
        num_rows, num_rows >= SAMPLE_ROWS


def _null_count(column: pa.ChunkedArray) -> int:
    count = column.null_count
    if pa.types.is_floating(column.type):
        count += int(pc.sum(pc.is_nan(column.drop_null())).as_py() or 0)  # NaN is a null too
    return count


def _first_named(schema: pa.Schema, names: tuple[str, ...]) -> str | None:
    return next((name for name in names if name in schema.names), None)


def proposed_policy(arrow_type: pa.DataType) -> str:
    """The null policy `init` proposes: the mean for numbers, nothing for the rest."""
    return "fill_mean" if kind_of(arrow_type) in ("numeric", "temporal") else "fill_zero"


def starter_config(survey: InputSurvey, label: str, inputs: str) -> dict[str, Any]:
    """The pipeline config `init` proposes (the shape of flows/presets/nightly.yaml)."""
    id_column = id_column_of(survey)
    source = _first_named(survey.schema, SOURCE_NAMES)
    taken = {label, source, *survey.ids}  # an id is not a feature, integer or string
    features = [f.name for f in survey.schema if f.name not in taken and kind_of(f.type)]
    counts = sorted(survey.classes.values())
    uniform = len(counts) > 1 and counts[-1] / max(counts[0], 1) > IMBALANCE_TO_REBALANCE
    return {
        "reshard": {"dataset": {
            "inputs": [inputs], "label_column": label, "source_column": source,
            **({"id_column": id_column} if id_column else {}), "feature_columns": features,
            "nulls": {name: proposed_policy(survey.schema.field(name).type)
                      for name in features if survey.nulls[name]}},
            "output_root": "${WORK_DIR}/datasets", "holdout_fraction": 0.1,
            "mix": {"class_weighting": "uniform" if uniform else "natural"}},
        "train": {"dataset": "${WORK_DIR}/datasets", "output_dir": "${WORK_DIR}/training",
                  "max_epochs": 4,
                  "tracking": {"tracking_uri": "sqlite:///${WORK_DIR}/mlflow.db",
                               "artifact_location": "${WORK_DIR}/mlartifacts",
                               "experiment": "ballast"}},
        "job": {"kind": "local", "num_processes_per_node": 1},
    }


def describe_inputs(inputs: str, label: str | None = None) -> str:
    """`ballast init`: the column table and class counts as comments, then the config."""
    survey, label = survey_inputs(inputs, label)
    config = starter_config(survey, label, inputs)
    dataset = config["reshard"]["dataset"]
    seen = "in samples of their first" if survey.sampled else "in all"
    lines = [f"# Starter config for {len(survey.files)} files under {yaml_comment(inputs)}; "
             f"null counts {seen} {survey.num_rows_seen} rows. Check each CONFIRM, then run:",
             "#   ballast run pipeline --config THIS.yaml --work-dir DIR", "#",
             f"# {'column':<24} {'type':<28} {'nulls':>8}  role"]
    for item in survey.schema:
        lines.append(f"# {yaml_comment(item.name):<24} {item.type!s:<28} "
                     f"{survey.nulls[item.name]:>8}  {yaml_comment(_role(item, dataset))}")
    lines += ["#", f"# classes of {yaml_comment(repr(label))} (rows): " + ", ".join(
        f"{yaml_comment(value)}: {count}"
        for value, count in sorted(survey.classes.items(), key=str))]
    if "id_column" not in dataset:
        lines.append("# no integer id column found: ballast derives a row id from each file's "
                     "path and row (column __ballast_row_id)")
    strings = [name for name in survey.ids if name != dataset.get("id_column")]
    if strings:
        lines.append(f"# CONFIRM: {yaml_comment(strings)} look like ids (unique, id-ish "
                     "names), so they are not features; add one to feature_columns if it is "
                     "a feature")
    body = yaml_text(config)
    return "\n".join(lines) + "\n" + _mark_confirm(body, survey, dataset)


def _role(item: pa.Field, dataset: dict[str, Any]) -> str:
    for role in ("label_column", "id_column", "source_column"):
        if dataset.get(role) == item.name:
            return role.removesuffix("_column")
    if item.name not in dataset["feature_columns"] and ID_NAME.search(item.name):
        return "id-like (not a feature)"
    kind = kind_of(item.type)
    return f"feature ({kind})" if kind else "ignored (no codec reads this type)"


def _mark_confirm(body: str, survey: InputSurvey, dataset: dict[str, Any]) -> str:
    """The proposed null policies and class weighting, each with a CONFIRM comment."""
    out = []
    for line in body.splitlines():
        name = _yaml_key(line)
        if name in dataset["nulls"] and line.startswith("      "):
            line += (f"  # CONFIRM: {survey.nulls[name]} nulls; or error, drop_row, "
                     "fill_zero, fill_mean, indicator")
        elif name == "class_weighting":
            counts = sorted(survey.classes.values()) or [0]
            line += (f"  # CONFIRM: classes at {counts[-1]}:{counts[0]}; uniform rebalances "
                     "them, natural keeps the mix")
        out.append(line)
    return "\n".join(out) + "\n"


def _yaml_key(line: str) -> str:
    """The mapping key a line of the dumped config starts with, unquoted (a column named
    `a: b` is dumped as `'a: b': ...`)."""
    key = line.strip().partition(": ")[0]
    if key[:1] in ("'", '"'):
        with suppress(yaml.YAMLError):
            key = str(yaml.safe_load(line.strip().rsplit(": ", 1)[0]))
    return key


def describe_version(dataset: str) -> str:
    """`ballast inspect`: a version's classes, sources, shards and null policies (YAML)."""
    manifest, location = read_manifest(dataset)
    splits = {name: {"num_rows": split.num_rows, "num_shards": len(split.shards),
                     "num_bytes": sum(entry.num_bytes for entry in split.shards),
                     "class_counts": _summed(entry.class_counts for entry in split.shards)}
              for name, split in manifest.splits.items()}
    columns = manifest.features.get("columns") or []
    report = {
        "version_id": manifest.version_id, "manifest": location,
        "created_at": manifest.created_at,
        "columns": {"label": manifest.label_column, "id": manifest.id_column,
                    "source": manifest.source_column},
        "classes": {str(value): manifest.input_class_counts.get(str(value), 0)
                    for value in manifest.classes},
        "sources": {str(value): manifest.input_source_counts.get(str(value), 0)
                    for value in manifest.sources},
        "splits": splits,
        "features": {c["name"]: {"kind": c["kind"], "type": c["arrow_type"],
                                 "nulls": c["nulls"], "null_count": c["null_count"]}
                     for c in columns} or manifest.feature_columns,
        "dropped_rows": manifest.features.get("dropped_rows", {}),
    }
    return yaml_text(report)


def _summed(counts: Any) -> dict[str, int]:
    total: Counter[str] = Counter()
    for item in counts:
        total.update(item)
    return {key: int(np.int64(value)) for key, value in sorted(total.items())}
