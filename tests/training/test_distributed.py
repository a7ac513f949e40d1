"""2-rank DDP, FSDP2 and tensor-parallel training on CPU (gloo), and DDP's measured gradient
communication per comm option: both suites in one torchrun job (distributed_job.py), run
once for the module (`suites`) and read by a test each."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from preprocessing.synthetic.tokens import TokenDatasetSpec, write_token_dataset
from tests.training.job_output import job_failure
from tracking.config import TrackingConfig
from tracking.run.runs import create_run
from training.config import LoaderConfig
from training.data.loader import ShardStream
from training.launch.processes import child_env
from training.models.config import TransformerConfig
from training.models.transformer import TokenTransformer

JOB = Path(__file__).with_name("distributed_job.py")
SPEC = TokenDatasetSpec(
    num_rows=1024,
    holdout_rows=128,
    seq_len=16,
    vocab_size=64,
    num_classes=4,
    signature_tokens=4,
    rows_per_shard=512,
    rows_per_row_group=64,
    seed=3,
)
STEPS_PER_EPOCH = 1024 // (2 * 16)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_token_dataset(str(tmp_path_factory.mktemp("tokens")), SPEC)


def run_suites(
    dataset: str, out: Path, tracking: dict[str, Any]
) -> dict[str, dict[str, dict[str, Any]]]:
    """Run both suites of distributed_job.py in one 2-rank job; every run's summary by
    suite, then name (["strategies"]["ddp"], ["comm"]["none"], ...)."""
    out.mkdir(parents=True, exist_ok=True)  # the job's log lands here even if it made nothing
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "0",
        str(JOB),
        "--suites",
        "strategies",
        "comm",
        "--dataset",
        dataset,
        "--out",
        str(out),
        "--tracking",
        json.dumps(tracking),
    ]
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True, timeout=600)
    (out / "job.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, f"see {out / 'job.log'}:\n{job_failure(done.stdout + done.stderr)}"
    runs: dict[str, dict[str, dict[str, Any]]] = {"strategies": {}, "comm": {}}
    for path in out.glob("*/*/summary.json"):
        runs[path.parent.parent.name][path.parent.name] = json.loads(path.read_text())
    return runs


@dataclass(frozen=True)
class Suites:
    """The module's one job: each run's summary by name, per suite, and its MLflow store."""

    strategies: dict[str, dict[str, Any]]
    comm: dict[str, dict[str, Any]]
    tracking: dict[str, Any]


@pytest.fixture(scope="module")
def suites(tokens: str, tmp_path_factory: pytest.TempPathFactory) -> Suites:
    out = tmp_path_factory.mktemp("suites")
    tracking = tracked_runs(out, ["fsdp", "tp"])
    runs = run_suites(tokens, out / "runs", tracking)
    return Suites(runs["strategies"], runs["comm"], tracking)


def tracked_runs(tmp_path: Path, names: list[str]) -> dict[str, Any]:
    """A sqlite MLflow store with one run per name, made before any rank starts."""
    uri, artifacts = f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "artifacts")
    tracking = TrackingConfig(
        tracking_uri=uri, experiment="strategies", artifact_location=artifacts
    )
    return {
        "tracking_uri": uri,
        "artifact_location": artifacts,
        "run_ids": {name: create_run(tracking) for name in names},
    }


def holdout_confusion(tracking_uri: str, model_uri: str, dataset: str) -> np.ndarray:
    """The confusion matrix of the logged network over every holdout sample."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    # The registered model is a pyfunc over the network and the codec; the network inside
    # is what the ranks trained (an exported graph: no .eval()).
    network = mlflow.pyfunc.load_model(model_uri).unwrap_python_model().network
    config = LoaderConfig(batch_size=64, remainder="pad")
    confusion = np.zeros((4, 4), dtype=np.int64)
    with torch.no_grad():
        for batch in ShardStream(dataset, "holdout", config, seed=0):
            real = batch["weight"].numpy() > 0
            pred = network(batch["features"]).argmax(dim=1).numpy()
            np.add.at(confusion, (batch["label"].numpy()[real], pred[real]), 1)
    return confusion


def tiny_parameter_shapes() -> list[tuple[int, ...]]:
    net = TokenTransformer(
        TransformerConfig(vocab_size=64, d_model=32, num_layers=2, num_heads=2, ffn_mult=2),
        SPEC.seq_len,
        4,
    )
    return [tuple(p.shape) for p in net.parameters()]


