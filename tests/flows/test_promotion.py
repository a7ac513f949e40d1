"""Promotion on the same rows, drift against the parent, and rollback, with real MLflow
(the session's `mlflow server`), a real Dask cluster and Prefect's test harness.

The data are built so the outcome is known: one feature `x`, class `pos` when x > 0.
Night 1's rows are hard (x anywhere in [-1, 1], a tenth of the labels flipped); night 2
appends easy rows (|x| >= 0.5, no flips); night 3 appends easy `pos` rows only (a class
mix shift). The models are threshold rules set by hand (no training): the champion cuts
at 0, a worse model at 0.3, which is right on every easy row but wrong on the hard rows in
(0, 0.3)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from mlflow.tracking import MlflowClient
from prefect import flow
from prefect.client.orchestration import get_client

from flows.cli.main import main
from flows.promotion import promote
from flows.results import Challenger, Evaluation, Registration
from preprocessing.config import DatasetSpec, IncrementalConfig, MixConfig, ReshardConfig
from preprocessing.contract.codec import FeatureCodec
from preprocessing.contract.manifest import read_current_version, read_manifest
from preprocessing.driver.cluster import DaskConfig
from preprocessing.driver.reshard import run_reshard
from tracking.config import TrackingConfig
from tracking.lifecycle.champion import SCORE_TAG
from tracking.lifecycle.promotion import PREVIOUS_CHAMPION_TAG, SAME_ROWS_TAG, PromotionConfig
from tracking.lifecycle.rollback import LAST_ROLLBACK_TAG
from tracking.lifecycle.scoring import evaluate_model
from tracking.run.model import log_model
from tracking.run.runs import create_run

pytestmark = pytest.mark.slow
_ids = iter(range(10**6, 10**9, 100_000))


def write_rows(path: Path, x: np.ndarray, flip: float, seed: int, label: str | None = None) -> None:
    """One input file: `x`, its label (pos when x > 0, a `flip` fraction flipped)."""
    rng = np.random.default_rng(seed)
    positive = (x > 0) ^ (rng.random(len(x)) < flip)
    labels = [label] * len(x) if label else np.where(positive, "pos", "neg").tolist()
    first = next(_ids)
    pq.write_table(
        pa.table(
            {
                "id": pa.array(range(first, first + len(x)), pa.int64()),
                "label": labels,
                "source": ["s1", "s2"] * (len(x) // 2),
                "x": pa.array(x, pa.float64()),
            }
        ),
        path,
    )


def hard(path: Path, seed: int) -> None:
    write_rows(path, np.random.default_rng(seed).uniform(-1, 1, 1000), 0.1, seed)


def easy(path: Path, seed: int, only_pos: bool = False, num_rows: int = 2000) -> None:
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.5, 1.0, num_rows) * (1 if only_pos else rng.choice([-1, 1], num_rows))
    write_rows(path, x, 0.0, seed, "pos" if only_pos else None)


def reshard(raw: Path, root: Path, dask_client: Any, column: str = "x") -> str:
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(raw)], feature_columns=[column]),
        output_root=str(root),
        mode="incremental",
        holdout_fraction=0.3,
        target_shard_rows=4000,
        mix=MixConfig(class_weighting="natural"),
        incremental=IncrementalConfig(max_small_shard_fraction=1.0),
    )
    return run_reshard(config, dask_client).manifest_uri


def threshold_model(config: TrackingConfig, dataset: str, cut: float) -> tuple[str, str]:
    """A logged model answering `pos` when x > `cut` (through the version's codec: x is
    standardized); its run id and model URI."""
    manifest, _ = read_manifest(dataset)
    spec = FeatureCodec.from_manifest(manifest).columns[0]
    network = torch.nn.Linear(1, 2)
    with torch.no_grad():  # logit(pos) - logit(neg) = 20 (x - cut), x = scale z + shift
        network.weight.copy_(torch.tensor([[0.0], [20.0 * spec.scale]]))
        network.bias.copy_(torch.tensor([0.0, 20.0 * (spec.shift - cut)]))
    run_id = create_run(config)
    return run_id, log_model(config, run_id, network, dataset)


@flow
def night(
    tracking: TrackingConfig,
    config: PromotionConfig,
    dask: DaskConfig,
    dataset: str,
    before: str | None,
    run_id: str,
    model_uri: str,
) -> Registration:
    """The pipeline's promotion step alone, on a model scored on the version's holdout."""
    evaluation = evaluate_model(model_uri, tracking.tracking_uri, dataset)
    challenger = Challenger(
        manifest_uri=dataset,
        run_id=run_id,
        model_uri=model_uri,
        evaluation=Evaluation.model_validate(evaluation),
    )
    return promote(tracking, config, dask, challenger, before, "rebalanced")


@pytest.fixture(scope="module")
def world(
    tmp_path_factory: pytest.TempPathFactory,
    mlflow_uri: str,
    dask_client: Any,
    prefect_harness: None,
) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("promotion")
    raw, root = work / "raw", work / "datasets"
    raw.mkdir()
    for seed in (1, 2):
        hard(raw / f"hard-{seed}.parquet", seed)
    dask = DaskConfig(kind="address", address=dask_client.scheduler.address)
    return {
        "raw": raw,
        "root": root,
        "work": work,
        "dask": dask,
        "client": dask_client,
        "uri": mlflow_uri,
        "night1": reshard(raw, root, dask_client),
    }


def _tracking(world: dict[str, Any], name: str) -> TrackingConfig:
    return TrackingConfig(
        tracking_uri=world["uri"], experiment="promotion", registered_model_name=name
    )


def test_an_easier_night_does_not_promote_a_worse_model(world) -> None:
    """Invariants: night 2's challenger scores above the champion's stored (night 1)
    macro-F1, which the old rule promoted on; scored on night 2's held-out rows the
    champion is better, so the champion stays and the challenger is `challenger`; both
    scores and the rows (version, split, row count) are on the new run and the version."""
    tracking, off = _tracking(world, "same-rows"), PromotionConfig(max_feature_psi=None)
    run1, champion_uri = threshold_model(tracking, world["night1"], 0.0)
    first = night(tracking, off, world["dask"], world["night1"], None, run1, champion_uri)
    assert first.alias == "champion" and first.reasons == ["no champion before"]
    before = read_current_version(str(world["root"]))
    for seed in (3, 4, 5):
        easy(world["raw"] / f"easy-{seed}.parquet", seed)
    night2 = reshard(world["raw"], world["root"], world["client"])
    manifest, _ = read_manifest(night2)
    assert manifest.parent_version == before
    run2, challenger_uri = threshold_model(tracking, night2, 0.3)
    second = night(tracking, off, world["dask"], night2, before, run2, challenger_uri)
    client = MlflowClient(world["uri"])
    stored = float(client.get_model_version("same-rows", "1").tags[SCORE_TAG])
    assert second.score > stored  # what the old rule compared: it promoted
    same = second.same_rows
    assert same.champion_score > second.score and second.alias == "challenger"
    assert int(client.get_model_version_by_alias("same-rows", "champion").version) == 1
    holdout = manifest.split("holdout").num_rows
    assert (same.dataset_version, same.split, same.num_rows) == (
        manifest.version_id,
        "holdout",
        holdout,
    )
    run = client.get_run(run2)
    assert run.data.metrics["promotion.champion_macro_f1"] == pytest.approx(same.champion_score)
    assert run.data.metrics["promotion.rows"] == holdout
    assert f"{holdout} rows" in run.data.tags[SAME_ROWS_TAG]
    assert manifest.version_id in client.get_model_version("same-rows", "2").tags[SAME_ROWS_TAG]
    world["night2"], world["before3"] = night2, manifest.version_id


def test_a_shifted_class_mix_registers_the_model_as_challenger_only(world) -> None:
    """Invariants: night 3 (only `pos` rows added) has a class-mix PSI past the default
    threshold; the challenger, better than the champion on the same rows, is registered
    `challenger` only; the reason, the Prefect `drift` artifact and the run's drift report
    name the class; the run has the drift metrics."""
    tracking = _tracking(world, "drift-model")
    run1, weak = threshold_model(tracking, world["night2"], 0.3)
    night(tracking, PromotionConfig(), world["dask"], world["night2"], None, run1, weak)
    for seed in (6, 7, 8, 9):  # neg:pos from 1:1 to 1:5
        easy(world["raw"] / f"pos-{seed}.parquet", seed, only_pos=True, num_rows=4000)
    night3 = reshard(world["raw"], world["root"], world["client"])
    run2, better = threshold_model(tracking, night3, 0.0)
    result = night(
        tracking, PromotionConfig(), world["dask"], night3, world["before3"], run2, better
    )
    assert result.same_rows.champion_score < result.score
    assert result.alias == "challenger" and result.held_back
    reason = next(r for r in result.reasons if r.startswith("drift: class mix"))
    assert "'neg'" in reason and "'pos'" in reason
    client = MlflowClient(world["uri"])
    assert int(client.get_model_version_by_alias("drift-model", "champion").version) == 1
    run = client.get_run(run2)
    assert run.data.metrics["drift.class_psi"] > 0.25
    report = client.download_artifacts(run2, "promotion/drift.md", str(world["work"]))
    assert "| neg |" in Path(report).read_text()
    assert "| neg |" in asyncio.run(_artifact_text("drift"))
    world["night3"] = read_manifest(night3)[0].version_id


async def _artifact_text(key: str) -> str:
    async with get_client() as client:
        artifact = await client.read_latest_artifacts()
    return next(str(a.data) for a in artifact if a.key == key)


def test_an_unreadable_champion_holds_the_challenger_back_unless_forced(world) -> None:
    """Invariants: a champion whose codec needs a column the new rows lack is reported as
    unable to read them and the challenger stays `challenger`; with `force` it becomes
    champion (the run's own version, registered once) and records the champion it
    replaced; rolling the model back twice returns
    the alias to that version once (the second call changes nothing), with the reason."""
    tracking = _tracking(world, "schema-model")
    other_raw, other_root = world["work"] / "raw-y", world["work"] / "datasets-y"
    other_raw.mkdir()
    table = pq.read_table(world["raw"] / "hard-1.parquet").rename_columns(
        ["id", "label", "source", "y"]
    )
    pq.write_table(table, other_raw / "y.parquet")
    old = reshard(other_raw, other_root, world["client"], column="y")
    run1, y_model = threshold_model(tracking, old, 0.0)
    night(tracking, PromotionConfig(), world["dask"], old, None, run1, y_model)
    run2, challenger = threshold_model(tracking, world["night2"], 0.0)
    held = night(
        tracking, PromotionConfig(), world["dask"], world["night2"], None, run2, challenger
    )
    assert held.alias == "challenger" and held.same_rows.champion_score is None
    assert any("cannot read the new rows" in r and "'y'" in r for r in held.reasons)
    forced = night(
        tracking,
        PromotionConfig(force=True),
        world["dask"],
        world["night2"],
        None,
        run2,
        challenger,
    )
    client = MlflowClient(world["uri"])
    # the same run forced: its own version again (registration is idempotent), now champion
    assert forced.alias == "champion" and forced.version == held.version
    assert (
        client.get_model_version("schema-model", str(forced.version)).tags[PREVIOUS_CHAMPION_TAG]
        == "1"
    )
    args = [
        "rollback",
        "--model",
        "schema-model",
        "--tracking-uri",
        world["uri"],
        "--reason",
        "forced by mistake",
    ]
    assert main(args) == 0 and main(args) == 0
    assert int(client.get_model_version_by_alias("schema-model", "champion").version) == 1
    assert (
        "forced by mistake" in client.get_registered_model("schema-model").tags[LAST_ROLLBACK_TAG]
    )
    assert (
        main(["rollback", "--model", "schema-model", "--to", "99", "--tracking-uri", world["uri"]])
        == 2
    )


def test_a_dataset_rolls_back_once_and_refuses_a_missing_version(world, capsys) -> None:
    """Invariants: `ballast rollback --dataset ROOT --to ID` moves `_CURRENT` to the
    committed version and says so; a second call changes nothing and says that; a version
    that is not committed is refused (exit 2) and `_CURRENT` stays."""
    root, target = str(world["root"]), world["before3"]
    assert read_current_version(root) == world["night3"]
    assert main(["rollback", "--dataset", root, "--to", target]) == 0
    assert read_current_version(root) == target and "moved from" in capsys.readouterr().out
    assert main(["rollback", "--dataset", root, "--to", target]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert main(["rollback", "--dataset", root, "--to", "no-such-version"]) == 2
    assert read_current_version(root) == target
