"""`ballast init` and `ballast inspect` output, one-line CLI errors with a traceback log,
and which failures Prefect retries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pytest
import yaml
from prefect.states import Failed

from flows.cli.main import main
from flows.params import PipelineParams
from flows.tasks import is_transient
from preprocessing.scan.feature_stats import InputError
from tests.feature_data import reshard


def write_flights(directory: Path) -> None:
    """Two CSV files: a string label at 3:1, one numeric column with 7 nulls, a string."""
    rng = np.random.default_rng(0)
    directory.mkdir()
    for part in range(2):
        num_rows = 40
        delay = rng.normal(10, 5, num_rows)
        delay[: 7 if part == 0 else 0] = np.nan
        pa_csv.write_csv(
            pa.table(
                {
                    "id": np.arange(part * num_rows, (part + 1) * num_rows),
                    "status": ["late" if k % 4 == 0 else "on_time" for k in range(num_rows)],
                    "delay": pa.array(delay, from_pandas=True),
                    "carrier": rng.choice(["aa", "ba"], num_rows),
                }
            ),
            directory / f"flights-{part}.csv",
        )


def test_init_prints_a_starter_config_with_columns_classes_and_policies_to_confirm(
    tmp_path, capsys
) -> None:
    """Invariants: the output is a pipeline config that validates once ${WORK_DIR} is set;
    it lists every column with its type and null count, the class counts, a null policy
    for the column with nulls marked CONFIRM, and proposes rebalancing at 3:1."""
    write_flights(tmp_path / "raw")
    assert main(["init", "--inputs", str(tmp_path / "raw"), "--label", "status"]) == 0
    text = capsys.readouterr().out
    config = yaml.safe_load(text.replace("${WORK_DIR}", str(tmp_path)))
    PipelineParams.model_validate(config)
    dataset = config["reshard"]["dataset"]
    assert dataset["feature_columns"] == ["delay", "carrier"]
    assert dataset["nulls"] == {"delay": "fill_mean"}
    assert config["reshard"]["mix"]["class_weighting"] == "uniform"
    table = {
        line.split()[1]: line.split()[2:]
        for line in text.splitlines()
        if line.startswith("# ") and len(line.split()) >= 5
    }
    assert table["delay"][:2] == ["double", "7"] and table["carrier"][:2] == ["string", "0"]
    assert "# classes of 'status' (rows): late: 20, on_time: 60" in text
    assert "delay: fill_mean  # CONFIRM: 7 nulls" in text


@pytest.mark.slow
def test_inspect_prints_classes_sources_shards_and_null_policies(
    tmp_path, dask_client, capsys
) -> None:
    """Invariant: `inspect` reports the version's classes with their input counts, each
    split's shards and rows, and each feature's policy and null count."""
    write_flights(tmp_path / "raw")
    result = reshard(
        tmp_path / "raw",
        tmp_path / "out",
        dask_client,
        {
            "label_column": "status",
            "feature_columns": ["delay", "carrier"],
            "nulls": {"delay": "drop_row"},
        },
    )
    assert main(["inspect", result.manifest_uri]) == 0
    report = yaml.safe_load(capsys.readouterr().out)
    assert report["version_id"] == result.manifest.version_id
    assert set(report["classes"]) == {"late", "on_time"}
    splits = report["splits"]
    assert splits["train"]["num_rows"] + splits["holdout"]["num_rows"] == 73
    assert splits["train"]["num_shards"] == len(result.manifest.split("train").shards)
    assert report["features"]["delay"] == {
        "kind": "numeric",
        "type": "double",
        "nulls": "drop_row",
        "null_count": 7,
    }
    assert sum(report["dropped_rows"].values()) == 7


def test_a_config_error_reads_in_one_line_with_the_traceback_in_a_log(
    tmp_path, monkeypatch, capsys
) -> None:
    """Invariants: an invalid override exits 2 with one stderr line naming the field and
    the value, no pydantic documentation link, and the path of a log holding the
    traceback."""
    monkeypatch.setenv("BALLAST_LOG_DIR", str(tmp_path / "logs"))
    code = main(
        [
            "run",
            "pipeline",
            "--config",
            "demo",
            "--work-dir",
            str(tmp_path),
            "--set",
            "train.max_epochs=-1",
        ]
    )
    error = capsys.readouterr().err
    assert code == 2 and error.count("\n") == 1
    assert "train.max_epochs" in error and "-1" in error and "pydantic.dev" not in error
    log = Path(error.rsplit("(traceback: ", 1)[1].rstrip(")\n"))
    assert log.parent == tmp_path / "logs" and "Traceback" in log.read_text()


@pytest.mark.slow
def test_a_data_error_names_file_column_count_and_fix_in_one_line(
    prefect_harness, tmp_path, monkeypatch, capsys
) -> None:
    """Invariant: a reshard of files with nulls under the default `error` policy fails
    once, and the CLI's one line names the column, the count, a file and the fix."""
    monkeypatch.setenv("BALLAST_LOG_DIR", str(tmp_path / "logs"))
    write_flights(tmp_path / "raw")
    config = {
        "reshard": {
            "dataset": {
                "inputs": [str(tmp_path / "raw")],
                "label_column": "status",
                "source_column": None,
                "feature_columns": ["delay"],
            },
            "output_root": str(tmp_path / "out"),
        },
        "dask": {"kind": "local", "num_workers": 1},
    }
    (tmp_path / "reshard.yaml").write_text(yaml.safe_dump(config))
    assert main(["run", "reshard", "--config", str(tmp_path / "reshard.yaml")]) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "'delay'" in error and "7" in error and "flights-0.csv" in error
    assert "dataset.nulls" in error


