"""One rank of the DDP resume tests (test_ddp_kill_resume.py, test_elastic_resume.py),
started by torchrun.

Trains one epoch of the feature classifier on a StreamDataModule with mid-epoch
checkpoints (every `--every-n-steps` optimizer steps, plus last.ckpt), and
appends to `<out>/ids-<phase>-rank<r>.txt`, after every training step, a line
"<global step> <sample ids of the batch>": what this rank's step consumed.
`--step-sleep-s` slows the steps so that the test can kill the job between
checkpoints; `--max-steps` ends it after that many steps; `--phase resume` starts
from `last.ckpt`, or from `--ckpt` when given (any phase).
"""

from __future__ import annotations

import argparse
import os
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy

from training.callbacks import DataWaitCallback
from training.config import LoaderConfig
from training.data.datamodule import StreamDataModule
from training.models.classifier import FeatureClassifier


class ConsumedIds(lightning.Callback):
    """Appends each finished step's sample ids to this rank's file, flushed at once."""

    def __init__(self, path: Path, step_sleep_s: float) -> None:
        self.path, self.step_sleep_s = path, step_sleep_s

    def on_train_batch_end(
        self, trainer: lightning.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        ids = " ".join(str(i) for i in batch["id"].tolist())
        with open(self.path, "a") as handle:
            handle.write(f"{trainer.global_step} {ids}\n")
        time.sleep(self.step_sleep_s)


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--dataset", "--out", "--phase"):
        parser.add_argument(name, required=True)
    parser.add_argument("--every-n-steps", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--step-sleep-s", type=float, default=0.0)
    parser.add_argument("--num-partitions", type=int, default=16)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--ckpt", default=None)
    args = parser.parse_args()
    out, rank = Path(args.out), int(os.environ["RANK"])
    lightning.seed_everything(0)
    loader = LoaderConfig(
        batch_size=args.batch_size, num_workers=args.num_workers, num_partitions=args.num_partitions
    )
    data = StreamDataModule(args.dataset, loader, seed=5)
    model = FeatureClassifier(data.num_features, data.classes, {"hidden_sizes": [16]})
    checkpoint = ModelCheckpoint(
        dirpath=out / "checkpoints",
        every_n_train_steps=args.every_n_steps,
        save_top_k=-1,
        save_last=True,
    )
    recorder = ConsumedIds(out / f"ids-{args.phase}-rank{rank}.txt", args.step_sleep_s)
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        max_epochs=1,
        max_steps=args.max_steps,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60)),
        callbacks=[checkpoint, recorder, DataWaitCallback()],
        logger=False,
        use_distributed_sampler=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")
        resume_from = args.ckpt or ("last" if args.phase == "resume" else None)
        trainer.fit(model, datamodule=data, ckpt_path=resume_from)


if __name__ == "__main__":
    main()
