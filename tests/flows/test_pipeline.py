"""The flows end to end under Prefect's test harness, on tiny generated data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient

from flows.cli.summary import format_summary
from flows.pipeline import batch_inference_flow, evaluate_flow, pipeline
from preprocessing.contract.manifest import read_manifest, shard_uri
from tracking.lifecycle.scoring import load_classifier
from training.summary import CHOSEN_ON_TAG

pytestmark = pytest.mark.slow  # every test here uses the Prefect harness


def test_pipeline_reshards_trains_on_two_ranks_tracks_and_registers(first_run, params) -> None:
    """Invariants: the committed version is balanced (+-1 row per shard) and named by the
    result; both ranks ran the same positive number of batches; MLflow holds the run with
    its dataset version tag and training and validation metrics; training's validation
    (what any early stopping or checkpoint choice sees) read every row of the validation
    split and none of the holdout, and its summary, its MLflow tag and the console say so;
    the first model registered is the champion; the summary names the run and how to open
    the UI."""
    manifest, _ = read_manifest(first_run.manifest_uri)
    rows = [shard.num_rows for shard in manifest.split("train").shards]
    assert len(rows) > 1 and max(rows) - min(rows) <= 1
    batches = first_run.training.batches_per_rank
    assert len(batches) == 2 and batches[0] == batches[1] > 0
    tracking_uri = params.train.tracking.tracking_uri
    run = MlflowClient(tracking_uri).get_run(first_run.run_id)
    assert run.data.tags["ballast.dataset_version"] == manifest.version_id
    assert {"val_macro_f1", "train_loss"} <= set(run.data.metrics)
    assert 0.0 <= run.data.metrics["val_macro_f1"] <= 1.0
    validation = manifest.split("validation").num_rows
    assert validation > 0 and manifest.split("holdout").num_rows > 0
    confusion = first_run.training.figures()["confusion_matrix"]
    assert sum(map(sum, confusion)) == validation  # the last validation pass's rows
    assert first_run.training.checkpoint_chosen_on == "validation"
    assert run.data.tags[CHOSEN_ON_TAG] == "validation"
    assert first_run.registration.alias == "champion"
    summary = format_summary(manifest, first_run, tracking_uri)
    assert first_run.run_id in summary and "mlflow ui --backend-store-uri" in summary
    assert "\ntraining (rebalanced): 2 ranks, batches per rank" in summary  # whose job
    assert "(on the validation split)" in summary


def test_second_pipeline_run_does_no_resharding(first_run, params) -> None:
    """Invariant: on unchanged inputs and config the reshard task is a cache hit keyed by
    the version id: same version, no reshard work (state Cached), no new version dir.
    (The training after it, which this does not check, is one epoch on one rank.)"""
    root = Path(params.reshard.output_root)
    before = sorted(p.name for p in root.iterdir())
    again = pipeline(
        **params.model_copy(
            update={
                "compare_with_natural_mix": False,
                "job": params.job.model_copy(update={"num_processes_per_node": 1}),
                "train": params.train.model_copy(
                    update={"max_epochs": 1, "output_dir": params.train.output_dir + "-again"}
                ),
            }
        ).arguments()
    )
    assert again.cached and again.version_id == first_run.version_id
    assert sorted(p.name for p in root.iterdir()) == before


def test_evaluate_flow_scores_the_model_on_held_out_rows(first_run, params) -> None:
    """Invariants: evaluation covers every held-out row; macro-F1 and recalls are in [0, 1]
    and a model scored against itself as baseline gets the identical figures."""
    tracking = params.train.tracking
    model_uri = first_run.training.model_uri
    result = evaluate_flow(
        model_uri=model_uri,
        baseline_model_uri=model_uri,
        dataset=first_run.manifest_uri,
        tracking=tracking,
    )
    manifest, _ = read_manifest(first_run.manifest_uri)
    assert result["model"].num_rows == manifest.split("holdout").num_rows
    assert 0 <= result["model"].macro_f1 <= 1
    assert result["model"] == result["baseline"]
    assert result["model"].class_prior_baseline["balanced_accuracy"] == pytest.approx(0.25)


def test_batch_inference_equals_row_by_row_predictions(first_run, params, tmp_path) -> None:
    """Invariants: the predictions version has one row per input row with the same ids, and
    each predicted class equals the model's prediction computed on that row alone."""
    tracking = params.train.tracking
    model_uri = first_run.training.model_uri
    out = batch_inference_flow(
        model_uri=model_uri,
        tracking=tracking,
        dataset=first_run.manifest_uri,
        split="holdout",
        output_root=str(tmp_path / "predictions"),
    )
    manifest, location = read_manifest(out.manifest_uri)
    predictions = pa.concat_tables(
        pq.read_table(shard_uri(location, s)) for s in manifest.split("predictions").shards
    )
    source, source_location = read_manifest(first_run.manifest_uri)
    inputs = pa.concat_tables(
        pq.read_table(shard_uri(source_location, s)) for s in source.split("holdout").shards
    )
    assert predictions.column("id").to_pylist() == inputs.column("id").to_pylist()
    model = load_classifier(model_uri, tracking.tracking_uri)
    one_by_one = [
        model.classes[int(np.argmax(model.probabilities(inputs.slice(i, 1))))]
        for i in range(inputs.num_rows)
    ]
    assert predictions.column("predicted").to_pylist() == one_by_one


def test_a_bad_parameter_is_rejected_naming_the_field(prefect_harness, params) -> None:
    """Invariant: a flow run with an invalid parameter fails before any work, naming it."""
    bad = params.model_dump(mode="json")
    bad["reshard"]["target_shard_rows"] = -5
    with pytest.raises(Exception, match="target_shard_rows"):
        pipeline(**bad)
