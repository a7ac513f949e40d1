"""The models of benchmarks/hetero_bench.py, named by import path in its jobs' configs:
the built-in MLP and transformer, each recording every train step (`options.record_dir`).

A module of its own, importing nothing of ballast but the two models, so that the
benchmark's A/B run (`--baseline`) can copy it into a checkout of an older commit and
run that commit's training with it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from training.models.classifier import FeatureClassifier
from training.models.transformer import TokenClassifier


class StepRecord:
    """Appends one JSON line per train step: epoch, wall time, the rank process's CPU
    seconds so far (all its threads: a rank held back by a CPU quota or a busy core shows
    as wall time its CPU time does not follow), the training step's own seconds (forward
    and loss), rows, scaled loss. With
    `--slow-by sleep`, rank 1 sleeps twice its step's forward time (forward + backward
    about 3x forward: about 2x slower) while the file `slow` is in the record directory."""

    record_dir: Path

    def slowed(self, module: Any, started: float) -> None:
        if module.global_rank == 1 and (self.record_dir / "slow").exists():
            time.sleep(2 * (time.perf_counter() - started))

    def record(
        self,
        module: Any,
        batch: dict[str, torch.Tensor],
        loss: torch.Tensor,
        forward_s: float = 0.0,
    ) -> None:
        line = {
            "epoch": module.current_epoch,
            "t": time.time(),
            "cpu_s": time.process_time(),
            "rows": len(batch["id"]),
            "loss": float(loss.detach()),
            "forward_s": forward_s,
        }
        with open(self.record_dir / f"rank{module.global_rank}.jsonl", "a") as handle:
            handle.write(json.dumps(line) + "\n")


class TimedClassifier(FeatureClassifier, StepRecord):
    """The built-in MLP, recording every step (`options.record_dir`)."""

    def __init__(self, num_features: int, classes: list[Any], model: dict[str, Any]) -> None:
        super().__init__(num_features, classes, model)
        self.record_dir = Path(model["options"]["record_dir"])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        started = time.perf_counter()
        loss = super().training_step(batch, batch_idx)
        forward_s = time.perf_counter() - started
        self.slowed(self, started)
        self.record(self, batch, loss, forward_s)
        return loss


class TimedTokenClassifier(TokenClassifier, StepRecord):
    """The built-in transformer, recording every step (`options.record_dir`) with its
    forward seconds; it runs each sequence cut to its real tokens (id 0 pads), so that a
    row costs what its tokens cost, as packed or variable-length attention would."""

    def __init__(self, num_features: int, classes: list[Any], model: dict[str, Any]) -> None:
        super().__init__(num_features, classes, model)
        self.record_dir = Path(model["options"]["record_dir"])

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        lengths = (features != 0).sum(dim=1).clamp_min(1).tolist()
        return torch.cat([self.net(features[i : i + 1, :n]) for i, n in enumerate(lengths)])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        started = time.perf_counter()
        loss = super().training_step(batch, batch_idx)
        forward_s = time.perf_counter() - started
        self.slowed(self, started)
        self.record(self, batch, loss, forward_s)
        return loss
