"""`ballast init` proposes a config its own scan accepts: ids, dates, wide strings, NaN
and unlabelled rows seen for what they are, and the config, as proposed, runs end to end
(reshard, training, evaluation, registry, batch inference on the raw files, the champion
on a DataFrame)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from distributed import Client

from flows.cli.main import main
from flows.params import InferenceParams, PipelineParams
from preprocessing.contract.manifest import read_manifest, shard_uri
from preprocessing.driver.cluster import DaskConfig
from tests.raw_tables import write_messy_files

NUM_ROWS = 24_000


def init_config(raw: Path, work: Path, capsys: pytest.CaptureFixture[str]) -> tuple[str, Any]:
    """`ballast init` on `raw`: what it printed, and the config with ${WORK_DIR} = work."""
    assert main(["init", "--inputs", str(raw)]) == 0
    text = capsys.readouterr().out
    return text, yaml.safe_load(text.replace("${WORK_DIR}", str(work)))


def test_init_sees_ids_dates_wide_strings_nan_and_unlabelled_rows(tmp_path, capsys) -> None:
    """Invariants: the unique integer key is the id column and the unique string key is
    left out, neither a feature; the timestamp string is a temporal feature; the
    10,000-value string is left out with a CONFIRM saying why; NaN counts as null (as the
    reshard counts it) and gets a fill policy; the null category gets one its kind takes
    (never `indicator`); the unlabelled rows are counted with a CONFIRM line; training is
    sized to the rows; the timestamps (no null) make the holdout the newest rows, and the
    validation split beside it the newest rows the holdout leaves (its CONFIRM says so),
    with `select_best` on val_loss; the config validates."""
    table = write_messy_files(tmp_path / "raw", NUM_ROWS)
    text, config = init_config(tmp_path / "raw", tmp_path, capsys)
    PipelineParams.model_validate(config)
    dataset = config["reshard"]["dataset"]
    assert dataset["id_column"] == "order_no"
    assert dataset["feature_columns"] == ["created", "x", "colour"]
    assert dataset["date_columns"] == ["created"]
    assert (dataset["holdout_by"], dataset["holdout_column"]) == ("newest", "created")
    assert dataset["nulls"] == {"x": "fill_mean", "colour": "fill_zero"}
    nan_rows = int(pc.sum(pc.is_nan(table.column("x"))).as_py())
    assert (
        f"x: fill_mean  # CONFIRM: {nan_rows} nulls; or error, drop_row, fill_zero, "
        "indicator" in text
    )
    assert "colour: fill_zero  # CONFIRM: " in text and "or error, drop_row\n" in text
    assert "'ticket'" in text and "look like ids" in text
    assert "# CONFIRM: 'shop' holds" in text and "category_buckets" in text
    unlabelled = table.column("label").null_count
    assert dataset["unlabelled"] == "drop"
    assert f"unlabelled: drop  # CONFIRM: {unlabelled} rows have no 'label'" in text
    assert config["train"]["max_epochs"] > 4  # ~1,500 steps of 64 rows over ~17,600 rows
    assert dataset["validation_fraction"] == 0.1
    assert (
        "validation_fraction: 0.1  # CONFIRM: rows training validates on (the newest rows "
        "the holdout leaves)" in text
    )
    assert config["train"]["select_best"]["monitor"] == "val_loss"


@pytest.mark.slow
def test_the_proposed_config_runs_end_to_end_and_serves_every_raw_row(
    prefect_harness, dask_client: Client, tmp_path, capsys
) -> None:
    """Invariants: the config init proposed, CONFIRM lines answered as proposed, reshards
    (unlabelled rows counted per file, a validation split by time just older than the
    holdout, which training selects on), trains, beats the class prior and registers a
    champion; batch inference over the raw files predicts every row, unlabelled ones and
    NaN included; the champion predicts on a DataFrame with the timestamp strings."""
    import mlflow

    from flows.pipeline import batch_inference_flow, pipeline

    table = write_messy_files(tmp_path / "raw", NUM_ROWS)
    _, config = init_config(tmp_path / "raw", tmp_path, capsys)
    config["train"]["max_epochs"] = 1  # the run, not the model's quality, is under test
    config["train"]["tracking"]["registered_model_name"] = "messy"
    config["job"]["retry"] = {"attempts": 1}
    config["dask"] = {"kind": "address", "address": dask_client.scheduler.address}
    result = pipeline(**PipelineParams.model_validate(config).arguments())
    manifest, _ = read_manifest(result.manifest_uri)
    assert sum(manifest.features["unlabelled_rows"].values()) == table.column("label").null_count
    assert len(manifest.features["unlabelled_rows"]) == 4
    cut = manifest.deltas[-1].time_cut
    assert manifest.selection_split() == "validation" and cut["validation_cutoff"] < cut["cutoff"]
    scores = next(iter(result.evaluations.values()))
    assert scores.beats_class_prior and result.registration.alias == "champion"
    tracking = PipelineParams.model_validate(config).train.tracking
    out = batch_inference_flow(
        **InferenceParams(
            model_uri="models:/messy@champion",
            tracking=tracking,
            inputs=sorted(str(p) for p in (tmp_path / "raw").iterdir()),
            id_column="order_no",
            output_root=str(tmp_path / "predictions"),
            dask=DaskConfig(kind="address", address=dask_client.scheduler.address),
        ).arguments()
    )
    predicted, location = read_manifest(out.manifest_uri)
    rows = pa.concat_tables(
        pq.read_table(shard_uri(location, entry)) for entry in predicted.split("predictions").shards
    )
    assert sorted(rows.column("order_no").to_pylist()) == sorted(
        table.column("order_no").to_pylist()
    )
    mlflow.set_tracking_uri(tracking.tracking_uri)
    frame = table.select(["created", "x", "colour"]).slice(0, 200).to_pandas()
    served = mlflow.pyfunc.load_model("models:/messy@champion").predict(
        frame, params={"details": True}
    )
    assert len(served) == 200 and set(served["predicted"]) <= {"yes", "no"}
    np.testing.assert_allclose(np.stack(served["probabilities"]).sum(axis=1), 1.0, rtol=1e-5)


def test_init_proposes_the_group_column_and_same_split_with_their_reasons(tmp_path, capsys) -> None:
    """Invariants: a repeating column under an entity name (`patient`: about 8 rows a
    value) is proposed as `group_column`, not a feature, with a CONFIRM giving its counts;
    rows repeated exactly in the sample get `duplicates: same_split` with their count;
    a table of distinct rows and no entity column gets neither."""
    rng = np.random.default_rng(0)
    patients = rng.integers(0, 300, size=2_400)
    table = pa.table(
        {
            "patient": [f"p{i}" for i in patients],
            "label": (patients % 2).tolist(),
            "x": rng.normal(size=2_400),
        }
    )
    (tmp_path / "raw").mkdir()
    pq.write_table(table, tmp_path / "raw" / "a.parquet")
    pq.write_table(table.slice(0, 150), tmp_path / "raw" / "b.parquet")  # a re-sent export
    text, config = init_config(tmp_path / "raw", tmp_path, capsys)
    PipelineParams.model_validate(config)
    dataset = config["reshard"]["dataset"]
    assert dataset["group_column"] == "patient" and dataset["feature_columns"] == ["x"]
    assert "group_column: patient  # CONFIRM: " in text and "a value)" in text
    assert dataset["duplicates"] == "same_split"
    assert "duplicates: same_split  # CONFIRM: 150 rows of the sample repeat" in text
    pq.write_table(table.drop_columns(["patient"]), tmp_path / "raw" / "b.parquet")
    (tmp_path / "raw" / "a.parquet").unlink()
    _, config = init_config(tmp_path / "raw", tmp_path, capsys)
    assert "group_column" not in config["reshard"]["dataset"]
    assert "duplicates" not in config["reshard"]["dataset"]


def test_init_proposes_no_validation_split_where_it_would_be_too_small(tmp_path, capsys) -> None:
    """Invariants: on 1,000 labelled rows (a validation split of 10% under 1,000 rows) init
    proposes `validation_fraction: 0.0`, its CONFIRM saying that training then validates
    on the holdout, which judges the model it chose, and no `select_best`; on 12,000 rows
    (no date column) it proposes 0.1, with its CONFIRM, and `select_best` on val_loss with
    a quarter of the epochs as patience (at least 2), with its CONFIRM; beside a time
    holdout the same rule holds (1,000 dated rows: none; 12,000: 0.1)."""
    rng = np.random.default_rng(1)
    table = pa.table({"label": rng.integers(0, 2, 1_000), "x": rng.normal(size=1_000)})
    (tmp_path / "raw").mkdir()
    pq.write_table(table, tmp_path / "raw" / "a.parquet")
    text, config = init_config(tmp_path / "raw", tmp_path, capsys)
    PipelineParams.model_validate(config)
    assert config["reshard"]["dataset"]["validation_fraction"] == 0.0
    assert "validation_fraction: 0.0  # CONFIRM: 0: training validates on the holdout" in text
    assert "select_best" not in config["train"]
    rng = np.random.default_rng(2)
    table = pa.table({"label": rng.integers(0, 2, 12_000), "x": rng.normal(size=12_000)})
    raw_file = tmp_path / "raw" / "a.parquet"
    pq.write_table(table, raw_file)
    text, config = init_config(tmp_path / "raw", tmp_path, capsys)
    PipelineParams.model_validate(config)
    assert config["reshard"]["dataset"]["validation_fraction"] == 0.1
    assert "validation_fraction: 0.1  # CONFIRM: rows training validates on" in text
    patience = max(2, round(config["train"]["max_epochs"] / 4))
    assert config["train"]["select_best"] == {"monitor": "val_loss", "patience": patience}
    assert "select_best:  # CONFIRM: stop once val_loss on the validation split" in text
    for rows, proposed in ((1_000, 0.0), (12_000, 0.1)):
        seen = np.datetime64("2024-03-01", "s") + np.arange(rows).astype("timedelta64[h]")
        pq.write_table(table.slice(0, rows).append_column("seen", pa.array(seen)), raw_file)
        _, config = init_config(tmp_path / "raw", tmp_path, capsys)
        dataset = config["reshard"]["dataset"]
        assert (dataset["holdout_by"], dataset["validation_fraction"]) == ("newest", proposed)
        assert ("select_best" in config["train"]) == bool(proposed)


def test_init_proposes_a_time_holdout_by_a_date_column_with_its_reason(tmp_path, capsys) -> None:
    """Invariants: a table with a timestamp column (no nulls) gets `holdout_by: newest`
    by it, with a CONFIRM giving the reason, and the config validates; beside a proposed
    group column the time holdout is not proposed (the two are refused together) but
    named as the alternative; a date column with nulls, or with under 100 distinct values
    (13 years: the newest year alone would be held out), is not proposed."""
    rng = np.random.default_rng(1)
    seen = np.datetime64("2024-03-01", "s") + rng.integers(0, 10**7, 2_000).astype("timedelta64[s]")
    table = pa.table(
        {"label": rng.integers(0, 2, 2_000).tolist(), "x": rng.normal(size=2_000), "seen": seen}
    )
    (tmp_path / "raw").mkdir()
    pq.write_table(table, tmp_path / "raw" / "a.parquet")
    text, config = init_config(tmp_path / "raw", tmp_path, capsys)
    PipelineParams.model_validate(config)
    dataset = config["reshard"]["dataset"]
    assert (dataset["holdout_by"], dataset["holdout_column"]) == ("newest", "seen")
    assert "holdout_by: newest  # CONFIRM: 'seen' holds dates: the newest rows" in text
    patients = [f"p{i}" for i in rng.integers(0, 250, 2_000)]
    pq.write_table(
        table.append_column("patient", pa.array(patients)), tmp_path / "raw" / "a.parquet"
    )
    text, config = init_config(tmp_path / "raw", tmp_path, capsys)
    PipelineParams.model_validate(config)
    assert config["reshard"]["dataset"]["group_column"] == "patient"
    assert "holdout_by" not in config["reshard"]["dataset"]
    assert "# CONFIRM: ['seen'] hold dates: holdout_by: newest" in text
    with_nulls = table.set_column(2, "seen", pa.array(seen, mask=np.arange(2_000) == 5))
    pq.write_table(with_nulls, tmp_path / "raw" / "a.parquet")
    _, config = init_config(tmp_path / "raw", tmp_path, capsys)
    assert "holdout_by" not in config["reshard"]["dataset"]
    years = np.datetime64("1970-01-01", "D") + 365 * rng.integers(0, 13, 2_000)
    pq.write_table(table.set_column(2, "seen", pa.array(years)), tmp_path / "raw" / "a.parquet")
    _, config = init_config(tmp_path / "raw", tmp_path, capsys)
    assert "holdout_by" not in config["reshard"]["dataset"]  # 13 model years: an attribute


@pytest.mark.parametrize(("first", "second", "mix"), [(500, 500, "natural"), (520, 480, "uniform")])
def test_init_rebalances_any_unequal_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], first: int, second: int, mix: str
) -> None:
    """Invariant: init proposes `class_weighting: uniform` wherever the classes' counts
    differ (520:480 already), and `natural` only where they are equal: the score a model
    is judged and promoted by, balanced accuracy, weighs every class alike, and a model
    fit to the natural mix leans to the frequent class where classes overlap."""
    rng = np.random.default_rng(3)
    labels = np.repeat([0, 1], [first, second])
    table = pa.table({"label": rng.permutation(labels), "x": rng.normal(size=len(labels))})
    (tmp_path / "raw").mkdir()
    pq.write_table(table, tmp_path / "raw" / "a.parquet")
    text, config = init_config(tmp_path / "raw", tmp_path, capsys)
    assert config["reshard"]["mix"]["class_weighting"] == mix
    assert f"class_weighting: {mix}  # CONFIRM: classes at {max(first, second)}:" in text