def powersgd_numel(shapes: list[tuple[int, ...]], rank: int) -> int:
    """Elements PowerSGD all-reduces per step: P and Q ((n + m) x r) of each matrix worth
    compressing (at least 2x smaller), every other tensor whole."""
    total = 0
    for shape in shapes:
        n, m = shape[0], max(1, int(torch.tensor(shape[1:]).prod()))
        r = min(n, m, rank)
        total += (n + m) * r if (n + m) * r * 2 < n * m else n * m
    return total


@pytest.mark.slow
def test_ddp_fsdp_and_tensor_parallel_train_resume_and_agree(tokens: str, suites: Suites) -> None:
    """Each strategy trains an epoch and resumes from its checkpoint to the second, ending at
    the same step count; FSDP2 holds half of DDP's parameter bytes per rank; all three reach
    the same loss and F1 on the same data and seed, and the resumed DDP run matches one that
    was never interrupted. The FSDP2 and tensor-parallel networks logged to MLflow are whole
    (unsharded): they classify the holdout as the sharded ones did in validation."""
    runs, tracking = suites.strategies, suites.tracking
    for name in ("ddp", "fsdp", "tp"):
        run = runs[name]
        assert run["strategy"] == name and run["world_size"] == 2 and run["epochs"] == 2
        assert run["resumed_from"].endswith("checkpoints/last.ckpt")
        assert run["global_step_per_rank"] == [2 * STEPS_PER_EPOCH] * 2
        assert run["batches_per_rank"] == [STEPS_PER_EPOCH] * 2  # this process: epoch 2 only
        assert sum(map(sum, run["confusion_matrix"])) == SPEC.holdout_rows
    assert (Path(runs["fsdp"]["resumed_from"]) / "meta.pt").is_file()  # a DCP directory
    ddp_bytes = runs["ddp"]["param_bytes_per_rank"]
    fsdp_bytes = runs["fsdp"]["param_bytes_per_rank"]
    assert all(0.45 < f / d < 0.55 for f, d in zip(fsdp_bytes, ddp_bytes, strict=True))
    losses = {name: runs[name]["train_loss"] for name in ("ddp", "fsdp", "tp", "ddp-straight")}
    assert losses["ddp"] < 1.3  # it learns: chance is ln 4 = 1.39
    for name in ("fsdp", "tp", "ddp-straight"):
        assert losses[name] == pytest.approx(losses["ddp"], rel=1e-4), losses
        assert runs[name]["val_macro_f1"] == pytest.approx(runs["ddp"]["val_macro_f1"], abs=0.01)
    for name in ("fsdp", "tp"):
        assert runs[name]["run_id"] == tracking["run_ids"][name]
        confusion = holdout_confusion(tracking["tracking_uri"], runs[name]["model_uri"], tokens)
        assert np.abs(confusion - np.array(runs[name]["confusion_matrix"])).sum() <= 2


@pytest.mark.slow
def test_each_comm_option_changes_the_measured_bytes_as_expected(suites: Suites) -> None:
    """Per optimizer step, `none` all-reduces every gradient byte; fp16 and bf16 exactly half;
    PowerSGD of rank r exactly its P and Q factors plus the tensors not worth compressing
    (after its plain warm-up steps); post-local SGD only its warm-up steps and a parameter
    average every period; with 2 batches accumulated the hook runs once per optimizer step."""
    runs = suites.comm
    full = runs["none"]["param_bytes_per_rank"][0]
    comm = {name: run["comm"] for name, run in runs.items()}
    assert comm["none"]["steps"] == STEPS_PER_EPOCH
    assert comm["none"]["allreduce_bytes_total"] == STEPS_PER_EPOCH * full
    for half in ("fp16", "bf16"):
        assert comm[half]["allreduce_bytes_total"] * 2 == comm["none"]["allreduce_bytes_total"]
        assert runs[half]["train_loss"] == pytest.approx(runs["none"]["train_loss"], rel=0.01)
    shapes = tiny_parameter_shapes()
    for rank in (1, 2):
        figures = comm[f"powersgd{rank}"]
        assert figures["first_step_bytes"] == full
        assert figures["last_step_bytes"] == 4 * powersgd_numel(shapes, rank) < full / 5
    averagings = len(range(3, STEPS_PER_EPOCH, 4))
    assert comm["local_sgd"]["allreduce_bytes_total"] == (3 + averagings) * full
    assert comm["accumulate"]["steps"] == STEPS_PER_EPOCH // 2
    assert comm["accumulate"]["last_step_bytes"] == full
    assert all(run["comm"]["allreduce_s_total"] > 0 for run in runs.values())
