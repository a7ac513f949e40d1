"""`ballast init`: a starter pipeline config for your own files, one that runs as proposed.

The files are read by preprocessing/scan/column_roles.py (the scan's own null counts,
distinct counts and categories), which gives each column a role: label, source, id, date,
a string too wide for categories, a feature, or ignored. The output is a table of every
column (type, nulls, role) and the class counts as comments, then the config that
`ballast run pipeline --config` accepts once `${WORK_DIR}` is given. Every choice a person
should check is marked `CONFIRM` with the alternatives the reshard accepts: each null
policy (only those the column's kind takes), the mix, unlabelled rows, the validation
split, and each column left out with why. Training is sized to the rows
(training/sizing.py). Before printing, the proposal is checked by the scan's own rules
(`check_proposal`).
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import yaml

from preprocessing.config import DatasetSpec
from preprocessing.contract.names import yaml_comment, yaml_text
from preprocessing.scan.column_roles import TableSurvey, check_proposal, survey_columns
from preprocessing.scan.feature_stats import policies_for
from preprocessing.storage.csv_reading import CsvReading
from preprocessing.storage.sources import file_format, iter_batches, list_inputs, stream_schema
from training.models.config import TabularConfig
from training.sizing import SIZE_RULES, TRAIN_RULES, sized_training

LABEL_NAMES = ("label", "target", "class", "y")
SOURCE_NAMES = ("source",)
# largest / smallest class count above which `uniform` is proposed: any imbalance. Models
# are judged and promoted by balanced accuracy, which weighs the classes alike, and one fit
# to the natural mix leans to the frequent class where classes overlap (it was 2.0:
# titanic, 1.64:1, 0.971x -> 1.000x HGB; held-out wages, 1.75:1, 0.969x -> 0.995x;
# participation, 1.18:1, 1.039x -> 1.028x; benchmarks/RESULTS.md M87).
IMBALANCE_TO_REBALANCE = 1.0
HOLDOUT_FRACTION = 0.1
# A validation split of this share is proposed where it would hold MIN_VALIDATION_ROWS or
# more, with `train.select_best` on it. On a smaller table the training rows it takes cost
# the held-out score more than its figures are worth (benchmarks/RESULTS.md M67: 0.1 cost
# benefits' 4,877 rows 1.4 points of balanced accuracy over 3 seeds, without selection),
# and a few hundred rows' val_loss is too noisy to choose an epoch by.
VALIDATION_FRACTION, MIN_VALIDATION_ROWS = 0.1, 1_000
MIN_TIME_VALUES = 100  # distinct dates a time holdout is proposed by, at least
TIME_SAMPLE_ROWS = 1_000_000  # rows read to count them, at most
# select_best's patience: this share of the proposed epochs, at least MIN_PATIENCE.
PATIENCE_SHARE, MIN_PATIENCE = 0.25, 2
MAX_CATEGORIES = DatasetSpec.model_fields["max_categories"].default
# init reads CSV text as pandas and Polars do, an empty field a null, and writes that
# reading into the config it proposes (a config without it reads as ballast did before).
PROPOSED_READING = CsvReading("missing")
ROLE_NOTES = {
    "label": "label",
    "source": "source",
    "id_column": "id",
    "id": "id-like (not a feature)",
    "date": "feature (temporal: a date string)",
    "group": "group (rows of one entity: not a feature)",
    "wide": "left out (too many distinct strings)",
    "ignored": "ignored (no codec reads this type)",
}


def survey_inputs(inputs: str, label: str | None) -> TableSurvey:
    """Every column of the files under `inputs`, with its role; the label checked."""
    files = [file.uri for file in list_inputs(DatasetSpec(inputs=[inputs]))]
    names = stream_schema(files[0], reading=PROPOSED_READING).names
    label = label or next((name for name in LABEL_NAMES if name in names), None)
    if label is None or label not in names:
        raise ValueError(f"--label {label}: no such column in {files[0]}; the columns are {names}")
    source = next((name for name in SOURCE_NAMES if name in names and name != label), None)
    return survey_columns(files, label, source, PROPOSED_READING)


def proposed_policy(kind: str | None) -> str:
    """The null policy `init` proposes: the mean for numbers and dates, else nothing."""
    return "fill_mean" if kind in ("numeric", "temporal") else "fill_zero"


def validation_fraction(survey: TableSurvey) -> float:
    """The validation split init proposes: VALIDATION_FRACTION where it holds enough rows
    (beside a time holdout too: then the newest rows the holdout leaves)."""
    labelled = survey.num_rows - survey.unlabelled
    enough = labelled * VALIDATION_FRACTION >= MIN_VALIDATION_ROWS
    return VALIDATION_FRACTION if enough else 0.0


def proposed_selection(survey: TableSurvey, max_epochs: int) -> dict[str, Any]:
    """`train.select_best` on val_loss where a validation split is proposed, else none."""
    if not validation_fraction(survey):
        return {}
    patience = max(MIN_PATIENCE, round(PATIENCE_SHARE * max_epochs))
    return {"select_best": {"monitor": "val_loss", "patience": patience}}


def dataset_section(survey: TableSurvey, inputs: str) -> dict[str, Any]:
    """The proposed `reshard.dataset`."""
    features = [*survey.named("feature"), *survey.named("date")]
    features = [name for name in survey.schema.names if name in features]  # file order
    ids = survey.named("id_column")
    nulls = {
        name: proposed_policy(survey.columns[name].kind)
        for name in features
        if survey.columns[name].null_rows or survey.sampled
    }
    return {
        "inputs": [inputs],
        "label_column": survey.label,
        "source_column": next(iter(survey.named("source")), None),
        **({"id_column": _first_id(ids)} if ids else {}),
        "feature_columns": features,
        **({"date_columns": survey.named("date")} if survey.named("date") else {}),
        "nulls": nulls,
        **({"unlabelled": "drop"} if survey.unlabelled else {}),
        **({"group_column": survey.named("group")[0]} if survey.named("group") else {}),
        **({"duplicates": "same_split"} if survey.duplicate_rows else {}),
        "validation_fraction": validation_fraction(survey),
        **_time_holdout(survey),
        **_csv_reading(survey),
    }


def _csv_reading(survey: TableSurvey) -> dict[str, Any]:
    """The reading the survey used, where a file is CSV (the only format it touches)."""
    if not any(file_format(uri) == "csv" for uri in survey.files):
        return {}
    return {"csv_empty_text": survey.reading.empty_text}


def date_columns_of(survey: TableSurvey) -> list[str]:
    """Columns of dates or timestamps (Arrow's, or ISO 8601 strings) with no null seen and
    at least MIN_TIME_VALUES distinct values: a date of fewer (a model year: cars' 13) is an
    attribute more than an arrival time, and its newest value alone would be the holdout
    (cars': 41 rows of one year, two of them of its rarest class)."""
    return [
        name
        for name, column in survey.columns.items()
        if column.role in ("feature", "date")
        and not column.null_rows
        and (
            column.role == "date"
            or pa.types.is_timestamp(column.arrow_type)
            or pa.types.is_date(column.arrow_type)
        )
        and _distinct_values(survey, name) >= MIN_TIME_VALUES
    ]


def _distinct_values(survey: TableSurvey, name: str) -> int:
    """Distinct values of column `name` in the surveyed files, counted up to
    MIN_TIME_VALUES over at most TIME_SAMPLE_ROWS rows (the scan's distinct sketch hashes
    no dates)."""
    seen: set[Any] = set()
    rows = 0
    for uri in survey.files:
        for batch in iter_batches(uri, [name], reading=survey.reading):
            seen.update(pc.unique(batch.column(0)).to_pylist())
            rows += batch.num_rows
            if len(seen) >= MIN_TIME_VALUES or rows >= TIME_SAMPLE_ROWS:
                return len(seen)
    return len(seen)


def _time_holdout(survey: TableSurvey) -> dict[str, Any]:
    """`holdout_by: newest` by the first date column, unless a group or duplicates rule
    is proposed (the two cannot be set together: preprocessing/toolbox/split_rules.py)."""
    dates = date_columns_of(survey)
    if not dates or survey.named("group") or survey.duplicate_rows:
        return {}
    return {"holdout_by": "newest", "holdout_column": dates[0]}


def _first_id(ids: list[str]) -> str:
    return next((name for name in ids if name.casefold() == "id"), ids[0])


def starter_config(survey: TableSurvey, inputs: str) -> dict[str, Any]:
    """The pipeline config `init` proposes (the shape of flows/presets/nightly.yaml)."""
    counts = sorted(survey.classes.values())
    uniform = len(counts) > 1 and counts[-1] / max(counts[0], 1) > IMBALANCE_TO_REBALANCE
    labelled = survey.num_rows - survey.unlabelled
    training = sized_training(int(labelled * (1 - HOLDOUT_FRACTION - validation_fraction(survey))))
    return {
        "reshard": {
            "dataset": dataset_section(survey, inputs),
            "output_root": "${WORK_DIR}/datasets",
            "holdout_fraction": HOLDOUT_FRACTION,
            "mix": {"class_weighting": "uniform" if uniform else "natural"},
        },
        "train": {
            "dataset": "${WORK_DIR}/datasets",
            "output_dir": "${WORK_DIR}/training",
            **training,
            **proposed_selection(survey, training["max_epochs"]),
            "tracking": {
                "tracking_uri": "sqlite:///${WORK_DIR}/mlflow.db",
                "artifact_location": "${WORK_DIR}/mlartifacts",
                "experiment": "ballast",
            },
        },
        "job": {"kind": "local", "num_processes_per_node": 1},
    }


def describe_inputs(inputs: str, label: str | None = None) -> str:
    """`ballast init`: the column table and class counts as comments, then the config."""
    survey = survey_inputs(inputs, label)
    config = starter_config(survey, inputs)
    check_proposal(survey, DatasetSpec.model_validate(config["reshard"]["dataset"]))
    body = yaml_text(config)
    return "\n".join(header_lines(survey, inputs)) + "\n" + _mark_confirm(body, survey)


def header_lines(survey: TableSurvey, inputs: str) -> list[str]:
    """The comments above the config: the column table, the classes, what was left out."""
    read = f"the first {survey.num_rows} rows" if survey.sampled else f"all {survey.num_rows} rows"
    lines = [
        f"# Starter config for {len(survey.files)} files under {yaml_comment(inputs)}; "
        f"counts over {read}. Check each CONFIRM, then run:",
        "#   ballast run pipeline --config THIS.yaml --work-dir DIR",
        "#",
        f"# {'column':<24} {'type':<28} {'nulls':>8}  role",
    ]
    lines += [
        f"# {yaml_comment(c.name):<24} {c.arrow_type!s:<28} {c.null_rows:>8}  "
        f"{ROLE_NOTES.get(c.role, f'feature ({c.kind})')}"
        for c in survey.columns.values()
    ]
    lines += [
        "#",
        f"# classes of {survey.label!r} (rows): "
        + ", ".join(
            f"{yaml_comment(value)}: {count}"
            for value, count in sorted(survey.classes.items(), key=str)
        ),
    ]
    if not survey.named("id_column"):
        lines.append(
            "# no unique integer id column found: ballast derives a row id from "
            "each file's path and row (column __ballast_row_id)"
        )
    return lines + _left_out_lines(survey)


def _left_out_lines(survey: TableSurvey) -> list[str]:
    lines = []
    if ids := survey.named("id"):
        lines.append(
            f"# CONFIRM: {ids} look like ids (about one distinct value per row), so "
            "they are not features (a model would memorise them); add one to "
            "feature_columns only if it is a feature"
        )
    for name in survey.named("wide"):
        column = survey.columns[name]
        lines.append(
            f"# CONFIRM: {name!r} holds {column.distinct} distinct strings in "
            f"{column.rows} rows (more than dataset.max_categories, "
            f"{MAX_CATEGORIES}, or than half the rows: most occur once), so it is "
            "left out; to "
            "use it, add it to feature_columns and set dataset.category_buckets "
            "(its values hashed into that many buckets)"
        )
    if (dates := date_columns_of(survey)) and (survey.named("group") or survey.duplicate_rows):
        lines.append(
            f"# CONFIRM: {dates} hold dates: holdout_by: newest with holdout_column would "
            "hold out the newest rows instead of the group or duplicates rule (not both)"
        )
    if dates := survey.named("date"):
        lines.append(
            f"# CONFIRM: {dates} hold ISO 8601 dates, so they are temporal features "
            "(seconds since the epoch); remove them from date_columns to read them "
            "as categories"
        )
    return lines


def _group_reason(survey: TableSurvey) -> str:
    column = survey.columns[survey.named("group")[0]]
    others = survey.named("group")[1:]
    return (
        f"{column.distinct} values in {column.rows} rows (about "
        f"{column.rows // max(column.distinct, 1)} a value): rows of one would land on both "
        "sides of the split, so each value's rows go to one"
        + (f"; or {others}" if others else "")
        + "; remove it if rows are independent"
    )


def _time_reason(survey: TableSurvey) -> str:
    first, *others = date_columns_of(survey)
    return (
        f"{first!r} holds dates: the newest rows are held out, as the model will meet "
        "rows newer than it was trained on; random draws rows alone"
        + (f"; or by {others}" if others else "")
    )


def _mark_confirm(body: str, survey: TableSurvey) -> str:
    """The proposed null policies, unlabelled rows and class weighting, each with a
    CONFIRM comment naming the alternatives."""
    out: list[str] = []
    for line in body.splitlines():
        name = _yaml_key(line)
        column = survey.columns.get(name)
        if _in_section(out, "    tabular:") and line.startswith("      "):
            line += f"  # {TABULAR_SETTINGS[name]}"
        elif line.startswith("      ") and column is not None and column.role != "label":
            others = [p for p in policies_for(column.kind) if p != line.rsplit(": ", 1)[-1]]
            line += f"  # CONFIRM: {column.null_rows} nulls; or {', '.join(others)}"
        elif line.strip() == "unlabelled: drop":
            line += (
                f"  # CONFIRM: {survey.unlabelled} rows have no {survey.label!r}: drop "
                "leaves them out (counted per file); refuse rejects their files"
            )
        elif name == "class_path":
            line += (
                "  # CONFIRM: embeddings and an ensemble of MLPs; or classifier (one MLP), "
                "or your LightningModule as pkg.module:Class"
            )
        elif name == "group_column":
            line += f"  # CONFIRM: {_group_reason(survey)}"
        elif line.strip() == "duplicates: same_split":
            line += (
                f"  # CONFIRM: {survey.duplicate_rows} rows of the sample repeat an earlier "
                "row exactly; same_split keeps each set in one split (keep: drawn alone)"
            )
        elif line.strip() == "csv_empty_text: missing":
            line += (
                "  # an empty field of a CSV text column is a null (as pandas and Polars "
                'read it), met by the nulls policies and unlabelled; empty_string: the value ""'
            )
        elif name == "validation_fraction":
            line += f"  # CONFIRM: {_validation_reason(survey)}"
        elif name in TRAIN_RULES:
            line += f"  # {TRAIN_RULES[name]}"
        elif line.strip() == "select_best:":
            line += (
                "  # CONFIRM: stop once val_loss on the validation split has not improved "
                "for `patience` epochs and log the best epoch's weights; remove: every "
                "epoch runs and the last weights are logged"
            )
        elif line.strip() == "holdout_by: newest":
            line += f"  # CONFIRM: {_time_reason(survey)}"
        elif name == "class_weighting":
            counts = sorted(survey.classes.values()) or [0]
            line += (
                f"  # CONFIRM: classes at {counts[-1]}:{counts[0]}; uniform rebalances "
                "them, natural keeps the mix"
            )
        out.append(line)
    return "\n".join(out) + "\n"


def _validation_reason(survey: TableSurvey) -> str:
    if validation_fraction(survey):
        newest = " (the newest rows the holdout leaves)" if _time_holdout(survey) else ""
        return (
            f"rows training validates on{newest} (val_*, early stopping, checkpoint choice), "
            "apart from the holdout that judges the model; 0: it validates on the holdout"
        )
    return (
        f"0: training validates on the holdout, which then judges the model it chose; "
        f"{VALIDATION_FRACTION} would hold under {MIN_VALIDATION_ROWS} of these rows"
    )


def _in_section(lines: list[str], header: str) -> bool:
    """Whether the line after `lines` is inside the mapping that `header` opens (the
    nearest line above indented less than the header's entries is the header)."""
    depth = len(header) - len(header.lstrip()) + 2
    above = next((line for line in reversed(lines) if not line.startswith(" " * depth)), "")
    return above.split("  #")[0] == header


# What each setting of the proposed model does, beside it in the config (and how init
# sized it to the rows, where it did: training/sizing.py).
TABULAR_SETTINGS = {
    name: " ".join(filter(None, (field.description, SIZE_RULES.get(name))))
    for name, field in TabularConfig.model_fields.items()
}


def _yaml_key(line: str) -> str:
    """The mapping key a line of the dumped config starts with, unquoted (a column named
    `a: b` is dumped as `'a: b': ...`)."""
    key = line.strip().partition(": ")[0]
    if key[:1] in ("'", '"'):
        with suppress(yaml.YAMLError):
            key = str(yaml.safe_load(line.strip().rsplit(": ", 1)[0]))
    return key
