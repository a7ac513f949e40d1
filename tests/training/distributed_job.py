"""Several 2-rank training runs in one torchrun job (test_distributed.py starts it).

`--suites strategies comm` runs both suites, in that order. `strategies`: for ddp,
fsdp and tp, one epoch, then a resume from its last.ckpt up to two epochs (a fresh
Trainer and model, built from the checkpoint); plus ddp for two epochs straight. The
resumed fsdp and tp runs log their network to the MLflow run that `--tracking` (JSON:
tracking_uri, artifact_location, and a run id per strategy, created by the test)
names for them. `comm`: one epoch of ddp per gradient communication option. Each run
writes `<out>/<suite>/<name>/summary.json`. Starting torch and Lightning once for all
runs keeps the test within its time budget on a 2-core machine; every run builds its
own Trainer, model, streams and strategy.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from tracking.config import TrackingConfig
from training.config import TrainConfig
from training.train import exit_rank, run_training

TINY_TRANSFORMER = {"vocab_size": 64, "d_model": 32, "num_layers": 2, "num_heads": 2, "ffn_mult": 2}
COMM_RUNS: dict[str, dict[str, Any]] = {
    "none": {"hook": "none"},
    "fp16": {"hook": "fp16"},
    "bf16": {"hook": "bf16"},
    "powersgd1": {"hook": "powersgd", "powersgd_rank": 1, "warmup_steps": 3},
    "powersgd2": {"hook": "powersgd", "powersgd_rank": 2, "warmup_steps": 3},
    "local_sgd": {"hook": "post_local_sgd", "warmup_steps": 3, "local_sgd_period": 4},
}


def base_config(dataset: str, out: str) -> TrainConfig:
    return TrainConfig.model_validate(
        {
            "dataset": dataset,
            "output_dir": out,
            "max_epochs": 1,
            "seed": 7,
            "gradient_clip_norm": 1.0,
            "process_group_timeout_s": 60,
            "loader": {"batch_size": 16},
            "model": {
                "class_path": "transformer",
                "learning_rate": 0.003,
                "transformer": TINY_TRANSFORMER,
            },
        }
    )


def run_strategies(dataset: str, out: str, tracking: dict[str, Any]) -> None:
    for strategy in ("ddp", "fsdp", "tp"):
        cfg = base_config(dataset, f"{out}/{strategy}").model_copy(update={"strategy": strategy})
        run_training(cfg)
        resumed = cfg.model_copy(update={"max_epochs": 2, "resume": True})
        if strategy in tracking["run_ids"]:
            logged = TrackingConfig(
                tracking_uri=tracking["tracking_uri"],
                run_id=tracking["run_ids"][strategy],
                artifact_location=tracking["artifact_location"],
            )
            resumed = resumed.model_copy(update={"tracking": logged})
        run_training(resumed)
    straight = base_config(dataset, f"{out}/ddp-straight").model_copy(update={"max_epochs": 2})
    run_training(straight)


def run_comm(dataset: str, out: str, tracking: dict[str, Any]) -> None:
    base = base_config(dataset, "").model_copy(update={"gradient_clip_norm": None})
    for name, comm in COMM_RUNS.items():
        cfg = base.model_copy(update={"output_dir": f"{out}/{name}"})
        run_training(TrainConfig.model_validate(cfg.model_dump() | {"comm": comm}))
    accumulated = base.model_copy(
        update={"output_dir": f"{out}/accumulate", "accumulate_grad_batches": 2}
    )
    run_training(accumulated)


SUITES = {"strategies": run_strategies, "comm": run_comm}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suites", nargs="+", required=True, choices=SUITES)
    for name in ("--dataset", "--out"):
        parser.add_argument(name, required=True)
    parser.add_argument("--tracking", default='{"run_ids": {}}')
    args = parser.parse_args()
    for suite in args.suites:
        SUITES[suite](args.dataset, f"{args.out}/{suite}", json.loads(args.tracking))
    exit_rank(0)


if __name__ == "__main__":
    main()