def test_prefect_retries_transient_failures_only() -> None:
    """Invariant: the tasks' retry condition refuses a data error (the scan's InputError,
    any ValueError) and accepts an I/O failure."""
    assert not is_transient(None, None, Failed(data=InputError("column 'x' holds 3 nulls")))
    assert not is_transient(None, None, Failed(data=ValueError("bad config")))
    assert is_transient(None, None, Failed(data=ConnectionError("store unreachable")))


def test_init_takes_a_unique_id_like_column_as_the_id_and_proposes_no_absent_one(
    tmp_path, capsys
) -> None:
    """Invariants: a unique integer column with an id-ish name (`stone_id`) is proposed as
    `dataset.id_column` and is no feature, nor is a unique string `uuid`; a table without
    such a column gets no `id_column` (ballast derives ids), never a column that is absent;
    a non-unique `batch_id` stays a feature; the config validates either way."""
    rng = np.random.default_rng(1)
    raw = tmp_path / "stones"
    raw.mkdir()
    pa_csv.write_csv(
        pa.table(
            {
                "stone_id": rng.permutation(60) + 1000,
                "uuid": [f"u-{k:03d}" for k in range(60)],
                "batch_id": np.arange(60) % 3,
                "weight": rng.normal(size=60),
                "label": ["a", "b", "c"] * 20,
            }
        ),
        raw / "stones.csv",
    )
    assert main(["init", "--inputs", str(raw)]) == 0
    text = capsys.readouterr().out
    config = yaml.safe_load(text.replace("${WORK_DIR}", str(tmp_path)))
    PipelineParams.model_validate(config)
    dataset = config["reshard"]["dataset"]
    assert dataset["id_column"] == "stone_id"
    assert dataset["feature_columns"] == ["batch_id", "weight"]
    assert "uuid" in text and "look like ids" in text
    pa_csv.write_csv(
        pa.table({"weight": rng.normal(size=30), "label": ["a", "b"] * 15}),
        (tmp_path / "plain.csv"),
    )
    assert main(["init", "--inputs", str(tmp_path / "plain.csv")]) == 0
    plain = yaml.safe_load(capsys.readouterr().out.replace("${WORK_DIR}", str(tmp_path)))
    PipelineParams.model_validate(plain)
    assert "id_column" not in plain["reshard"]["dataset"]
    assert plain["reshard"]["dataset"]["feature_columns"] == ["weight"]


def test_init_keeps_any_column_name_and_confirms_each_null_policy(tmp_path, capsys) -> None:
    """Invariants: columns named with spaces, units, a colon, quotes, a pipe and non-ASCII
    letters come back in the config as they are (readable, not escaped), and each column
    with nulls gets its policy marked CONFIRM, a quoted YAML key included."""
    names = ["Body Mass (g)", "a: b", 'bill "depth"', "ratio | %", "Île (région)"]
    raw = tmp_path / "raw"
    raw.mkdir()
    pa_csv.write_csv(
        pa.table(
            {
                **{name: pa.array([1.5, None, 2.5, 3.0]) for name in names},
                "label": ["x", "y", "x", "y"],
            }
        ),
        raw / "odd.csv",
    )
    assert main(["init", "--inputs", str(raw)]) == 0
    text = capsys.readouterr().out
    config = yaml.safe_load(text.replace("${WORK_DIR}", str(tmp_path)))
    PipelineParams.model_validate(config)
    assert config["reshard"]["dataset"]["feature_columns"] == names
    assert "- Île (région)" in text
    assert text.count("fill_mean  # CONFIRM: 1 nulls") == len(names)
